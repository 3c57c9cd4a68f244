"""Seek by time: ``queue.offset_at`` finds the first offset enqueued at or after a moment, on both stores."""

from __future__ import annotations

import datetime
import math

import pytest

from large_queue import InvalidArgumentError, Queue
from tests.fix_backends import Store


def _fill(store: Store, queue: Queue, batches: int) -> list[tuple[int, int]]:
    """Enqueue batches a few ms apart on the store's clock; return (offset, enqueued_at_ms) of every entry."""
    for index in range(batches):
        queue.enqueue_batch([index] * (1 + index % 3))
        store.advance(0.003)
    info = queue.info()
    entries = [queue.get(offset) for offset in range(info.head_offset, info.tail_offset)]
    return [(e.offset, e.enqueued_at_ms) for e in entries if e is not None]


def _expected(stamps: list[tuple[int, int]], moment: int, end: int) -> int:
    return next((offset for offset, at in stamps if at >= moment), end)


@pytest.mark.parametrize("appends", ["reserve", "lock"])
def test_offset_at_finds_the_first_entry_at_or_after_each_moment(store: Store, appends: str) -> None:
    queue = store.new_queue(appends=appends, capacity=400, slots_per_record=5)
    stamps = _fill(store, queue, 60)
    queue.dequeue_batch(7)  # a head past the first records
    stamps = [item for item in stamps if item[0] >= 7]
    end = queue.info().tail_offset
    moments = sorted({at for _, at in stamps} | {at + 1 for _, at in stamps} | {0, stamps[0][1] - 1})
    for moment in moments:
        assert queue.offset_at(moment) == _expected(stamps, moment, end), moment
    assert queue.offset_at(2**62) == end  # after every entry: the end of the prefix
    assert queue.offset_at(0) == 7  # before every entry: the head
    aware = datetime.datetime.fromtimestamp(stamps[10][1] / 1000, tz=datetime.timezone.utc)
    assert queue.offset_at(aware) == _expected(stamps, stamps[10][1], end)
    # bisection over records: about log2(records) round trips, however many entries
    before = queue.stats().commands
    queue.offset_at(stamps[len(stamps) // 2][1])
    records = math.ceil((end - 7) / queue.shape.slots_per_record)
    assert queue.stats().commands - before <= math.ceil(math.log2(records)) + 3


def test_offset_at_passes_over_closed_reservations(store: Store) -> None:
    queue = store.new_queue(appends="reserve", capacity=60, slots_per_record=5)
    queue.enqueue_batch(["a", "b"])
    store.advance(0.005)
    first = queue.appender.reserve(6, overwrite=False)  # a producer that died: closed by a reader
    queue.appender.close(first, first + 3)
    queue.appender.close(first + 3, first + 6)
    store.advance(0.005)
    queue.enqueue("c")
    late = queue.get(8)
    assert late is not None and late.value == "c"
    assert queue.offset_at(late.enqueued_at_ms) == 8
    assert queue.offset_at(late.enqueued_at_ms + 1) == 9


def test_offset_at_refuses_what_is_not_a_moment(store: Store) -> None:
    queue = store.new_queue()
    for bad in (-1, 1.5, "2026-01-01", datetime.datetime(2026, 1, 1)):
        with pytest.raises(InvalidArgumentError, match=r"moment|time zone"):
            queue.offset_at(bad)
    assert queue.offset_at(0) == 0  # an empty queue: its end


def test_a_moment_inside_a_millisecond_is_after_that_milliseconds_entries() -> None:
    """Entries are stamped in whole milliseconds: 0.4 ms past one is after it, not rounded back to it."""
    from large_queue._seek import as_ms

    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    base = as_ms(start)
    assert base == 1_767_225_600_000
    for micros, after in [(0, 0), (400, 1), (999, 1), (1000, 1), (1001, 2)]:
        assert as_ms(start + datetime.timedelta(microseconds=micros)) - base == after
