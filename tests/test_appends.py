"""Appends without the queue lock: reserve and publish, holes and tombstones, spanning batches, costs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from large_queue import Queue, QueueFullError, ReservationClosedError
from large_queue import _records as rec
from large_queue.appends._prefix import HoleWatch
from large_queue.backends import Backend, RecordCommand
from large_queue.backends._delegating import Delegating
from large_queue.backends.faults import FaultInjectingBackend
from large_queue.errors import (
    BackendError,
    BackendTimeoutError,
    ConditionNotMetError,
    CorruptQueueError,
    LockNotAcquiredError,
    OutcomeUnknownError,
)
from large_queue.lock import LockPolicy
from tests.fix_backends import Store


class FakeClock:
    """A monotonic clock for hole timeouts, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reserving(store: Store, **options: object) -> tuple[Queue, FakeClock]:
    """A queue with lock-free appends whose hole timeouts run on a clock the test moves."""
    options.setdefault("appends", "reserve")
    options.setdefault("encoding", "native")  # the tests publish and read stored values as they are
    queue = store.new_queue(**options)
    clock = FakeClock()
    queue.holes = HoleWatch(queue.hole_timeout, clock)
    return queue, clock


def values(entries: list) -> list:  # type: ignore[type-arg]
    return [entry.value for entry in entries]


def test_single_enqueue_costs_two_round_trips_and_a_batch_at_most_one_per_record(store: Store) -> None:
    queue, _ = reserving(store, capacity=40, slots_per_record=5)
    before = store.backend.commands
    assert queue.enqueue("a") == 0
    assert store.backend.commands - before == 2  # reserve, publish
    before = store.backend.commands
    assert queue.enqueue_batch(range(8)) == range(1, 9)  # offsets 1..8: buffer records 0 and 1
    assert store.backend.commands - before == 1 + 2
    before = store.backend.commands
    assert queue.enqueue_batch(range(17)) == range(9, 26)  # offsets 9..25: buffer records 1 to 5
    # the records before the last in one batch command where the store has them, then the last
    assert store.backend.commands - before == 1 + (2 if store.backend.operates_together else 5)
    assert values(queue.dequeue_batch(40)) == ["a", *range(8), *range(17)]


