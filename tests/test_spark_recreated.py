"""Spark reads planned in one creation of a queue and run after it was deleted and created again.

Spark plans a batch read or a micro-batch on the driver and reads it in tasks
later; the queue may be deleted and created again in between, and the new
creation's entries take the same offsets. These tests call the data source's
methods in the order Spark does, without a session, to hit each window exactly.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from large_queue import Queue
from large_queue._entries import check_entries
from large_queue.errors import QueueError, ReservationClosedError
from large_queue.spark._source import LargeQueueDataSource
from tests.fix_backends import Place

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SCHEMA = StructType(
    [
        StructField("queue", StringType()),
        StructField("offset", LongType()),
        StructField("value", StringType()),
        StructField("enqueued_at", TimestampType()),
    ]
)


def _source(place: Place, name: str, **options: object) -> LargeQueueDataSource:
    return LargeQueueDataSource({"url": place.url, "queue": name, **{k: str(v) for k, v in options.items()}})


def _rows(reader: Any, partitions: list[Any]) -> list[tuple[int, str]]:
    """What the tasks of ``partitions`` read: (offset, value) pairs."""
    rows: list[tuple[int, str]] = []
    for partition in partitions:
        for batch in reader.read(partition):
            rows += zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
    return rows


def _made_again(place: Place, name: str, entries: int, **settings: Any) -> Queue:
    backend = place.connect()
    assert Queue.delete(backend, name)
    queue = Queue.create(backend, name, capacity=100, slots_per_record=10, **settings)
    queue.enqueue_batch([f"new{n}" for n in range(entries)])
    return queue


def _old(place: Place, name: str, entries: int) -> Queue:
    queue = Queue.create(place.connect(), name, capacity=100, slots_per_record=10)
    queue.enqueue_batch([f"old{n}" for n in range(entries)])
    return queue


def _first_batch(
    place: Place, base: str, entries: int, fail_on_data_loss: bool
) -> tuple[str, Queue, Any, dict[str, Any], dict[str, Any]]:
    """A queue of ``entries``, a stream reader on it, and its first micro-batch's start and end."""
    name = place.name(base)
    queue = _old(place, name, entries)
    stream = _source(place, name, failOnDataLoss=fail_on_data_loss).streamReader(SCHEMA)
    start = stream.initialOffset()
    return name, queue, stream, start, stream.latestOffset(start, ReadAllAvailable())


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_micro_batch_planned_before_the_queue_was_made_again_never_reads_the_new_entries(
    place: Place, fail_on_data_loss: bool
) -> None:
    name, _, stream, start, end = _first_batch(place, "planned", 20, fail_on_data_loss)
    planned = stream.partitions(start, end)  # offsets 0..19 of the first creation
    _made_again(place, name, 30)  # before the tasks run
    if fail_on_data_loss:
        with pytest.raises(
            QueueError, match=r"deleted \(or deleted and created again\) after offsets 0 to 19"
        ):
            _rows(stream, planned)
        return
    assert _rows(stream, planned) == []  # skipped, with a warning: not the new entries as the old ones
    stream.commit(end)
    following = stream.latestOffset(end, ReadAllAvailable())
    assert _rows(stream, stream.partitions(end, following)) == [(n, f'"new{n}"') for n in range(30)]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_micro_batch_whose_end_was_logged_before_the_queue_was_made_again_reads_each_new_entry_once(
    place: Place, fail_on_data_loss: bool
) -> None:
    name, old, stream, start, end = _first_batch(place, "logged", 10, fail_on_data_loss)
    assert len(_rows(stream, stream.partitions(start, end))) == 10
    stream.commit(end)
    old.enqueue_batch(["old10", "old11"])
    start, end = end, stream.latestOffset(end, ReadAllAvailable())  # Spark logs the end: old offset 12
    _made_again(place, name, 5)  # then plans its partitions (or a driver restarts from the log)
    if fail_on_data_loss:
        with pytest.raises(QueueError, match="was deleted and created again since this stream's checkpoint"):
            stream.partitions(start, end)
        return
    delivered = _rows(stream, stream.partitions(start, end))
    for _ in range(2):
        stream.commit(end)
        start, end = end, stream.latestOffset(end, ReadAllAvailable())
        delivered += _rows(stream, stream.partitions(start, end))
    assert delivered == [(n, f'"new{n}"') for n in range(5)]  # from the new head, each once


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_batch_read_planned_before_the_queue_was_made_again_never_reads_the_new_entries(
    place: Place, fail_on_data_loss: bool
) -> None:
    name = place.name("batch")
    _old(place, name, 20)
    read = _source(place, name, failOnDataLoss=fail_on_data_loss).reader(SCHEMA)
    planned = read.partitions()
    _made_again(place, name, 30)
    if fail_on_data_loss:
        with pytest.raises(QueueError, match="after offsets 0 to 19 were planned"):
            _rows(read, planned)
    else:
        assert _rows(read, planned) == []
    assert Queue.delete(place.connect(), name)  # deleted outright: the same
    if fail_on_data_loss:
        with pytest.raises(QueueError, match="after offsets 0 to 19 were planned"):
            _rows(read, planned)
    else:
        assert _rows(read, planned) == []


