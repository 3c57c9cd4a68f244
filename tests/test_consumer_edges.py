"""A consumer at its edges, on both stores: one node id given twice, a queue deleted under it,
arguments it must refuse, callbacks that fail, dead-letter moves that keep failing, and waits
that must not stall or spin."""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import pytest

from large_queue import (
    GroupNotFoundError,
    InvalidArgumentError,
    OwnershipLostError,
    Queue,
    QueueNotFoundError,
)
from large_queue.cluster import OwnershipEvent, ownership_info
from large_queue.cluster._dead_letters import DeadLetters
from large_queue.cluster._ownership import Ownership
from tests.fix_backends import Store
from tests.fix_consumers import FAST, receive_all


def test_a_second_consumer_with_the_same_node_id_takes_over_and_fences_the_first(store: Store) -> None:
    queue = store.new_queue()
    queue.enqueue_batch(range(6))
    first = queue.consumer("same", **FAST).start()
    try:
        held = receive_all(first, 2)
        assert [m.value for m in held] == [0, 1]
        second = queue.consumer("same", **FAST).start()  # a restart, or the id configured twice
        try:
            assert second.owning
            again = receive_all(second, 6)
            # the first one's unacked entries come again (marked), then the rest; never two owners at once
            assert [(m.value, m.redelivered) for m in again] == [
                (0, True),
                (1, True),
                (2, False),
                (3, False),
                (4, False),
                (5, False),
            ]
            with pytest.raises(OwnershipLostError):
                first.ack(held)  # fenced: its epoch and instance are over
            assert first.receive(1, timeout=0.3) == []
            assert not first.owning
            time.sleep(0.3)  # the first one's watcher ticks: it must not take the queue back
            assert second.owning and not first.owning
            second.ack(again)
            assert ownership_info(queue).in_flight == 0
        finally:
            second.close()
    finally:
        first.close()


@pytest.mark.parametrize("group", [None, "g"])
def test_a_queue_deleted_under_its_consumer_is_named_and_ends_its_ownership(
    store: Store, group: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    queue = store.new_queue()
    queue.enqueue_batch([1, 2, 3])
    with queue.consumer("n1", group=group, **FAST) as consumer:  # a group's records go with the queue
        consumer.ack(receive_all(consumer, 1))  # what it read ahead is in hand: the next take reads nothing
        assert Queue.delete(store.backend, queue.name)
        with pytest.raises(QueueNotFoundError):
            consumer.receive(1, timeout=0.3)
        time.sleep(0.5)  # ten watcher ticks
        assert not consumer.owning
        with pytest.raises(QueueNotFoundError):  # still named after the watcher saw it: no wait for ever
            consumer.receive(1, timeout=0.3)
        with pytest.raises(QueueNotFoundError):
            next(iter(consumer))
        consumer.ack([])  # nothing to settle: nothing to refuse
        node = consumer.ownership.node_key("n1")
        assert store.backend.get(node) is None  # its heartbeats did not write its record again
    assert store.backend.get(node) is None  # nor did closing it
    said = [
        r for r in caplog.records if "does not exist" in r.getMessage() or "no ownership" in r.getMessage()
    ]
    assert 1 <= len(said) <= 2, [r.getMessage() for r in caplog.records]  # said once, not at every tick
    assert "overwritten" not in caplog.text


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"poll_interval": -1}, "poll_interval"),
        ({"poll_interval": math.nan}, "poll_interval"),
        ({"poll_interval": "x"}, "poll_interval"),
        ({"poll_interval": 3, "timeout": 1}, "poll_interval"),
        ({"timeout": math.inf}, "timeout"),
        ({"timeout": "10"}, "timeout"),
        ({"time_slice": None}, "time_slice"),
        ({"visibility_timeout": "30"}, "visibility_timeout"),
        ({"max_poll_interval": True}, "max_poll_interval"),
        ({"max_poll_interval": 1e-9}, "max_poll_interval"),
        ({"poll_interval": 1e-7}, "poll_interval"),
        ({"timeout": 1e-4}, "timeout"),
        ({"dead_letter": "dead", "max_deliveries": 2}, "dead_letter"),
    ],
)
def test_bad_consumer_options_are_refused_by_name(store: Store, options: dict[str, Any], named: str) -> None:
    queue = store.new_queue()
    with pytest.raises(InvalidArgumentError, match=named):
        queue.consumer("n1", **{**FAST, **options})


