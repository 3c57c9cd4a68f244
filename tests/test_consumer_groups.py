"""Consumer groups, visibility timeouts, dead letters and waiting receives, on both stores.

One node per group here; many nodes and processes are in ``test_group_processes``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from large_queue import (
    DataLossError,
    DeliveryExpiredError,
    GroupNotFoundError,
    GroupsInUseError,
    InvalidArgumentError,
    Queue,
    QueueFullError,
    _lifecycle,
    errors,
)
from large_queue.cluster import Consumer, Message, _groups
from large_queue.cluster._dead_letters import DeadLetters
from tests.fix_backends import APPENDS, Place, Store, meanwhile
from tests.fix_consumers import FAST, receive_all


def _consumer(queue: Queue, group: str, node: str = "n1", **options: Any) -> Consumer:
    return queue.consumer(node, group=group, **{**FAST, **options})


def test_every_group_sees_every_entry_and_the_slowest_holds_back_producers(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.create_group("billing")
    queue.create_group("audit")
    queue.enqueue_batch(range(6))
    with pytest.raises(QueueFullError):
        queue.enqueue(6)
    with _consumer(queue, "billing") as billing:
        got = receive_all(billing, 6)
        assert [m.value for m in got] == list(range(6))
        billing.ack(got)
        billing._sync_queue_head(force=True)
        with pytest.raises(QueueFullError):  # audit has acked nothing: no slot is free
            queue.enqueue(6)
        assert queue.info().head_offset == 0
    with _consumer(queue, "audit") as audit:
        first = receive_all(audit, 2)
        assert [m.value for m in first] == [0, 1]
        audit.ack(first)
        audit._sync_queue_head(force=True)
        assert queue.info().head_offset == 2  # the lowest acked position over both groups
        assert list(queue.enqueue_batch([6, 7])) == [6, 7]
        with pytest.raises(QueueFullError):
            queue.enqueue(8)
        rest = receive_all(audit, 6)
        assert [m.value for m in rest] == [2, 3, 4, 5, 6, 7]
        audit.ack(rest)
    by_name = {g.name: g for g in queue.groups()}
    assert by_name["audit"].lag == 0 and by_name["audit"].acked_offset == 8
    assert by_name["billing"].lag == 2 and by_name["billing"].acked_offset == 6


def test_groups_are_listed_described_and_deleted(store: Store) -> None:
    queue = store.new_queue()
    assert queue.create_group("g1") is True
    assert queue.create_group("g1") is False
    queue.enqueue_batch(["a", "b", "c"])
    with _consumer(queue, "g2") as consumer:  # created on first use
        consumer.receive(2, timeout=2.0)
    info = queue.info()
    assert [g.name for g in info.groups] == ["g1", "g2"]
    g2 = queue.group("g2")
    assert (g2.delivered_offset, g2.acked_offset, g2.in_flight, g2.lag) == (2, 0, 2, 3)
    assert queue.group("g1").lag == 3
    with pytest.raises(GroupNotFoundError):
        queue.group("nope")
    with pytest.raises(InvalidArgumentError, match="group name"):
        queue.create_group("bad name!")
    assert queue.delete_group("g2") is True
    assert queue.delete_group("g2") is False
    assert [g.name for g in queue.groups()] == ["g1"]


def test_destructive_dequeue_and_the_ungrouped_consumer_are_refused_while_groups_exist(store: Store) -> None:
    queue = store.new_queue()
    queue.enqueue_batch([1, 2])
    queue.create_group("g")
    with pytest.raises(GroupsInUseError, match="consumed by groups"):
        queue.dequeue()
    with pytest.raises(GroupsInUseError):
        queue.dequeue_batch(5)
    with pytest.raises(GroupsInUseError):
        queue.consumer("n", **FAST).start()
    assert queue.info().size == 2 and queue.info().lock_owner is None  # nothing removed, lock released
    queue.delete_group("g")
    assert queue.dequeue().value == 1  # type: ignore[union-attr]


def test_visibility_timeout_redelivers_while_the_owner_lives(store: Store) -> None:
    queue = store.new_queue()
    queue.enqueue_batch(["x", "y"])
    with _consumer(queue, "g", visibility_timeout=0.3) as consumer:
        first = consumer.receive(2, timeout=2.0)
        assert [(m.value, m.delivery_count) for m in first] == [("x", 1), ("y", 1)]
        first[1].extend(5.0)  # y is kept
        again = consumer.receive(2, timeout=2.0)  # waits until x's timeout passes
        assert [(m.value, m.delivery_count, m.redelivered) for m in again] == [("x", 2, True)]
        with pytest.raises(DeliveryExpiredError):
            first[0].ack()  # only the latest delivery counts
        again[0].ack()
        first[1].ack()
        assert queue.group("g").lag == 0


def test_nack_delays_and_counts_a_redelivery(store: Store) -> None:
    queue = store.new_queue()
    queue.enqueue("x")
    with _consumer(queue, "g") as consumer:
        (message,) = consumer.receive(1, timeout=2.0)
        message.nack(delay=0.3, error="boom")
        started = time.monotonic()
        assert consumer.receive(1, timeout=0.1) == []  # still delayed
        (again,) = consumer.receive(1, timeout=3.0)
        assert time.monotonic() - started >= 0.25
        assert again.delivery_count == 2
        with pytest.raises(DeliveryExpiredError):
            message.extend(1.0)
        again.ack()


def test_poison_entries_go_to_the_dead_letter_queue_once(store: Store) -> None:
    queue = store.new_queue()
    dead = store.new_queue(capacity=6, slots_per_record=3)
    queue.enqueue_batch(["ok", "poison"])
    with _consumer(queue, "g", max_deliveries=2, dead_letter=dead) as consumer:
        for _ in range(2):
            for message in consumer.receive(2, timeout=2.0):
                if message.value == "ok":
                    message.ack()
                else:
                    message.nack(error="handler failed")
        assert consumer.receive(2, timeout=0.3) == []  # the third delivery is a move instead
        group = queue.group("g")
    assert (group.dead_lettered, group.in_flight, group.lag) == (1, 0, 0)
    letters = [dead.dequeue(), dead.dequeue()]
    assert letters[1] is None
    assert letters[0] is not None
    letter = letters[0].value
    assert letter["queue"] == queue.name and letter["group"] == "g"
    assert (letter["offset"], letter["delivery_count"], letter["value"]) == (1, 2, "poison")
    assert letter["last_error"] == "handler failed"


def test_a_move_makes_room_in_a_dead_letter_queue_full_of_letters_older_than_its_max_age(
    store: Store,
) -> None:
    """As an enqueue does: the expired letters are dropped and the move goes on, not refused for good."""
    dead = store.new_queue(capacity=3, slots_per_record=3, max_age=1.0)
    dead.enqueue_batch(["x", "y", "z"])
    store.advance(1.5)
    queue = store.new_queue()
    queue.enqueue("poison")
    with _consumer(queue, "g", max_deliveries=1, dead_letter=dead) as consumer:
        (message,) = consumer.receive(1, timeout=2.0)
        message.nack()
        assert consumer.receive(1, timeout=0.3) == []  # the second delivery is a move instead
        assert queue.group("g").dead_lettered == 1
    letter = dead.dequeue()
    assert letter is not None and letter.value["value"] == "poison"
    assert dead.stats().entries_expired == 3 and dead.info().size == 0  # the move dropped x, y and z


def test_an_entry_the_dead_letter_queue_cannot_take_stays_in_flight(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    queue = store.new_queue()
    dead = store.new_queue(encoding="json")  # JSON text has no bytes
    queue.enqueue(b"\x00poison")
    with _consumer(queue, "g", max_deliveries=1, dead_letter=dead) as consumer:
        (message,) = consumer.receive(1, timeout=2.0)
        message.nack()
        assert consumer.receive(1, timeout=0.2) == []  # the move fails: logged, not raised
        assert queue.group("g").in_flight == 1 and queue.group("g").dead_lettered == 0
    assert "could not be moved to dead-letter queue" in caplog.text
    assert dead.info().size == 0


class _Crash(BaseException):
    """A process dying at this point: nothing after it runs."""


@pytest.mark.parametrize("when", ["after the reservation is recorded", "after the publish"])
def test_a_crash_in_the_middle_of_a_move_neither_loses_nor_doubles_it(
    store: Store, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    queue = store.new_queue()
    dead = store.new_queue(capacity=6, slots_per_record=3, hole_timeout=0.2)
    queue.enqueue("poison")
    options = {"max_deliveries": 1, "dead_letter": dead, "timeout": 0.5, "time_slice": 30.0}
    real_publish = DeadLetters.publish

    def crashing_publish(self: DeadLetters, at: int, letter: Any) -> bool:
        if when == "after the publish":
            real_publish(self, at, letter)
        raise _Crash()

    first = queue.consumer("a", group="g", poll_interval=0.05, **options)  # type: ignore[arg-type]
    first.start()
    (message,) = first.receive(1, timeout=2.0)
    message.nack()
    monkeypatch.setattr(DeadLetters, "publish", crashing_publish)
    with pytest.raises(_Crash):
        first.receive(1, timeout=0.5)
    first._closed.set()  # a dead process: no hand-over, no more heartbeats
    assert first._thread is not None
    first._thread.join()
    store.advance(1.0)  # past the timeout: the owner is gone
    monkeypatch.setattr(DeadLetters, "publish", real_publish)
    assert queue.group("g").in_flight == 1  # not acked in the source: the move is not over
    with queue.consumer("b", group="g", poll_interval=0.05, **options) as second:  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while queue.group("g").dead_lettered == 0 and time.monotonic() < deadline:
            assert second.receive(1, timeout=0.2) == []
    group = queue.group("g")
    assert (group.dead_lettered, group.in_flight) == (1, 0)
    letters = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (entry := dead.dequeue(timeout=0.5)) is not None:
        letters.append(entry.value["value"])
    assert letters == ["poison"]


def test_overwritten_entries_are_reported_to_the_group_as_lost(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.create_group("slow")
    queue.enqueue_batch(range(6))
    queue.enqueue_batch([6, 7], overwrite_if_full=True)  # drops 0 and 1, which "slow" never acked
    with _consumer(queue, "slow", on_data_loss="fail") as consumer:
        with pytest.raises(DataLossError) as raised:
            consumer.receive(6, timeout=2.0)
        assert raised.value.count == 2  # type: ignore[attr-defined]
        got = receive_all(consumer, 6)
        assert [m.value for m in got] == [2, 3, 4, 5, 6, 7]
    assert queue.group("slow").lost == 2


@pytest.mark.parametrize("appends", APPENDS)
def test_entries_overwritten_below_the_tail_an_owner_saw_are_counted_lost(store: Store, appends: str) -> None:
    """The owner reads the head only when it looks past the tail it saw: what a later lap took below
    that tail is lost all the same, not skipped."""
    queue = store.new_queue(capacity=6, slots_per_record=3, appends=appends)
    queue.create_group("g")
    queue.enqueue_batch(range(6))
    with _consumer(queue, "g", on_data_loss="fail") as consumer:
        (first,) = receive_all(consumer, 1)  # offset 0; this read saw the tail at 6
        first.ack()
        queue.enqueue_batch([6, 7, 8], overwrite_if_full=True)  # drops 1 and 2, never delivered
        with pytest.raises(DataLossError) as raised:
            consumer.receive(5, timeout=0)
        assert (raised.value.count, raised.value.lost) == (2, range(1, 3))  # type: ignore[attr-defined]
        got = receive_all(consumer, 6)
        assert [m.value for m in got] == [3, 4, 5, 6, 7, 8]
        consumer.ack(got)
    assert queue.group("g").lost == 2


@pytest.mark.parametrize("grouped", [False, True])
def test_a_loss_found_over_several_passes_names_all_its_offsets(store: Store, grouped: bool) -> None:
    """An entry held in flight and the run after it, both overwritten: found in two passes, said once."""
    queue = store.new_queue(capacity=10, slots_per_record=5)
    queue.enqueue_batch(range(10))
    if grouped:
        queue.create_group("g")
    with queue.consumer("a", group="g" if grouped else None, on_data_loss="fail", **FAST) as consumer:
        got = receive_all(consumer, 4)
        consumer.ack(got[:3])  # 0..2 acked, 3 still held
        queue.enqueue_batch(range(10, 17), overwrite_if_full=True)  # drops 0..6
        with pytest.raises(DataLossError) as raised:
            consumer.receive(3, timeout=1.0)
        assert (raised.value.count, raised.value.lost) == (4, range(3, 7))  # type: ignore[attr-defined]
        assert "offsets 3..6" in str(raised.value)
        assert [m.value for m in receive_all(consumer, 10)] == [7, 8, 9, *range(10, 17)]


def test_a_waiting_dequeue_returns_when_an_entry_is_published(store: Store) -> None:
    queue = store.new_queue()
    started = time.monotonic()
    assert queue.dequeue(timeout=0.3) is None
    assert time.monotonic() - started >= 0.3
    with meanwhile(0.2, queue.enqueue, "late"):
        entry = queue.dequeue(timeout=10.0)
    assert entry is not None and entry.value == "late"
    with pytest.raises(InvalidArgumentError, match="timeout"):
        queue.dequeue(timeout=-1)


def test_a_long_idle_waiter_sees_an_entry_within_its_backoffs_cap(store: Store) -> None:
    queue = store.new_queue()
    assert queue.dequeue(timeout=1.0) is None  # idle for a second: the backoff is at its cap (0.1 s)
    enqueued: list[float] = []

    def produce() -> None:
        queue.enqueue("late")
        enqueued.append(time.monotonic())

    with meanwhile(0.3, produce):
        entry = queue.dequeue(timeout=10.0)
        seen = time.monotonic()
    assert entry is not None and entry.value == "late"
    assert seen - enqueued[0] < 0.5, seen - enqueued[0]  # not after a pause that kept doubling


def test_once_entries_come_a_waiting_dequeue_costs_what_a_plain_one_costs(store: Store) -> None:
    queue = store.new_queue(appends="reserve", capacity=64, slots_per_record=32)
    assert queue.dequeue(timeout=0.2) is None  # idle
    queue.enqueue_batch(list(range(20)))
    entry = queue.dequeue(timeout=1.0)
    assert entry is not None and entry.value == 0  # entries came: the idling is over
    waiting, plain = [], []
    for _ in range(4):
        sent = queue.backend.commands
        assert queue.dequeue(timeout=1.0) is not None
        waiting.append(queue.backend.commands - sent)
    for _ in range(4):
        sent = queue.backend.commands
        assert queue.dequeue() is not None
        plain.append(queue.backend.commands - sent)
    assert waiting == plain, (waiting, plain)  # no read of the metadata record first


def test_an_idle_consumer_sends_at_most_20_commands_a_second(store: Store) -> None:
    queue = store.new_queue()
    consumer = _consumer(queue, "g", poll_interval=0.5, time_slice=5.0, timeout=10.0).start()
    got: list[Message] = []
    iterating = threading.Thread(target=lambda: got.extend(consumer))  # the iterator form, idle
    try:
        assert consumer.receive(1, timeout=0.5) == []  # owning
        iterating.start()
        before, started = queue.backend.commands, time.monotonic()
        time.sleep(2.0)
        rate = (queue.backend.commands - before) / (time.monotonic() - started)
    finally:
        consumer.close()
        iterating.join()
    assert got == []
    assert 0 < rate <= 20, rate


def test_bad_options_are_refused_before_anything_is_written(store: Store) -> None:
    queue = store.new_queue()
    locked = store.new_queue(appends="lock")
    with pytest.raises(InvalidArgumentError, match="go together"):
        queue.consumer("n", group="g", max_deliveries=3)
    with pytest.raises(InvalidArgumentError, match="appends='reserve'"):
        queue.consumer("n", group="g", max_deliveries=3, dead_letter=locked)
    with pytest.raises(InvalidArgumentError, match="visibility_timeout"):
        queue.consumer("n", group="g", visibility_timeout=0)
    with pytest.raises(InvalidArgumentError, match="on_data_loss"):
        queue.consumer("n", group="g", on_data_loss="ignore")
    assert queue.info().groups == ()


def test_the_groups_command_creates_shows_and_deletes_groups(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    from large_queue.cli import main

    name = place.name("q")
    queue = Queue.create(place.connect(), name, capacity=10, slots_per_record=5)
    queue.enqueue_batch(range(4))
    assert main(["--url", place.url, "groups", name, "--create", "billing"]) == 0
    with queue.consumer("n1", group="billing", **FAST) as consumer:  # type: ignore[arg-type]
        consumer.ack(consumer.receive(1, timeout=2.0))
        consumer.receive(2, timeout=2.0)  # delivered, not acked
        assert main(["--url", place.url, "groups", name]) == 0
        assert main(["--url", place.url, "stats", name]) == 0
    created, at_creation, group, stats = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert (at_creation["name"], at_creation["lag"], at_creation["owner"]) == ("billing", 4, None)
    assert created == {"created": True}
    assert (group["name"], group["acked_offset"], group["in_flight"], group["lag"]) == ("billing", 1, 2, 3)
    assert stats["groups"]["billing"]["delivered_not_acked"] == 2
    assert main(["--url", place.url, "groups", name, "--delete", "billing"]) == 0
    assert json.loads(capsys.readouterr().out) == {"deleted": True}
    assert main(["--url", place.url, "dequeue", name]) == 0  # no group left: dequeuing directly works again
    assert json.loads(capsys.readouterr().out)["value"] == 1  # 0 was acked by the only group: gone


def test_a_create_group_whose_lock_was_broken_leaves_the_group_made_since_alone(store: Store) -> None:
    queue = store.new_queue(capacity=20, slots_per_record=5, lock_ttl=0.3)
    stale, other = Queue.open(store.backend, queue.name), Queue.open(store.backend, queue.name)
    owner_key = stale.keys.group("g").owner
    reads: list[Any] = []
    real_get = stale.backend.get

    def get_then_pause(key: Any, *args: Any, **kwargs: Any) -> Any:
        got = real_get(key, *args, **kwargs)
        if key == owner_key and not reads:
            reads.append(got)
            store.advance(0.6)  # meanwhile another holder breaks the lock, makes g, and g acks 0..2
            assert other.create_group("g")
            other.enqueue_batch(["e0", "e1", "e2"])
            with _consumer(other, "g") as consumer:
                consumer.ack(receive_all(consumer, 3))
        return got

    stale.backend.get = get_then_pause  # type: ignore[method-assign]
    try:
        with pytest.raises(errors.LockLostError):
            stale.create_group("g")
    finally:
        stale.backend.get = real_get  # type: ignore[method-assign]
    group = other.group("g")
    assert (group.acked_offset, group.lost, group.epoch >= 1) == (3, 0, True)  # not reset to the head of t=0
    with _consumer(other, "g", node="n2") as consumer:
        assert consumer.receive(5, timeout=0.3) == []  # nothing delivered again


def test_a_group_made_again_while_one_is_deleted_keeps_its_records(store: Store) -> None:
    queue = store.new_queue(capacity=20, slots_per_record=5)
    other = Queue.open(store.backend, queue.name)
    queue.create_group("g")
    created: list[bool] = []
    real = _lifecycle.remove_ownership

    def remove_while_another_creates(backend: Any, keys: Any) -> None:
        maker = threading.Thread(target=lambda: created.append(other.create_group("g")))
        maker.start()
        maker.join(0.3)
        assert maker.is_alive()  # it waits for the queue lock: the records go while it is held
        real(backend, keys)
        threading.Thread(target=maker.join).start()

    _groups._lifecycle.remove_ownership = remove_while_another_creates  # type: ignore[attr-defined]
    try:
        assert queue.delete_group("g")
    finally:
        _groups._lifecycle.remove_ownership = real  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5
    while not created and time.monotonic() < deadline:
        time.sleep(0.01)
    assert created == [True]
    other.enqueue("e0")
    assert other.group("g").lag == 1  # made again, and whole
    with _consumer(other, "g") as consumer:
        assert [m.value for m in receive_all(consumer, 1)] == ["e0"]


def test_a_head_move_whose_target_fails_releases_the_lock(store: Store) -> None:
    queue = store.new_queue()

    def target(grant: Any) -> int:
        raise GroupNotFoundError(f"queue {queue.name!r} has no consumer group 'g'", queue=queue.name)

    with pytest.raises(GroupNotFoundError):
        _groups.move_head(queue, "mover", target)
    assert queue.info().lock_owner is None  # not held until it expires


@pytest.mark.parametrize("name", ["g-nodes", "g-node-x", "g-node", "a-node-nodes"])
def test_a_group_name_that_could_name_another_groups_records_is_refused(store: Store, name: str) -> None:
    queue = store.new_queue()
    queue.create_group("g")
    with pytest.raises(InvalidArgumentError, match="another group's records"):
        queue.create_group(name)
    assert queue.create_group("my-nodejs-app") and queue.create_group("nodes")
    assert sorted(g.name for g in queue.groups()) == ["g", "my-nodejs-app", "nodes"]


def test_the_ungrouped_consumer_after_the_last_group_goes_starts_where_the_groups_left_off(
    store: Store,
) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    queue.enqueue_batch([0, 1, 2, 3])
    with queue.consumer("n1", **FAST) as consumer:
        consumer.ack(receive_all(consumer, 2))
    with _consumer(queue, "g") as consumer:
        consumer.ack(receive_all(consumer, 2))  # 2 and 3: consumed by the group, not lost
    assert queue.delete_group("g")
    queue.enqueue_batch([4, 5])
    with queue.consumer("n1", on_data_loss="fail", **FAST) as consumer:  # DataLossError before
        assert [m.value for m in receive_all(consumer, 2)] == [4, 5]


def test_a_cursor_committed_past_the_tail_is_refused_and_the_queue_stays_whole(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.create_group("spark")
    queue.enqueue_batch([1, 2])
    with pytest.raises(InvalidArgumentError, match="tail is 2"):
        _groups.commit_cursor(queue, "spark", 6)  # a stream's offset from another creation of the queue
    _groups.commit_cursor(queue, "spark", 2)
    info = queue.info()
    assert (info.head_offset, info.tail_offset) == (2, 2)
    assert queue.group("spark").acked_offset == 2


def test_an_ungrouped_consumer_running_when_a_group_is_made_stops_delivering(store: Store) -> None:
    queue = store.new_queue(capacity=10, slots_per_record=5)
    queue.enqueue_batch([0, 1, 2, 3, 4, 5])
    with queue.consumer("u1", **FAST) as consumer:
        consumer.ack(receive_all(consumer, 2))
        held = receive_all(consumer, 1)
        with queue.consumer("u2", **FAST) as waiting:  # another node, waiting for its turn
            assert queue.create_group("g")
            with pytest.raises(GroupsInUseError):  # not entries 3.. to both it and the group
                consumer.receive(4, timeout=0.3)
            time.sleep(0.3)  # watcher ticks: none takes the queue back
            for node in (consumer, waiting):  # the waiting node is told as well
                with pytest.raises(GroupsInUseError):
                    node.receive(4, timeout=0.3)
                assert not node.owning
        with pytest.raises(errors.OwnershipLostError):  # fenced: what it held is the group's to deliver
            consumer.ack(held)
        with queue.consumer("g1", group="g", **FAST) as grouped:
            assert [m.value for m in receive_all(grouped, 6)] == [2, 3, 4, 5]  # from the head it made
        assert queue.delete_group("g")
        time.sleep(0.3)  # its watcher's next tick finds no group: it takes the queue again
        # what it held comes again, then the rest
        assert sorted(m.value for m in receive_all(consumer, 4)) == [2, 3, 4, 5]


def test_entries_in_flight_to_a_dead_ungrouped_consumer_survive_a_group_made_and_deleted(
    store: Store,
) -> None:
    queue = store.new_queue(capacity=10, slots_per_record=5)
    queue.enqueue_batch(["a", "b", "c", "d", "e"])
    with queue.consumer("u1", **FAST) as consumer:
        assert len(receive_all(consumer, 3)) == 3  # then it dies, acking nothing
    queue.create_group("g")
    assert queue.delete_group("g")  # nobody consumed as g
    with queue.consumer("u2", on_data_loss="fail", **FAST) as consumer:
        assert sorted(m.value for m in receive_all(consumer, 5)) == ["a", "b", "c", "d", "e"]


def test_a_reader_commit_leaves_the_head_to_a_group_whose_owner_record_is_gone(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    queue.create_group("a")
    queue.create_group("b")
    queue.enqueue_batch(list(range(5)))
    store.backend.remove(queue.keys.group("b").owner)  # where b got to is unknown
    _groups.commit_cursor(queue, "a", 5)  # a (a Spark stream, say) acked everything
    assert queue.current_metadata().head == 0  # nothing is freed on a guess


def test_a_reader_commit_takes_the_tail_and_nothing_past_it(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    queue.create_group("g")
    queue.enqueue_batch([0, 1, 2])
    with pytest.raises(InvalidArgumentError, match="cannot ack up to offset 4: the queue's tail is 3"):
        _groups.commit_cursor(queue, "g", 4)
    assert queue.group("g").acked_offset == 0
    _groups.commit_cursor(queue, "g", 3)
    assert queue.group("g").acked_offset == 3


def test_a_group_behind_the_head_lags_by_what_is_still_queued(store: Store) -> None:
    queue = store.new_queue(capacity=4, slots_per_record=2)
    queue.create_group("g")
    queue.enqueue_batch([0, 1, 2, 3])
    queue.enqueue_batch([4, 5], overwrite_if_full=True)  # 0 and 1 dropped: head 2, tail 6
    assert queue.group("g").lag == 4  # 2..5, not the 2 entries gone


def test_a_long_nack_error_is_kept_to_1000_characters_in_the_letter(store: Store) -> None:
    queue = store.new_queue()
    dead = store.new_queue(capacity=6, slots_per_record=3)
    queue.enqueue("poison")
    with _consumer(queue, "g", max_deliveries=1, dead_letter=dead) as consumer:
        (message,) = consumer.receive(1, timeout=2.0)
        message.nack(error="".join(str(n % 10) for n in range(5000)))
        assert consumer.receive(1, timeout=0.3) == []  # its next delivery is the move
    letter = dead.dequeue()
    assert letter is not None
    kept = letter.value["last_error"]
    assert len(kept) == 1000 and kept.endswith("…") and kept[:999] == "0123456789" * 99 + "012345678"


def test_a_queues_first_group_costs_one_round_trip_more_than_the_next(store: Store) -> None:
    queue = store.new_queue()
    costs = []
    for name in ("first", "second"):
        before = store.backend.commands
        assert queue.create_group(name) is True
        costs.append(store.backend.commands - before)
    assert costs == [6, 5]  # the first also reads the ungrouped owner record


def test_a_group_left_listed_without_its_records_is_damage_that_info_names(place: Place) -> None:
    """A delete cut short after removing a group's records leaves it listed, holding the head: info
    says so (the CLI's info and stats then exit 1) instead of showing a full queue whose groups all acked."""
    from large_queue.cli import main

    backend = place.connect()
    queue = Queue.create(backend, place.name("q"), capacity=10, slots_per_record=5)
    queue.enqueue_batch(list(range(10)))
    queue.create_group("g")
    queue.create_group("h")
    with queue.consumer("a", group="h", **FAST) as consumer:
        consumer.ack(receive_all(consumer, 10))
    backend.remove(queue.keys.group("g").owner)  # what a delete removes first
    with pytest.raises(QueueFullError):
        queue.enqueue(10)
    info = queue.info()
    assert [g.name for g in info.groups] == ["h"]
    assert info.damaged is not None and "consumer group 'g' is listed without its records" in info.damaged
    assert main(["--url", place.url, "info", queue.name]) == 1
    # while the queue lock is held (a delete under way holds it), it is passed over as before
    grant = queue.lock.acquire("deleter")
    assert queue.info().damaged is None
    queue.lock.release(grant)
    assert queue.delete_group("g")
    assert queue.info().damaged is None
    queue.enqueue(10)  # the head follows h again
    Queue.delete(backend, queue.name)


def test_deleting_the_slowest_group_frees_the_room_it_held(store: Store) -> None:
    """The other group had acked everything: its consumer moves the head only after further acks,
    which a full queue never gets, so the delete moves it."""
    queue = store.new_queue(capacity=10, slots_per_record=5)
    queue.enqueue_batch(list(range(10)))
    queue.create_group("slow")
    queue.create_group("done")
    with queue.consumer("a", group="done", **FAST) as consumer:
        held = receive_all(consumer, 8)
        consumer.ack(held[:6])  # 6 and 7 still in flight
        with pytest.raises(QueueFullError):
            queue.enqueue(10)
        assert queue.delete_group("slow")
        assert queue.info().head_offset == 6  # up to what "done" acked, not past its in-flight 6 and 7
        assert queue.enqueue_batch([10, 11, 12, 13, 14, 15]) == range(10, 16)
        consumer.ack(held[6:])
        assert [m.value for m in receive_all(consumer, 8)] == [8, 9, 10, 11, 12, 13, 14, 15]


def test_a_consumer_of_a_deleted_queue_does_not_take_the_group_of_the_queue_made_again(place: Place) -> None:
    backend = place.connect()
    name = place.name("again")
    queue = Queue.create(backend, name, capacity=20, slots_per_record=10)
    queue.enqueue_batch([{"old": n} for n in range(4)])
    queue.create_group("g")
    timing = {"timeout": 1.0, "time_slice": 30.0, "poll_interval": 0.05}
    old = queue.consumer("a", group="g", **timing).start()
    try:
        old.ack(receive_all(old, 2))
        Queue.delete(backend, name)
        again = Queue.create(backend, name, capacity=20, slots_per_record=10)
        again.enqueue_batch([{"new": n} for n in range(8)])
        again.create_group("g")
        time.sleep(1.0)  # the old consumer's watcher ticks about 20 times meanwhile
        assert [(g.name, g.owner) for g in again.groups()] == [("g", None)]
        with again.consumer("b", group="g", **timing) as new:
            began = time.monotonic()
            got = receive_all(new, 3, timeout=10)
            assert time.monotonic() - began < 1.0  # not held up by the old consumer's slice
            assert [m.value for m in got] == [{"new": 0}, {"new": 1}, {"new": 2}]
        with pytest.raises(errors.QueueNotFoundError, match="created again"):
            old.receive(1, timeout=0)
    finally:
        old.close()
        Queue.delete(backend, name)
