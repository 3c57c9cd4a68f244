"""queue.peek: runs of entries read by offset, without the lock and without taking them."""

from __future__ import annotations

import pytest

from large_queue import Queue
from large_queue.errors import InvalidArgumentError
from tests.fix_backends import APPENDS, Store
from tests.test_appends import rec_set, reserving


def offsets(entries: list) -> list[int]:  # type: ignore[type-arg]
    return [entry.offset for entry in entries]


@pytest.mark.parametrize("appends", APPENDS)
def test_a_peek_reads_from_the_head_across_records_and_takes_nothing(store: Store, appends: str) -> None:
    queue = store.new_queue(appends=appends, capacity=30, slots_per_record=4)
    queue.enqueue_batch([{"n": n} for n in range(10)])
    queue.dequeue_batch(3)
    before = store.backend.commands
    seen = queue.peek(5)
    assert [(e.offset, e.value) for e in seen] == [(n, {"n": n}) for n in range(3, 8)]
    assert store.backend.commands - before == 2  # the metadata, then one batch read of records 0..1
    assert all(e.enqueued_at_ms > 0 for e in seen)
    assert offsets(queue.peek(100)) == list(range(3, 10))  # fewer: the queue ends first
    assert offsets(queue.peek(3, start=8)) == [8, 9]
    assert offsets(queue.peek(2, start=1)) == [3, 4]  # below the head: taken already
    assert queue.peek(start=10) == [] and queue.peek(start=10_000) == []
    assert queue.info().head_offset == 3 and queue.info().lock_owner is None
    assert offsets(queue.dequeue_batch(100)) == list(range(3, 10))  # every entry is still there


@pytest.mark.parametrize("appends", APPENDS)
def test_a_peek_passes_over_slots_a_later_lap_took(store: Store, appends: str) -> None:
    queue = store.new_queue(appends=appends, capacity=6, slots_per_record=3)
    queue.enqueue_batch(range(6))
    queue.enqueue_batch([6, 7], overwrite_if_full=True)  # 0 and 1 dropped
    assert [e.value for e in queue.peek(10)] == [2, 3, 4, 5, 6, 7]
    assert [e.value for e in queue.peek(10, start=0)] == [2, 3, 4, 5, 6, 7]


def test_a_peek_stops_at_a_reservation_not_yet_published_and_passes_a_closed_one(store: Store) -> None:
    queue, clock = reserving(store, capacity=12, slots_per_record=3, hole_timeout=1.0)
    queue.enqueue_batch(["a", "b"])
    paused = queue.appender.reserve(1, overwrite=False)  # offset 2: its producer pauses here
    queue.enqueue_batch(["d", "e"])
    assert [e.value for e in queue.peek(10)] == ["a", "b"]
    assert queue.peek(10, start=3) == []  # past the hole: not visible yet
    assert queue.get(3) is None  # as an offset read of one sees it
    queue.appender.close(paused, paused + 1)  # a reader closed it
    assert [e.value for e in queue.peek(10)] == ["a", "b", "d", "e"]
    assert [e.value for e in queue.peek(1, start=2)] == ["d"]
    clock.now += 10  # a peek closes no hole of its own: it writes nothing
    assert [e.value for e in queue.dequeue_batch(10)] == ["a", "b", "d", "e"]


def test_a_peek_sees_a_spanning_batch_whole_or_not_at_all(store: Store) -> None:
    queue, _ = reserving(store, capacity=12, slots_per_record=3, hole_timeout=1.0)
    first = queue.appender.reserve(5, overwrite=False)  # offsets 0..4: records 0 and 1
    # Its producer published record 0 (each slot marked with the batch's last offset, 4) and no more.
    queue.backend.operate(queue.keys.buffer(0), [rec_set(0, [[o, o, 0, 4] for o in range(3)])])
    assert queue.peek(10) == [] and queue.peek(10, start=1) == []  # none of the batch shows
    queue.appender.publish(first, list(range(5)), 0, repeat=True)
    assert [e.value for e in queue.peek(10)] == list(range(5))


def test_a_peek_deep_in_a_queue_settles_what_lies_before_it(store: Store) -> None:
    queue, _ = reserving(store, capacity=2000, slots_per_record=4)
    for start in range(0, 1500, 100):
        queue.enqueue_batch(range(start, start + 100))
    before = queue.stats().commands
    assert [e.value for e in queue.peek(3, start=1400)] == [1400, 1401, 1402]
    settling = queue.stats().commands - before  # a batch read per 64 records before it
    assert settling >= 1 + 350 // 64
    before = queue.stats().commands
    assert [e.value for e in queue.peek(2, start=1498)] == [1498, 1499]
    assert queue.stats().commands - before <= 3  # this handle knows the prefix reaches past 1400


def test_a_get_deep_in_a_queue_settles_once_and_moves_the_hint(store: Store) -> None:
    queue, _ = reserving(store, capacity=2000, slots_per_record=4)
    for start in range(0, 1500, 100):
        queue.enqueue_batch(range(start, start + 100))
    reader = Queue.open(store.backend, queue.name)
    before = reader.stats().commands
    assert reader.get(1499).value == 1499  # type: ignore[union-attr]
    assert reader.stats().commands - before >= 1 + 375 // 64  # settled, part by part, from the hint
    before = reader.stats().commands
    assert reader.get(1450).value == 1450  # type: ignore[union-attr]
    assert reader.stats().commands - before <= 3
    other = Queue.open(store.backend, queue.name)  # another handle: the stored hint was moved
    before = other.stats().commands
    assert other.get(1490).value == 1490  # type: ignore[union-attr]
    assert other.stats().commands - before <= 3


@pytest.mark.parametrize(
    "arguments",
    [
        {"max_entries": 0},
        {"max_entries": True},
        {"max_entries": 1.5},
        {"start": -1},
        {"start": "3"},
        {"start": True},
    ],
)
def test_a_peek_refuses_bad_arguments(store: Store, arguments: dict[str, object]) -> None:
    queue: Queue = store.new_queue(capacity=10)
    with pytest.raises(InvalidArgumentError):
        queue.peek(**arguments)  # type: ignore[arg-type]