def test_a_stream_closes_holes_of_a_queue_made_again_after_that_queues_own_timeout(place: Place) -> None:
    name = place.name("holes")
    first = Queue.create(place.connect(), name, capacity=40, slots_per_record=4, hole_timeout=0.5)
    first.enqueue_batch([0, 1, 2])
    first.appender.reserve(1, overwrite=False)  # offset 3: its producer died
    first.enqueue_batch([4])
    stream = _source(place, name, failOnDataLoss="false").streamReader(SCHEMA)
    start = stream.initialOffset()
    assert stream.latestOffset(start, ReadAllAvailable())["offset"] == 3  # waits on the hole (seen open now)

    def hole_after_sleep(hole_timeout: float) -> tuple[Queue, int, int]:
        """The queue made again with ``hole_timeout``, a reservation at 3, once the old timeout is past."""
        again = _made_again(place, name, 3, hole_timeout=hole_timeout)
        offset, now_ms = again.appender.reserve_stamped(1, overwrite=False)
        again.enqueue_batch(["new4"])
        begin = stream.initialOffset()
        stream.latestOffset(begin, ReadAllAvailable())  # the stream sees this creation's hole open
        time.sleep(0.7)  # past 0.5 s
        stream.latestOffset(begin, ReadAllAvailable())  # closes what is overdue
        return again, offset, now_ms

    def publish(queue: Queue, offset: int, now_ms: int) -> None:
        queue.appender.publish(offset, check_entries(["new3"], queue.max_entry_bytes, queue.encoding), now_ms)

    live = hole_after_sleep(60.0)  # its producer is live, and has a minute: not closed
    publish(*live)
    entry = live[0].get(live[1])
    assert entry is not None and entry.value == "new3"
    dead = hole_after_sleep(0.5)  # this creation's own timeout is past: closed, its publish refused
    with pytest.raises(ReservationClosedError):
        publish(*dead)


def test_a_checkpoint_past_the_end_of_the_queue_is_taken_for_another_creation(place: Place) -> None:
    """A checkpoint that names no creation (a queue of an older format) tells one only by its end."""
    name = place.name("past")
    _old(place, name, 2)
    stream = _source(place, name).streamReader(SCHEMA)
    with pytest.raises(QueueError, match="was deleted and created again since this stream's checkpoint"):
        stream.latestOffset({"offset": 7}, ReadAllAvailable())
    lenient = _source(place, name, failOnDataLoss="false").streamReader(SCHEMA)
    assert lenient.latestOffset({"offset": 7}, ReadAllAvailable())["offset"] == 2  # from the head: 0..1
    assert lenient.latestOffset({"offset": 2}, ReadAllAvailable())["offset"] == 2  # at the end: fine