def test_a_reservation_refused_while_full_is_sent_again_when_a_reader_made_room_meanwhile(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue, _ = reserving(store, capacity=3, slots_per_record=3)
    queue.enqueue_batch(range(3))
    reader = Queue.open(store.backend, queue.name)
    look = queue.appender._metadata

    def after_a_dequeue() -> Any:  # why was it refused? by now a reader has made room
        reader.dequeue()
        return look()

    monkeypatch.setattr(queue.appender, "_metadata", after_a_dequeue)
    assert queue.enqueue("x") == 3  # not QueueFullError "has 1 free slots, 1 requested"
    assert values(queue.dequeue_batch(5)) == [1, 2, "x"]


def test_a_full_queue_refuses_a_reservation_and_reserves_nothing(store: Store) -> None:
    queue, _ = reserving(store, capacity=6, slots_per_record=3)
    queue.enqueue_batch(range(5))
    with pytest.raises(QueueFullError, match="1 free slots, 2 requested"):
        queue.enqueue_batch(["x", "y"])
    assert queue.info().reserved_tail == 5
    assert queue.enqueue("last") == 5
    with pytest.raises(QueueFullError):  # a single enqueue, at exactly the capacity
        queue.enqueue("one too many")
    assert values(queue.dequeue_batch(10)) == [0, 1, 2, 3, 4, "last"]


def test_a_closer_that_comes_after_the_publish_is_refused_and_the_entry_stays(store: Store) -> None:
    queue, _ = reserving(store, capacity=6, slots_per_record=3)
    first, now_ms = queue.appender.reserve_stamped(1, overwrite=False)
    queue.appender.publish(first, ["published"], now_ms)
    with pytest.raises(ConditionNotMetError):  # the reader had seen the hole before the publish
        queue.appender.close(first, first + 1)
    assert values(queue.peek()) == ["published"]


def test_a_slot_still_holding_the_last_laps_entry_is_a_hole_not_that_entry(store: Store) -> None:
    queue, _ = reserving(store, capacity=3, slots_per_record=3)
    queue.enqueue_batch(["old-0", "old-1", "old-2"])
    assert values(queue.dequeue_batch(3)) == ["old-0", "old-1", "old-2"]
    queue.appender.reserve(1, overwrite=False)  # offset 3, in the slot of offset 0: not published
    queue.enqueue("after")  # offset 4
    assert queue.peek() == [] and queue.dequeue() is None and queue.get(3) is None
    assert queue.info().tail_offset == 3


def test_overwriting_moves_the_head_in_the_reservation(store: Store) -> None:
    queue, _ = reserving(store, capacity=6, slots_per_record=3)
    queue.enqueue_batch(range(6))
    assert queue.enqueue_batch(["a", "b"], overwrite_if_full=True) == range(6, 8)
    info = queue.info()
    assert (info.head_offset, info.tail_offset) == (2, 8)
    assert values(queue.dequeue_batch(10)) == [2, 3, 4, 5, "a", "b"]


def test_readers_stop_at_a_hole_until_its_timeout_then_close_it(store: Store) -> None:
    queue, clock = reserving(store, capacity=12, slots_per_record=3, hole_timeout=5.0)
    queue.enqueue("before")
    paused = queue.appender.reserve(1, overwrite=False)  # its producer pauses here
    queue.enqueue("after")
    assert values(queue.dequeue_batch(10)) == ["before"]
    assert queue.dequeue() is None  # the prefix ends at the hole: nothing past it is seen
    assert queue.get(2) is None and queue.info().tail_offset == 1 and queue.info().reserved_tail == 3
    clock.now += 4.9
    assert queue.dequeue() is None
    clock.now += 0.2  # open past the timeout since this reader first saw it
    assert values(queue.dequeue_batch(10)) == ["after"]
    assert queue.stats().holes_closed == 1
    with pytest.raises(ReservationClosedError, match="nothing of it is visible"):
        queue.appender.publish(paused, ["late"], 0)
    assert queue.get(paused) is None
    assert queue.enqueue("again") == 3  # a retry takes a new offset
    assert values(queue.dequeue_batch(10)) == ["again"]


def test_a_dead_producers_reservation_of_many_offsets_is_closed_after_one_hole_timeout(store: Store) -> None:
    queue, clock = reserving(store, capacity=12, slots_per_record=6, hole_timeout=1.0)
    queue.appender.reserve(4, overwrite=False)  # offsets 0..3: its producer died before publishing
    queue.enqueue("behind")
    assert queue.dequeue() is None  # one offset read: the clocks of all four start now
    clock.now += 1.5
    before = queue.stats()
    entry = queue.dequeue()  # not one hole timeout per offset as the head reaches each
    assert entry is not None and entry.value == "behind"
    after = queue.stats()
    assert after.holes_closed - before.holes_closed == 4
    assert (after.dequeue_calls - before.dequeue_calls, after.entries_dequeued - before.entries_dequeued) == (
        1,
        1,
    )


def test_a_publish_before_the_timeout_wins_over_the_closer(store: Store) -> None:
    queue, clock = reserving(store, capacity=12, slots_per_record=3, hole_timeout=1.0)
    slow = queue.appender.reserve(1, overwrite=False)
    assert queue.dequeue() is None
    queue.appender.publish(slow, ["in time"], 0)
    clock.now += 2
    assert values(queue.dequeue_batch(5)) == ["in time"]
    assert queue.stats().holes_closed == 0


def test_a_spanning_batch_is_seen_whole_or_not_at_all(store: Store) -> None:
    queue, _ = reserving(store, capacity=12, slots_per_record=3, hole_timeout=1.0)
    first = queue.appender.reserve(7, overwrite=False)  # offsets 0..6: buffer records 0, 1 and 2
    # The producer publishes record by record, the one holding the batch's last offset last.
    writes = []
    original = queue.backend.operate

    def record_by_record(key, operations, **kwargs):  # type: ignore[no-untyped-def]
        writes.append(key.user_key)
        if len(writes) == 2:
            assert queue.dequeue() is None  # two records published: none of the batch is visible
            assert queue.get(0) is None
        return original(key, operations, **kwargs)

    queue.backend.operate = record_by_record  # type: ignore[method-assign]
    queue.appender.publish(first, list(range(7)), 0)
    queue.backend.operate = original  # type: ignore[method-assign]
    assert writes[-1] == "queue-buffer-2"
    assert values(queue.dequeue_batch(10)) == list(range(7))


def test_a_half_published_spanning_batch_is_closed_whole(store: Store) -> None:
    queue, clock = reserving(store, capacity=12, slots_per_record=3, hole_timeout=1.0)
    first = queue.appender.reserve(5, overwrite=False)  # offsets 0..4: records 0 and 1
    # The producer published record 0 (marked with the batch's last offset 4), then died.
    queue.backend.operate(queue.keys.buffer(0), [rec_set(0, [[o, o, 0, 4] for o in range(3)])])
    queue.enqueue("next")  # offset 5
    assert queue.dequeue() is None  # its first part is published, but the batch is not complete
    clock.now += 1.5
    assert values(queue.dequeue_batch(10)) == ["next"]  # closed by a tombstone on offset 4
    with pytest.raises(ReservationClosedError):
        queue.appender.publish(first, list(range(5)), 0)
    assert [queue.get(o) for o in range(5)] == [None] * 5


def test_a_closed_batch_closes_its_unwritten_parts_across_the_parts_a_reader_reads_apart(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from large_queue.appends import _reader

    monkeypatch.setattr(_reader, "RECORDS_PER_READ", 1)  # the prefix is read one record at a time
    queue, _ = reserving(store, capacity=12, slots_per_record=3, hole_timeout=1.0)
    first = queue.appender.reserve(5, overwrite=False)  # offsets 0..4: records 0 and 1
    # The producer published record 0's part (marked with the batch's last offset 4) and died
    # before record 1's; a reader that met offset 4 as a plain hole closed it.
    queue.backend.operate(queue.keys.buffer(0), [rec_set(0, [[o, o, 0, 4] for o in range(3)])])
    queue.appender.close(4, 5)
    queue.enqueue("next")  # offset 5
    # Offset 3 (never written) belongs to a closed batch, read in the part after the one that
    # showed the batch closed: it is closed too, not a hole to wait on.
    assert queue.info().tail_offset == 6
    assert values(queue.peek(10)) == ["next"]
    with pytest.raises(ReservationClosedError):
        queue.appender.publish(first, list(range(5)), 0)


def test_a_producer_refused_midway_closes_its_own_batch(store: Store) -> None:
    queue, _ = reserving(store, capacity=12, slots_per_record=3)
    first = queue.appender.reserve(5, overwrite=False)  # offsets 0..4: records 0 and 1
    queue.appender.close(3, 5)  # a reader closed the part in record 1 ...
    with pytest.raises(ReservationClosedError):
        queue.appender.publish(first, list(range(5)), 0)  # ... so record 0's part must not show
    queue.enqueue("next")
    assert values(queue.dequeue_batch(10)) == ["next"]


class SentTogether(Delegating):
    """Sends ``operate_each`` as one command on any store, as Aerospike does. The records numbered
    in ``lose`` time out in doubt after they were applied (their answer was lost); those in ``drop``
    time out in doubt and were not applied (their request was lost)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.operates_together = True
        self.lose: set[int] = set()
        self.drop: set[int] = set()
        self.sent: list[int] = []  # records in each operate_each

    def operate_each(self, commands: Sequence[RecordCommand]) -> list[dict[str, Any] | BackendError]:
        self.sent.append(len(commands))
        kept = [command for index, command in enumerate(commands) if index not in self.drop]
        applied = iter(super().operate_each(kept))
        timeout = BackendTimeoutError("injected: no answer", code=9, in_doubt=True)
        outcomes = [timeout if index in self.drop else next(applied) for index in range(len(commands))]
        return [timeout if index in self.lose else outcome for index, outcome in enumerate(outcomes)]


def test_a_batch_sends_the_records_before_its_last_together_and_settles_each(store: Store) -> None:
    queue, _ = reserving(store, capacity=24, slots_per_record=3)
    together = SentTogether(store.backend)
    queue = Queue.open(together, queue.name)
    together.lose = {1}  # record 1's answer is lost: it is sent again, refused by its own slots, read
    together.drop = {2}  # record 2's request is lost: it is sent again, alone, and applied
    assert queue.enqueue_batch(range(10)) == range(10)  # offsets 0..9: records 0 to 3
    assert together.sent == [3]  # records 0, 1 and 2 in one command; then 1, 2 and 3 alone
    assert values(queue.dequeue_batch(20)) == list(range(10))


@pytest.mark.parametrize("encoding", ["msgpack", "native"])
def test_records_sent_together_are_cut_into_commands_of_bounded_size(
    store: Store, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    from large_queue.appends import _slots

    # Aerospike's client refuses a batch command past about 128 MiB: here the bound is 300 bytes
    monkeypatch.setattr(_slots, "MOST_BYTES_TOGETHER", 300)
    queue, _ = reserving(store, capacity=40, slots_per_record=3, encoding=encoding)
    together = SentTogether(store.backend)
    queue = Queue.open(together, queue.name)
    entries = ["x" * 40] * 19  # offsets 0..18: records 0 to 6; each record's 3 entries about 120 bytes
    assert queue.enqueue_batch(entries) == range(19)
    assert together.sent == [2, 2, 2]  # the 6 records before the last, two to a command
    assert values(queue.dequeue_batch(40)) == entries


def test_a_batch_refused_in_a_record_sent_together_is_closed_whole(store: Store) -> None:
    queue, _ = reserving(store, capacity=24, slots_per_record=3)
    together = SentTogether(store.backend)
    queue = Queue.open(together, queue.name)
    first = queue.appender.reserve(10, overwrite=False)  # offsets 0..9: records 0 to 3
    queue.appender.close(3, 6)  # a reader closed the part in record 1 ...
    with pytest.raises(ReservationClosedError):
        queue.appender.publish(first, list(range(10)), 0)  # ... so records 0 and 2 must not show
    assert together.sent == [3]
    assert [queue.get(o) for o in range(10)] == [None] * 10
    queue.enqueue("next")
    assert values(queue.dequeue_batch(20)) == ["next"]


def test_a_publish_that_timed_out_after_applying_is_not_reported_as_closed(store: Store) -> None:
    faulty = FaultInjectingBackend(store.backend)
    queue, _ = reserving(store, capacity=12, slots_per_record=3)
    queue = Queue.open(faulty, queue.name)
    faulty.inject(lambda call: call.key.user_key.startswith("queue-buffer"), applied=True)
    assert queue.enqueue("once") == 0  # the repeat is refused by its own slot, which holds it
    faulty.inject(lambda call: call.key.user_key == "queue-metadata", applied=True)
    assert queue.enqueue("twice") == 2  # the first reservation (offset 1) was applied: a hole
    assert queue.info().reserved_tail == 3
    assert values(queue.dequeue_batch(10)) == ["once"]


def test_the_lock_expires_on_its_stamp_while_producers_write_its_record(store: Store) -> None:
    queue, _ = reserving(store, lock_ttl=0.2, lock_policy=LockPolicy(acquire_timeout=0.05))
    queue.enqueue("x")
    holder = queue.lock.try_acquire("A")  # then A dies
    with pytest.raises(LockNotAcquiredError):
        queue.dequeue()
    store.advance(0.15)
    queue.enqueue("y")  # producers keep writing the metadata record...
    store.advance(0.15)
    queue.enqueue("z")
    assert values(queue.dequeue_batch(5)) == ["x", "y", "z"]  # ...and still the lock expired
    assert queue.stats().locks_broken == 1
    assert holder.txn_id == "A"


def test_an_unknown_format_is_refused_not_written(store: Store) -> None:
    queue, _ = reserving(store)
    unknown = max(rec.FORMATS) + 1
    store.backend.put(queue.keys.metadata, {rec.FORMAT: unknown})
    with pytest.raises(CorruptQueueError, match=f"format version {unknown} is not supported"):
        Queue.open(store.backend, queue.name)


def rec_set(index: int, slots: list) -> object:  # type: ignore[type-arg]
    from large_queue.backends import ListSetRange

    return ListSetRange(rec.SLOTS, index, slots)


def test_a_timed_out_publish_whose_slot_was_reused_since_is_unknown_not_closed(store: Store) -> None:
    from large_queue.errors import BackendTimeoutError, OutcomeUnknownError

    queue, _ = reserving(store, capacity=3, slots_per_record=3)
    other = Queue.open(store.backend, queue.name)
    original = queue.backend.operate
    sent = []

    def applied_then_slow_reply(key, operations, **kwargs):  # type: ignore[no-untyped-def]
        result = original(key, operations, **kwargs)
        if key.user_key.startswith("queue-buffer") and not sent:
            sent.append(key)  # applied; while the reply is late, it is consumed and its slot reused
            assert values(other.dequeue_batch(5)) == ["first"]
            other.enqueue_batch(["a", "b", "c"])
            raise BackendTimeoutError("injected: the reply was lost", code=9, in_doubt=True)
        return result

    queue.backend.operate = applied_then_slow_reply  # type: ignore[method-assign]
    try:
        with pytest.raises(OutcomeUnknownError, match="may have been applied"):
            queue.enqueue("first")
    finally:
        queue.backend.operate = original  # type: ignore[method-assign]
    assert values(queue.dequeue_batch(5)) == ["a", "b", "c"]


def test_a_batch_sent_together_that_meets_a_closed_record_says_closed_before_any_other_failure(
    store: Store,
) -> None:
    """Sent together, a closed reservation is raised before any other failure (nothing of the
    batch may show), and the batch's last slot is tombstoned at once."""
    if not store.backend.operates_together:
        pytest.skip("this store sends one command a record, stopping at the first refused")
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    first = queue.appender.reserve(9, overwrite=False)  # offsets 0..8: buffer records 0, 1 and 2
    assert first == 0
    queue.appender.close(3, 6)  # a reader closed record 1's part past the hole timeout
    store.backend.remove(queue.keys.buffer(0))  # and record 0 is missing (damage)
    with pytest.raises(ReservationClosedError):
        queue.appender.publish(first, list(range(9)), queue.appender.store_now())
    assert queue.appender._read_slots(2, [(2, 8)]) == [[8]]  # the batch's last slot: a tombstone now


@pytest.mark.parametrize("applied", [True, False])
def test_a_publish_that_times_out_at_every_attempt_is_an_outcome_unknown(store: Store, applied: bool) -> None:
    """Any attempt may have been applied: the caller is told so, with the offsets, not a bare timeout."""
    queue = store.new_queue(capacity=6, slots_per_record=3, hole_timeout=0.2)
    backend = FaultInjectingBackend(store.backend)
    faulty = Queue.open(backend, queue.name)
    backend.inject(lambda call: call.is_buffer, applied=applied, times=3)
    with pytest.raises(OutcomeUnknownError, match="timed out") as caught:
        faulty.enqueue_batch(["a", "b"])
    assert caught.value.offsets == range(0, 2) and caught.value.stage == "publishing"
    assert faulty.stats().outcomes_unknown == 1
    faulty.enqueue("c")
    # applied: the entries are there; not: their offsets are a hole that the reader closes
    assert [entry.value for entry in queue.dequeue_batch(5, timeout=5)] == (
        ["a", "b", "c"] if applied else ["c"]
    )


@pytest.mark.parametrize("applied", [True, False])
def test_a_reservation_that_times_out_at_every_attempt_is_definite(store: Store, applied: bool) -> None:
    """Applied unseen, a reservation is a hole that readers close: nothing of the append ever shows."""
    queue = store.new_queue(capacity=6, slots_per_record=3, hole_timeout=0.2)
    backend = FaultInjectingBackend(store.backend)
    faulty = Queue.open(backend, queue.name)
    backend.inject(lambda call: call.key.user_key == rec.METADATA_KEY, applied=applied, times=3)  # reserving
    with pytest.raises(BackendTimeoutError, match="appending again is safe") as caught:
        faulty.enqueue("a")
    assert not caught.value.in_doubt
    faulty.enqueue("b")
    assert [entry.value for entry in queue.dequeue_batch(5, timeout=5)] == ["b"]