def test_bad_call_arguments_are_refused_before_anything_changes(store: Store) -> None:
    queue = store.new_queue()
    other = store.new_queue()
    queue.enqueue("x")
    other.enqueue("y")
    never = queue.consumer("idle", **FAST)
    with pytest.raises(InvalidArgumentError, match="never started"):
        never.receive(1)
    with queue.consumer("n1", **FAST) as consumer, other.consumer("n1", **FAST) as elsewhere:
        (message,) = receive_all(consumer, 1)
        (foreign,) = receive_all(elsewhere, 1)
        assert (foreign.offset, foreign.epoch, foreign.delivery_count) == (
            message.offset,
            message.epoch,
            message.delivery_count,
        )
        for bad, named in [
            (lambda: consumer.ack([foreign]), "not delivered by this consumer"),
            (lambda: consumer.ack(message), "list of messages"),  # type: ignore[arg-type]
            (lambda: consumer.ack([None]), "not delivered by this consumer"),  # type: ignore[list-item]
            (lambda: consumer.receive(1, timeout="1"), "timeout"),  # type: ignore[arg-type]
            (lambda: consumer.receive(1, timeout=math.inf), "timeout"),
            (lambda: message.nack(delay="1"), "delay"),  # type: ignore[arg-type]
            (lambda: message.nack(error=ValueError("boom")), "error must be a str"),  # type: ignore[arg-type]
            (lambda: message.extend("1"), "seconds"),  # type: ignore[arg-type]
        ]:
            with pytest.raises(InvalidArgumentError, match=named):
                bad()
        assert ownership_info(queue).in_flight == 1 and ownership_info(other).in_flight == 1
        message.ack()
        foreign.ack()
        assert ownership_info(queue).in_flight == 0 and ownership_info(other).in_flight == 0
    with pytest.raises(InvalidArgumentError, match="closed"):
        consumer.start()


def test_a_message_acked_under_an_earlier_epoch_is_acked_again_as_a_no_op(store: Store) -> None:
    queue = store.new_queue()
    queue.enqueue_batch(["a", "b"])
    timing = {"time_slice": 0.2, "timeout": 5.0, "poll_interval": 0.05}
    with queue.consumer("n1", **timing) as consumer:
        (first,) = receive_all(consumer, 1)
        first.ack()
        epoch = consumer.epoch
        with queue.consumer(
            "n2", **timing
        ):  # takes a turn (delivering nothing): n1 owns again, a later epoch
            deadline = time.monotonic() + 5
            while (not consumer.owning or consumer.epoch == epoch) and time.monotonic() < deadline:
                time.sleep(0.05)
        assert consumer.owning and consumer.epoch > epoch
        got = receive_all(consumer, 1)
        assert [(m.value, m.epoch) for m in got] == [("b", consumer.epoch)]
        consumer.ack([first, *got])  # the old one is a no-op; the batch is not refused for it
        assert ownership_info(queue).in_flight == 0


def test_a_message_acked_before_the_queue_moved_to_another_node_is_acked_again_as_a_no_op(
    store: Store,
) -> None:
    queue = store.new_queue()
    queue.enqueue_batch(["a", "b"])
    timing = {"time_slice": 0.2, "timeout": 5.0, "poll_interval": 0.05}
    with queue.consumer("n1", **timing) as first_node:
        acked, held = receive_all(first_node, 2)
        acked.ack()
        with queue.consumer("n2", **timing) as second_node:
            deadline = time.monotonic() + 5
            while not second_node.owning and time.monotonic() < deadline:
                first_node.receive(1, timeout=0.05)  # n1's slice ends: the queue goes to n2
            assert second_node.owning and not first_node.owning
            acked.ack()  # acked by n1's ownership, whose commit stands: nothing to do
            with pytest.raises(OwnershipLostError, match=r"cannot settle offsets \[1\]"):
                held.ack()  # never acked: the new owner delivers it again
            assert [m.value for m in receive_all(second_node, 1)] == ["b"]


def test_extend_never_brings_a_message_back_sooner(store: Store) -> None:
    queue = store.new_queue()
    queue.enqueue_batch(["never", "later"])
    with queue.consumer("n1", visibility_timeout=None, **FAST) as consumer:
        (message,) = receive_all(consumer, 1)
        message.extend(0.1)  # without a visibility timeout it never comes back: nothing to shorten
        assert [m.value for m in receive_all(consumer, 1, timeout=0.5)] == ["later"]
        time.sleep(0.2)  # past the 0.1 s: "never" must still not come back
        assert consumer.receive(2, timeout=0.3) == []
    with queue.consumer("n2", visibility_timeout=30.0, **FAST) as consumer:
        got = receive_all(consumer, 2)
        assert [m.value for m in got] == ["never", "later"] and all(m.redelivered for m in got)
        got[0].extend(0.1)  # 30 s already: it stays held
        assert consumer.receive(2, timeout=0.4) == []


