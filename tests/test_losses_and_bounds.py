"""Losses and bounds, on both stores: what holds the head, what counts as lost or still young,
and the batch sizes a producer keeps."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from large_queue import DataLossError, OwnershipLostError, Queue, QueueFullError
from tests.fix_backends import Store
from tests.fix_consumers import FAST, receive_all


def test_a_listed_group_whose_owner_record_cannot_be_read_holds_the_head(store: Store) -> None:
    """The head moves only up to what every listed group has acked: a group whose owner record is
    gone (a delete cut short between removing its records and unlisting it) frees nothing."""
    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.create_group("fast")
    queue.create_group("gone")
    queue.enqueue_batch(range(6))
    store.backend.remove(queue.keys.group("gone").owner)
    with queue.consumer("n1", group="fast", **FAST) as fast:
        got = receive_all(fast, 6)
        assert [m.value for m in got] == list(range(6))
        fast.ack(got)
        fast._sync_queue_head(force=True)
        assert queue.current_metadata().head == 0
        with pytest.raises(QueueFullError):  # nothing of group "gone" is known to be acked
            queue.enqueue(6)


def test_an_ack_of_a_message_from_an_earlier_ownership_still_in_flight_raises(store: Store) -> None:
    """A node that delivered a message, lost the queue and owns it again under a later epoch cannot
    ack that old delivery while the entry is still in flight: the ack raises OwnershipLostError
    (it would otherwise be a silent no-op), and the entry is delivered again, marked redelivered."""
    queue = store.new_queue()
    queue.enqueue_batch(["a", "b"])
    timing = {"time_slice": 0.2, "timeout": 1.0, "poll_interval": 0.05}
    with queue.consumer("n1", **timing) as consumer:
        (old,) = receive_all(consumer, 1)
        epoch = consumer.epoch
        with queue.consumer("n2", **timing):  # takes a turn: n1 owns again, under a later epoch
            deadline = time.monotonic() + 10
            while (not consumer.owning or consumer.epoch == epoch) and time.monotonic() < deadline:
                time.sleep(0.05)
        assert consumer.owning and consumer.epoch > epoch
        with pytest.raises(OwnershipLostError):
            consumer.ack([old])
        again = receive_all(consumer, 2)
        assert [(m.value, m.redelivered) for m in again] == [("a", True), ("b", False)]
        consumer.ack(again)


@pytest.mark.parametrize("on_data_loss", ["report", "fail"])
def test_in_flight_entries_overwritten_by_producers_count_as_lost(store: Store, on_data_loss: str) -> None:
    """Entries a group delivered and had not acked, then overwritten by a producer appending with
    overwrite_if_full, are counted in the group's ``lost`` (and with on_data_loss="fail" raise
    DataLossError naming them) when its owner next delivers."""
    queue = store.new_queue(capacity=4, slots_per_record=2)
    queue.create_group("g")
    queue.enqueue_batch(range(4))
    with queue.consumer("n1", group="g", on_data_loss=on_data_loss, **FAST) as consumer:
        held = receive_all(consumer, 4)
        assert [m.value for m in held] == [0, 1, 2, 3]
        queue.enqueue_batch([4, 5], overwrite_if_full=True)  # drops 0 and 1, delivered and not acked
        if on_data_loss == "fail":
            with pytest.raises(DataLossError) as raised:
                consumer.receive(2, timeout=1.0)
            assert raised.value.count == 2  # type: ignore[attr-defined]
            assert raised.value.lost == range(0, 2)
        rest = receive_all(consumer, 2)
        assert [m.value for m in rest] == [4, 5]
        assert queue.group("g").lost == 2
        consumer.ack([m for m in held if m.offset >= 2] + rest)
    assert queue.group("g").in_flight == 0


class _Recorder:
    """Holds a queue's appends until opened, recording each batch's size."""

    def __init__(self, queue: Queue) -> None:
        self.append = queue._append_checked
        self.opened = threading.Event()
        self.sizes: list[int] = []
        queue._append_checked = self  # type: ignore[method-assign,assignment]

    def __call__(self, entries: list[Any], **options: Any) -> range:
        self.sizes.append(len(entries))
        self.opened.wait(10)
        return self.append(entries, **options)


def test_entries_that_piled_up_while_a_batch_was_appended_go_in_batches_of_at_most_max_batch(
    store: Store,
) -> None:
    """However many entries wait while the producer thread appends, each append takes at most
    ``max_batch`` of them, and every future still names its own offset."""
    queue = store.new_queue(capacity=30, slots_per_record=5)
    recorder = _Recorder(queue)
    try:
        with queue.producer(linger=0, max_batch=3, max_pending=100) as producer:
            futures = [producer.send(0)]
            deadline = time.monotonic() + 10
            while not recorder.sizes and time.monotonic() < deadline:  # the first batch is held
                time.sleep(0.01)
            futures += [producer.send(n) for n in range(1, 10)]
            recorder.opened.set()
            assert [future.result(timeout=10) for future in futures] == list(range(10))
        assert recorder.sizes[0] == 1 and max(recorder.sizes) <= 3 and sum(recorder.sizes) == 10
    finally:
        recorder.opened.set()
    assert [entry.value for entry in queue.dequeue_batch(100)] == list(range(10))


@pytest.mark.parametrize("reader", ["dequeue", "group"])
def test_an_entry_exactly_max_age_old_is_not_older_than_max_age(store: Store, reader: str) -> None:
    """Retention drops entries *older* than max_age on the store's clock: one whose age is exactly
    max_age is still delivered, by a dequeue and by a group's consumer alike, as expire() keeps it."""
    if store.clock is None:
        pytest.skip("needs a store clock the test sets to the millisecond (the embedded store's)")
    queue = store.new_queue(capacity=12, slots_per_record=3, max_age=1.0)
    queue.store_clock.refresh = 0.0  # consumers read the store's clock at every receive
    queue.enqueue_batch(["edge", "next"])
    first = queue.get(0)
    assert first is not None
    store.advance(1.0)  # the store's clock is now exactly max_age past the entry's enqueue time
    assert queue.store_clock.now_ms() - first.enqueued_at_ms == 1000
    assert list(queue.expire()) == []
    if reader == "dequeue":
        entry = queue.dequeue()
        assert entry is not None and entry.value == "edge"
        assert queue.stats().entries_expired == 0
    else:
        with queue.consumer("n1", group="g", on_data_loss="fail", **FAST) as consumer:
            got = receive_all(consumer, 2)
            assert [m.value for m in got] == ["edge", "next"]
            consumer.ack(got)
        assert queue.group("g").lost == 0


def test_a_full_locked_queue_wrapped_by_one_gives_every_entry_in_order(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=12, slots_per_record=3)
    queue.enqueue_batch(list(range(12)))
    first = queue.dequeue()
    assert first is not None and first.offset == 0
    queue.enqueue(12)  # full again: head 1, tail 13; offset 12 takes offset 0's slot
    taken = queue.dequeue_batch(12)  # wraps: the head's record, on round to the slot of offset 0
    assert [(e.offset, e.value) for e in taken] == [(n, n) for n in range(1, 13)]


@pytest.mark.parametrize("appends", ["lock", "reserve"])
def test_a_dequeue_run_again_by_txn_id_past_expired_entries_gives_only_what_it_took(
    store: Store, appends: str
) -> None:
    queue = store.new_queue(appends=appends, capacity=12, slots_per_record=3, max_age=1.0)
    queue.store_clock.refresh = 0.0
    queue.enqueue("old")
    store.advance(1.3)  # "old" is past max_age: dropped, not taken
    queue.enqueue("new")
    assert [e.value for e in queue.dequeue_batch(5, txn_id="t")] == ["new"]
    assert [e.value for e in queue.dequeue_batch(5, txn_id="t")] == ["new"]  # its receipt: "new" only