def test_timeout_zero_looks_once_whatever_the_backoff(store: Store) -> None:
    queue = store.new_queue()
    with queue.consumer("n1", **FAST) as consumer:
        assert consumer.receive(1, timeout=0.5) == []  # the idle backoff grows
        queue.enqueue("x")
        assert [m.value for m in consumer.receive(1, timeout=0)] == ["x"]


def test_a_failing_on_event_callback_neither_fails_an_applied_ack_nor_stops_the_watcher(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    queue = store.new_queue()
    queue.enqueue_batch([1, 2])

    def failing(event: OwnershipEvent) -> None:
        raise RuntimeError(f"callback bug on {event.kind}")

    with queue.consumer("n1", on_event=failing, **FAST) as consumer:
        (message,) = receive_all(consumer, 1)
        message.ack()  # applied: it must not raise
        assert ownership_info(queue).in_flight == 0
        time.sleep(0.3)
        assert consumer._thread is not None and consumer._thread.is_alive()
        assert [n.alive for n in ownership_info(queue).nodes] == [True]
    assert "on_event callback failed" in caplog.text


def test_a_lone_owner_holding_a_message_starts_a_new_slice_at_once(store: Store) -> None:
    queue = store.new_queue(capacity=60)
    queue.enqueue("held")
    with queue.consumer("solo", time_slice=0.2, timeout=6.0, poll_interval=0.05) as consumer:
        receive_all(consumer, 1)  # held, unacked, past many slices
        waits = []
        for value in range(8):  # one entry every 0.15 s: each comes within a moment, slice after slice
            time.sleep(0.15)
            queue.enqueue(value)
            sent = time.monotonic()
            got = consumer.receive(1, timeout=2.0)
            waits.append(time.monotonic() - sent)
            assert [m.value for m in got] == [value]
            consumer.ack(got)
        assert max(waits) < 1.0, waits  # not half the timeout (3 s) at each slice's end


def test_a_node_with_a_short_timeout_never_takes_the_queue_from_a_live_owner_with_a_longer_one(
    store: Store,
) -> None:
    queue = store.new_queue(capacity=60)
    events: list[OwnershipEvent] = []
    patient = queue.consumer("a", time_slice=60.0, timeout=20.0, poll_interval=0.05).start()
    try:
        assert patient.owning  # it rewrites the owner record every 5 s (a quarter of its timeout)
        hasty = queue.consumer("b", time_slice=60.0, timeout=1.0, poll_interval=0.05, on_event=events.append)
        with hasty:
            store.advance(3)  # the owner record silent for 3 s: past b's timeout, well within a's
            time.sleep(0.5)  # b's watcher looks a few times
            assert patient.owning and not hasty.owning and events == []
            info = ownership_info(queue)
            assert info.owner == "a"
            assert {node.node_id: node.timeout_ms for node in info.nodes} == {"a": 20_000, "b": 1_000}
            patient.close()  # a hands over at once: b, the next interested node, takes it
            deadline = time.monotonic() + 5
            while not hasty.owning and time.monotonic() < deadline:
                time.sleep(0.05)
            assert hasty.owning and [event.kind for event in events] == ["take"]
    finally:
        patient.close()


def test_a_dead_letter_move_that_keeps_failing_backs_off_and_blocks_nothing(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="large_queue.cluster")
    queue = store.new_queue()
    dead = store.new_queue(capacity=3)
    dead.enqueue_batch(["full", "full", "full"])  # no room for a letter
    queue.enqueue("poison")
    with queue.consumer("n1", group="g", max_deliveries=1, dead_letter=dead, **FAST) as consumer:
        (message,) = receive_all(consumer, 1)
        message.nack(error="boom")
        queue.enqueue_batch(["ok1", "ok2"])
        before = store.backend.commands
        assert [m.value for m in receive_all(consumer, 2, timeout=2.0)] == ["ok1", "ok2"]  # not held up
        assert consumer.receive(1, timeout=1.0) == []
        assert store.backend.commands - before < 200  # a backoff, not a spin (thousands a second)
        assert queue.group("g").in_flight == 3  # the poison one stays in flight, with the two delivered


def test_a_group_deleted_under_its_consumer_is_named_and_one_made_again_is_consumed(store: Store) -> None:
    queue = store.new_queue()
    queue.enqueue_batch([1, 2, 3])
    with queue.consumer("n1", group="g", **FAST) as consumer:
        consumer.ack(receive_all(consumer, 3))
        assert queue.delete_group("g")
        time.sleep(0.3)  # the watcher ticks: the group is gone
        with pytest.raises(GroupNotFoundError):
            consumer.receive(1, timeout=0.3)
        assert queue.create_group("g")  # made again, at the head
        queue.enqueue_batch([4, 5])
        time.sleep(0.3)  # the watcher ticks: the group is there again
        assert [m.value for m in receive_all(consumer, 2)] == [4, 5]  # the node joined it again
        assert [n.node_id for n in queue.group("g").nodes] == ["n1"]


def test_a_consumer_closed_before_it_started_leaves_no_record(store: Store) -> None:
    queue = store.new_queue()
    consumer = queue.consumer("never", **FAST)
    consumer.close()
    assert store.backend.get(consumer.ownership.node_key("never")) is None


def test_a_node_id_no_store_can_key_a_record_with_is_refused(store: Store) -> None:
    queue = store.new_queue()
    with pytest.raises(InvalidArgumentError, match="node_id"):
        queue.consumer("node-\ud800", **FAST)


def test_a_nack_error_no_letter_could_hold_is_refused_and_a_long_one_is_cut(store: Store) -> None:
    queue = store.new_queue()
    queue.enqueue("x")
    with queue.consumer("n1", **FAST) as consumer:
        (message,) = receive_all(consumer, 1)
        with pytest.raises(InvalidArgumentError, match="error"):
            message.nack(error="bad \ud800")
        message.nack(error="e" * 5000)
        assert len(consumer.deliveries.last_error[message.offset]) == 1000


@pytest.mark.parametrize("deleting", ["group", "queue"])
def test_a_slow_delete_racing_a_consumers_heartbeats_leaves_none_of_the_groups_records(
    store: Store, monkeypatch: pytest.MonkeyPatch, deleting: str
) -> None:
    queue = store.new_queue()
    queue.create_group("g")
    keys = queue.keys.group("g")
    with queue.consumer("n1", group="g", **FAST):
        time.sleep(0.2)  # joined and ticking
        removing = store.backend.remove

        def slowly(key: Any) -> bool:  # the consumer's heartbeats land between every two removals
            removed = removing(key)
            time.sleep(0.2)
            return removed

        monkeypatch.setattr(store.backend, "remove", slowly)
        if deleting == "group":
            assert queue.delete_group("g")
        else:
            assert Queue.delete(store.backend, queue.name)
        monkeypatch.undo()
        time.sleep(0.3)  # more heartbeats
    assert [store.backend.get(key) for key in (keys.owner, keys.nodes, keys.node("n1"))] == [None] * 3


def test_an_owner_timeout_stated_by_another_instance_is_not_believed(store: Store) -> None:
    from large_queue.backends import Write

    queue = store.new_queue(capacity=60)
    with queue.consumer("a", time_slice=60.0, timeout=1.0, poll_interval=0.05) as owner:
        assert owner.owning
        assert Ownership(queue, "judge", timeout=9.0).read().timeout_ms == 1_000
        # a take by a version that does not know the bin: a new instance, the old statement left
        store.backend.operate(queue.keys.group(None).owner, [Write("instance", "old-version-node")])
        assert Ownership(queue, "judge", timeout=9.0).read().timeout_ms == 9_000  # the judge's own


def test_an_owner_write_of_an_earlier_epoch_of_the_same_consumer_is_refused(store: Store) -> None:
    """One consumer (instance) owns epoch e1, loses it (hand-over, take-back) and owns e1+2; a write
    still guarded by e1 (a command delayed past a timeout) must be refused, not overwrite the cursor."""
    queue = store.new_queue()
    queue.enqueue_batch(range(5))
    node = Ownership(queue, "a", timeout=5.0)
    node.join()
    e1 = node.take(node.read(), owner_gone=False)
    assert e1 is not None
    node.commit(e1, cursor=3, inflight={1: 1, 2: 1})
    assert node.hand_over(e1, to=None)
    e2 = node.take(node.read(), owner_gone=False)
    assert e2 is not None and e2 > e1
    node.commit(e2, cursor=5, inflight={})
    with pytest.raises(OwnershipLostError):
        node.commit(e1, cursor=3, inflight={1: 1, 2: 1})
    assert node.read().cursor == 5


def test_a_stale_owner_of_a_group_made_again_cannot_write_into_it(store: Store) -> None:
    """Owner records of a group made again start over at epoch 0, so an epoch alone does not
    name the owner: a consumer of the deleted group at epoch 1 must not write into the new group
    whose owner (another consumer) is also at epoch 1."""
    queue = store.new_queue()
    queue.enqueue_batch(range(5))
    assert queue.create_group("g")
    old = Ownership(queue, "a", timeout=5.0, group="g")
    old.join()
    stale_epoch = old.take(old.read(), owner_gone=False)
    assert queue.delete_group("g")
    assert queue.create_group("g")
    new = Ownership(queue, "b", timeout=5.0, group="g")
    new.join()
    epoch = new.take(new.read(), owner_gone=False)
    assert epoch == stale_epoch, (epoch, stale_epoch)  # the coincidence the instance guard is for
    new.commit(epoch, cursor=0, inflight={})
    with pytest.raises(OwnershipLostError):
        old.commit(stale_epoch, cursor=5, inflight={})
    assert new.read().cursor == 0


def test_a_stream_commit_replayed_with_an_older_offset_leaves_the_cursor_where_it_was(store: Store) -> None:
    """A group's cursor never moves back (a micro-batch committed again is a
    no-op). A replayed commit of an earlier micro-batch must not move the group back."""
    from large_queue.cluster import _groups

    queue = store.new_queue(capacity=10, slots_per_record=5)
    queue.create_group("spark")
    queue.create_group("audit")  # holds the head at 0, so nothing the cursor passed is gone
    queue.enqueue_batch(range(6))
    _groups.commit_cursor(queue, "spark", 5)
    _groups.commit_cursor(queue, "spark", 2)  # the earlier micro-batch's commit, replayed
    assert queue.group("spark").acked_offset == 5


def test_a_consumer_used_in_a_forked_child_refuses_instead_of_delivering_as_its_owner(store: Store) -> None:
    queue = store.new_queue()
    queue.enqueue_batch(range(4))
    with queue.consumer("a", time_slice=60, timeout=60, poll_interval=30) as consumer:
        assert [m.value for m in consumer.receive(1)] == [0]
        reading, writing = os.pipe()
        child = os.fork()
        if child == 0:  # the child: a copy of the owner, without its thread
            said = []
            for call in (lambda: consumer.receive(1), lambda: consumer.dequeue(1), lambda: consumer.ack([])):
                try:
                    call()
                    said.append("accepted")
                except InvalidArgumentError as exc:
                    said.append("refused" if "forked" in str(exc) else str(exc))
            consumer.close()  # stops the copy only: the parent's ownership is not handed on
            os.write(writing, ",".join(said).encode())
            os._exit(0)
        os.close(writing)
        _, status = os.waitpid(child, 0)
        with os.fdopen(reading) as answer:
            assert answer.read() == "refused,refused,accepted"  # (an empty ack settles nothing anywhere)
        assert status == 0
        assert consumer.owning
        assert [m.value for m in consumer.receive(3)] == [1, 2, 3]  # delivered once, by the parent


def test_a_consumer_whose_start_fails_leaves_no_node_waiting_for_a_turn(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = store.new_queue()
    consumer = queue.consumer("a", time_slice=60, timeout=60, poll_interval=30)

    def failing(*, starting: bool = False) -> None:
        raise QueueNotFoundError("as if the queue went while it started", queue=queue.name)

    monkeypatch.setattr(consumer, "_tick", failing)
    with pytest.raises(QueueNotFoundError):
        consumer.start()
    assert consumer.ownership.live_interested() == []  # joined, then left again
    with queue.consumer("b", time_slice=60, timeout=60, poll_interval=30) as other:
        assert other.owning


def test_an_idle_live_owner_keeps_the_queue_past_many_of_its_timeouts(store: Store) -> None:
    """An owner with nothing to deliver proves itself alive in time: another node never finds it silent."""
    queue = store.new_queue(capacity=60)
    events: list[OwnershipEvent] = []
    owner = queue.consumer("a", time_slice=600.0, timeout=2.0, poll_interval=0.05).start()
    try:
        assert owner.owning
        with queue.consumer(
            "b", time_slice=600.0, timeout=2.0, poll_interval=0.05, on_event=events.append
        ) as other:
            for _ in range(24):  # 6 s of the store's clock (3 of the owner's timeouts), in small steps
                store.advance(0.25)
                time.sleep(0.1)
            assert owner.owning and not other.owning and events == []
            assert ownership_info(queue).owner == "a"
    finally:
        owner.close()


def test_a_message_held_at_the_slice_end_may_still_be_acked_by_its_owner_within_the_grace(
    store: Store,
) -> None:
    """At the slice's end, messages still held get up to half the timeout to be acked before the hand-over."""
    queue = store.new_queue(capacity=60)
    owner = queue.consumer("a", time_slice=0.3, timeout=6.0, poll_interval=0.05).start()
    try:
        assert owner.owning
        queue.enqueue("x")
        held = owner.receive(1, timeout=2.0)
        assert [m.value for m in held] == ["x"]
        with queue.consumer("b", time_slice=0.3, timeout=6.0, poll_interval=0.05) as other:
            time.sleep(1.0)  # the slice is over, and b wants the queue: a's grace (3 s) is not
            owner.ack(held)  # no OwnershipLostError: a still owns the queue
            assert other.receive(1, timeout=1.5) == []  # b took it after the ack: nothing redelivered
            assert other.owning or owner.owning
    finally:
        owner.close()


def test_ownership_info_counts_acks_from_the_lowest_unacked_offset(store: Store) -> None:
    """``acked_offset`` is where the unacked entries begin, not the delivery cursor."""
    queue = store.new_queue(capacity=60)
    queue.enqueue_batch(["a", "b", "c"])
    with queue.consumer("solo", time_slice=60.0, timeout=30.0, poll_interval=0.05) as consumer:
        got = consumer.receive(3, timeout=2.0)
        assert [m.value for m in got] == ["a", "b", "c"]
        consumer.ack(got[1:])  # the first stays unacked
        info = ownership_info(queue)
        assert (info.delivered_offset, info.acked_offset, info.in_flight) == (3, 0, 1)


def test_a_waiting_receive_wakes_when_a_held_deliverys_visibility_timeout_passes(store: Store) -> None:
    """A receive waiting on an idle queue wakes when a held delivery's visibility timeout passes,
    not at its next (backed-off) poll."""
    queue = store.new_queue(capacity=60)
    queue.enqueue("x")
    with queue.consumer(
        "solo",
        time_slice=60.0,
        timeout=30.0,
        poll_interval=0.05,
        visibility_timeout=3.0,
        max_poll_interval=5.0,
    ) as consumer:
        first = consumer.receive(1, timeout=2.0)
        assert [m.value for m in first] == ["x"]
        held_at = time.monotonic()
        assert consumer.receive(1, timeout=2.5) == []  # held: the idle backoff grows past a second
        again = consumer.receive(1, timeout=5.0)
        came = time.monotonic() - held_at
        assert [(m.value, m.delivery_count) for m in again] == [("x", 2)]
        assert came < 3.0 + 1.0, came  # about when its visibility timeout passed, not a poll later


def test_a_dead_letter_reservation_a_reader_closed_is_not_counted_as_published(store: Store) -> None:
    """``publish`` is False if its reservation was closed (the owner then reserves again), True
    where the slot holds the letter (published already, by an owner that died)."""
    source = store.new_queue(capacity=12)
    target = store.new_queue(capacity=12)
    dead = DeadLetters(source, "g", target, max_deliveries=2)
    letter = dead.letter(3, "v", 0, 2, "boom")
    closed = dead.reserve()
    target.appender.close(closed, closed + 1)  # a reader closed it past the hole timeout (a tombstone)
    assert dead.publish(closed, letter) is False
    at = dead.reserve()
    assert dead.publish(at, letter) is True
    assert dead.publish(at, letter) is True  # published already (a dead owner's attempt): the slot holds it
    assert [e.value["offset"] for e in target.dequeue_batch(5)] == [3]


def test_a_queue_cannot_be_its_own_dead_letter_queue(store: Store) -> None:
    """A queue cannot be its own dead-letter queue: its letters would be consumed again."""
    queue = store.new_queue(capacity=12)
    queue.create_group("g")
    with pytest.raises(InvalidArgumentError, match="its own dead-letter queue"):
        queue.consumer("n", group="g", max_deliveries=3, dead_letter=queue)
