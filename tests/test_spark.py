"""The Spark connector on a local session: batch and streaming reads, writes, bad options."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from large_queue import Queue, QueueFullError, QueueNotFoundError, connect
from tests.fix_backends import Place

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: the queue names these tests use; on a shared server they are cleared before and after each test
QUEUE_NAMES = ("events", "native", "encoded", "out", "ring", "copy", "new", "missing", "typed", "in", "odd")


@pytest.fixture
def url(place: Place) -> Iterator[str]:
    """The store URL of this test's queues, on each store."""
    place.names.extend(QUEUE_NAMES)  # deleted after the test
    backend = place.connect()
    for name in QUEUE_NAMES:  # left by an interrupted earlier run against the same server
        Queue.delete(backend, name)
    yield place.url


def reader(spark: Any, url: str, queue: str, **options: object) -> Any:
    read = spark.read.format("large_queue").option("url", url).option("queue", queue)
    for key, value in options.items():
        read = read.option(key, str(value))
    return read


def test_batch_read_across_records_and_laps(spark: Any, url: str) -> None:
    queue = Queue.create(connect(url), "events", capacity=20, slots_per_record=3)  # 7 records of 3
    queue.enqueue_batch([{"n": n} for n in range(15)])
    queue.dequeue_batch(12)
    queue.enqueue_batch([{"n": n, "text": f"t{n}"} for n in range(15, 31)])  # wraps: offsets 12..30
    df = reader(spark, url, "events", minPartitions=3).load()
    assert df.rdd.getNumPartitions() >= 3
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(12, 31))
    assert [json.loads(r.value)["n"] for r in rows] == list(range(12, 31))
    assert {r.queue for r in rows} == {"events"} and all(r.enqueued_at is not None for r in rows)
    assert queue.info().size == 19  # reading never dequeues


def test_start_end_offsets_and_user_schema(spark: Any, url: str) -> None:
    queue = Queue.create(connect(url), "events", capacity=50, slots_per_record=4)
    queue.enqueue_batch([{"id": n, "name": f"n{n}", "tags": ["a", str(n)]} for n in range(30)])
    df = (
        reader(spark, url, "events", startingOffsets=5, endingOffsets=17, recordsPerPartition=1)
        .schema("offset long, id long, name string, tags array<string>, missing string")
        .load()
    )
    rows = df.orderBy("offset").collect()
    assert [(r.offset, r.id, r.name) for r in rows] == [(n, n, f"n{n}") for n in range(5, 17)]
    assert rows[0].tags == ["a", "5"] and rows[0].missing is None
    latest = reader(spark, url, "events", startingOffsets="latest").load()
    assert latest.count() == 0


def test_starting_timestamp_seeks_by_enqueue_time_in_batch_and_stream(
    spark: Any, url: str, tmp_path: Path
) -> None:
    queue = Queue.create(connect(url), "events", capacity=60, slots_per_record=4)
    queue.enqueue_batch(range(10))
    time.sleep(0.01)
    queue.enqueue_batch(range(10, 25))
    moment = queue.get(10).enqueued_at_ms  # type: ignore[union-attr]
    rows = reader(spark, url, "events", startingTimestamp=moment).load().orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(10, 25))
    assert reader(spark, url, "events", startingTimestamp=2**62).load().count() == 0
    batches: list[list[int]] = []
    _stream(spark, url, "events", tmp_path / "checkpoint", batches, startingTimestamp=moment)
    assert [o for b in batches for o in b] == list(range(10, 25))


def test_binary_value_format(spark: Any, url: str) -> None:
    import msgspec

    queue = Queue.create(connect(url), "events", capacity=10, slots_per_record=5)
    queue.enqueue_batch([{"b": b"\x00\xff"}, [1, 2.5, None]])
    rows = reader(spark, url, "events", valueFormat="binary").load().orderBy("offset").collect()
    assert [msgspec.msgpack.decode(r.value) for r in rows] == [{"b": b"\x00\xff"}, [1, 2.5, None]]


EVENTS = [
    {"id": 1, "text": "ünïcode, with a\nnewline", "tags": ["a", "b"], "score": 0.1},
    [1, 2.5, None, True],
    "just a string",
    -(2**63),
    {"nested": {"deeper": [{}, []]}},
]


def test_json_encoded_queue_reads_as_a_native_one(spark: Any, url: str) -> None:
    store = connect(url)
    native = Queue.create(store, "native", capacity=12, slots_per_record=2)
    encoded = Queue.create(store, "encoded", capacity=12, slots_per_record=2, encoding="json")
    for queue in (native, encoded):
        queue.enqueue_batch(EVENTS * 2)
        queue.dequeue_batch(3)
        queue.enqueue_batch(EVENTS)  # wraps: offsets 3..14

    def read(name: str, **options: object) -> list[tuple[int, Any]]:
        rows = reader(spark, url, name, minPartitions=2, **options).load().orderBy("offset").collect()
        return [(r.offset, r.value) for r in rows]

    assert read("encoded") == read("native")
    assert [json.loads(value) for _, value in read("encoded")] == (EVENTS * 3)[3:]
    assert read("encoded", valueFormat="binary") == read("native", valueFormat="binary")
    typed = "offset long, id long, tags array<string>"
    assert (
        reader(spark, url, "encoded").schema(typed).load().orderBy("offset").collect()
        == reader(spark, url, "native").schema(typed).load().orderBy("offset").collect()
    )


@pytest.mark.parametrize("value_format", ["json", "binary"])
def test_what_a_read_gives_a_write_takes_back_unchanged(spark: Any, url: str, value_format: str) -> None:
    Queue.create(connect(url), "events", capacity=12, slots_per_record=3).enqueue_batch(EVENTS)
    read = reader(spark, url, "events", valueFormat=value_format).load().select("value")
    read.write.format("large_queue").option("url", url).option("queue", "copy").option(
        "createIfMissing", "true"
    ).option("capacity", 12).mode("append").save()  # no valueFormat: the column's type says
    copied = [e.value for e in Queue.open(connect(url), "copy").dequeue_batch(12)]
    in_order = functools.partial(json.dumps, sort_keys=True)  # dicts come back with their keys in order
    assert sorted(map(in_order, copied)) == sorted(map(in_order, EVENTS))


def test_writes_create_a_json_encoded_queue_when_asked(spark: Any, url: str) -> None:
    frame = spark.createDataFrame([(json.dumps(e),) for e in EVENTS], "value string")
    (
        frame.coalesce(1)
        .write.format("large_queue")
        .option("url", url)
        .option("queue", "out")
        .option("createIfMissing", "true")
        .option("capacity", "10")
        .option("entryEncoding", "JSON")
        .option("valueFormat", "json")  # the column holds JSON text to parse, not strings to keep
        .mode("append")
        .save()
    )
    queue = Queue.open(connect(url), "out")
    assert queue.encoding == "json"
    assert [e.value for e in queue.dequeue_batch(10)] == EVENTS


def test_offsets_gone_before_planning(spark: Any, url: str) -> None:
    queue = Queue.create(connect(url), "ring", capacity=6, slots_per_record=3)
    queue.enqueue_batch(range(6))
    queue.enqueue_batch([100, 101], overwrite_if_full=True)  # head 2: offsets 0 and 1 are gone
    with pytest.raises(Exception, match=r"offsets 0 to 1 of queue 'ring' are no longer in the queue"):
        reader(spark, url, "ring", startingOffsets=0).load().collect()
    lenient = reader(spark, url, "ring", startingOffsets=0, failOnDataLoss="false").load()
    assert sorted(r.offset for r in lenient.collect()) == list(range(2, 8))


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_entries_overwritten_between_snapshot_and_read(spark: Any, url: str, fail_on_data_loss: str) -> None:
    from pyspark.sql.types import StructType

    from large_queue.spark import LargeQueueDataSource

    queue = Queue.create(connect(url), "ring", capacity=6, slots_per_record=3)
    queue.enqueue_batch(range(6))
    source = LargeQueueDataSource({"url": url, "queue": "ring", "failOnDataLoss": fail_on_data_loss})
    planned = source.reader(StructType.fromDDL(source.schema()))  # the driver's snapshot: [0, 6)
    partitions = planned.partitions()
    queue.enqueue_batch([100, 101], overwrite_if_full=True)  # then offsets 0 and 1 are overwritten
    if fail_on_data_loss == "true":
        with pytest.raises(Exception, match=r"offsets 0 to 1 of queue 'ring' are no longer in the queue"):
            [batch for p in partitions for batch in planned.read(p)]
    else:
        batches = [batch for p in partitions for batch in planned.read(p)]
        assert sorted(o for b in batches for o in b.column("offset").to_pylist()) == [2, 3, 4, 5]


def test_a_spanning_batch_overwritten_between_snapshot_and_read_is_lost_not_dropped(
    spark: Any, url: str
) -> None:
    from pyspark.sql.types import StructType

    from large_queue.spark import LargeQueueDataSource

    queue = Queue.create(connect(url), "ring", capacity=6, slots_per_record=3, appends="reserve")
    queue.enqueue("a")
    queue.enqueue_batch(range(1, 5))  # offsets 1..4 span records 0 and 1; offset 4 decides the batch
    queue.enqueue(5)
    options = {"url": url, "queue": "ring", "failOnDataLoss": "true", "minPartitions": "2"}
    source = LargeQueueDataSource(options)
    planned = source.reader(StructType.fromDDL(source.schema()))  # the driver's snapshot: [0, 6)
    partitions = planned.partitions()
    assert [(p.start, p.stop) for p in partitions] == [(0, 3), (3, 6)]
    queue.appender.reserve(3, overwrite=True)  # the next lap's offsets 6..8 (record 0): not published yet
    queue.enqueue_batch([9, 10], overwrite_if_full=True)  # ... and 9, 10 overwrite offsets 3 and 4
    # Record 0 still holds offsets 1 and 2, but their batch has left the queue with offset 4: whether
    # it was published or closed can no longer be told, so they are lost, not silently skipped.
    with pytest.raises(Exception, match=r"offsets 1 to 2 of queue 'ring' are no longer in the queue"):
        list(planned.read(partitions[0]))
    settled = queue.prefix.read(0, 6)
    assert [e[0] for e in settled.entries] == [0, 5]
    assert settled.overwritten == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": "missing"}, "queue 'missing' does not exist"),
        ({"queue": "events", "startingOffsets": "soon"}, "must be 'earliest', 'latest' or an offset"),
        ({"queue": "events", "endingOffsets": 99}, "beyond the tail"),
        (
            {"queue": "events", "startingOffsets": 3, "endingOffsets": 2},
            "startingOffsets 3 is after endingOffsets",
        ),
        (
            {"queue": "events", "startingTimestamp": 2**62, "endingOffsets": 2},
            rf"startingTimestamp {2**62} \(offset 4\) is after endingOffsets 2",
        ),
        ({"queue": "events", "valueFormat": "xml"}, "valueFormat='xml' must be one of json, binary"),
        ({"queue": "events", "startingTimestamp": "noon"}, "startingTimestamp='noon'"),
        ({"queue": "events", "startingTimestamp": 5, "startingOffsets": 0}, "both say where to start"),
        ({"queue": "events", "minPartitions": 0}, "minPartitions=0 must be at least 1"),
        (
            {"queue": "events", "entryEncoding": "yaml"},
            "entryEncoding='yaml' must be one of native, msgpack, json",
        ),
        ({}, "a queue name is required"),
        ({"queue": "events", "capacity": 5}, r"option\(s\) capacity do not apply to a batch read"),
        ({"queue": "events", "maxOffsetsPerTrigger": 5}, "do not apply to a batch read"),
        ({"queue": "events", "startingOffsets": ""}, "must be 'earliest', 'latest' or an offset"),
        (
            {"quue": "events"},
            r"unknown option\(s\) 'quue'; the large_queue source takes url, namespace, queue",
        ),
    ],
)
def test_bad_options_fail_at_planning(spark: Any, url: str, options: dict[str, object], message: str) -> None:
    Queue.create(connect(url), "events", capacity=10, slots_per_record=5).enqueue_batch(range(4))
    read = spark.read.format("large_queue").option("url", url)
    for key, value in options.items():
        read = read.option(key, str(value))
    with pytest.raises(Exception, match=message):
        read.load().collect()


def _stream(
    spark: Any, url: str, queue: str, checkpoint: Path, batches: list[list[int]], **options: object
) -> None:
    stream = spark.readStream.format("large_queue").option("url", url).option("queue", queue)
    for key, value in options.items():
        stream = stream.option(key, str(value))

    def collect(frame: Any, batch_id: int) -> None:
        batches.append(sorted(r.offset for r in frame.select("offset").collect()))

    query = (
        stream.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    if query.exception():
        raise RuntimeError(str(query.exception()))


def test_streaming_micro_batches_and_restart_from_checkpoint(spark: Any, url: str, tmp_path: Path) -> None:
    queue = Queue.create(connect(url), "events", capacity=100, slots_per_record=7)
    queue.enqueue_batch(range(50))
    batches: list[list[int]] = []
    _stream(spark, url, "events", tmp_path / "checkpoint", batches, maxOffsetsPerTrigger=20)
    assert [b for b in batches if b] == [list(range(0, 20)), list(range(20, 40)), list(range(40, 50))]
    queue.enqueue_batch(range(50, 65))
    _stream(spark, url, "events", tmp_path / "checkpoint", batches, maxOffsetsPerTrigger=20)
    delivered = [o for b in batches for o in b]
    assert delivered == list(range(65)), "an offset was skipped or repeated across the restart"


def test_a_stream_read_as_a_group_commits_its_cursor_and_holds_back_the_head(
    spark: Any, url: str, tmp_path: Path
) -> None:
    queue = Queue.create(connect(url), "events", capacity=20, slots_per_record=5)
    queue.create_group("audit")  # a group that acks nothing holds the head at 0
    queue.enqueue_batch(range(12))
    batches: list[list[int]] = []
    _stream(spark, url, "events", tmp_path / "checkpoint", batches, group="spark", maxOffsetsPerTrigger=5)
    assert [o for b in batches for o in b] == list(range(12))
    # Spark tells a source that a micro-batch committed when it plans the next one: the
    # last batch of a run ([10, 12) here) is committed to the group by the next run.
    assert queue.group("spark").acked_offset == 10
    assert queue.info().head_offset == 0  # "audit" has not acked
    queue.delete_group("audit")
    queue.enqueue_batch(range(12, 15))
    _stream(spark, url, "events", tmp_path / "checkpoint", batches, group="spark")
    assert [o for b in batches for o in b] == list(range(15))  # from the checkpoint, nothing twice
    assert queue.group("spark").acked_offset == 12
    assert queue.info().head_offset == 12  # the only group now: the head follows its cursor
    with pytest.raises(Exception, match="for streaming reads"):
        reader(spark, url, "events").option("group", "spark").load().collect()


def test_a_group_streams_batch_planned_in_a_deleted_creation_acks_nothing_of_the_new_one(
    spark: Any, url: str, tmp_path: Path
) -> None:
    Queue.create(connect(url), "events", capacity=20, slots_per_record=5).enqueue_batch(range(8))
    batches: list[list[int]] = []
    options = {"group": "g", "failOnDataLoss": "false"}
    _stream(spark, url, "events", tmp_path / "c", batches, maxOffsetsPerTrigger=4, **options)
    assert [o for b in batches for o in b] == list(range(8))  # [4, 8) is not committed yet
    Queue.delete(connect(url), "events")
    queue = Queue.create(connect(url), "events", capacity=20, slots_per_record=5)
    queue.enqueue_batch(range(100, 112))
    batches.clear()
    _stream(spark, url, "events", tmp_path / "c", batches, **options)  # commits [4, 8) of the old one first
    assert [o for b in batches for o in b] == list(range(12))  # the new creation from its head, all of it
    assert queue.group("g").acked_offset == 10  # its own micro-batches only (each half the capacity)


def test_a_group_stream_over_a_queue_of_one_entry_is_refused_at_planning(
    spark: Any, url: str, tmp_path: Path
) -> None:
    Queue.create(connect(url), "events", capacity=1, slots_per_record=1)
    with pytest.raises(Exception, match="needs a queue of capacity 2 or more"):
        _stream(spark, url, "events", tmp_path / "c", [], group="g")


def test_a_group_stream_over_a_queue_no_larger_than_a_micro_batch_keeps_its_producer_going(
    spark: Any, url: str, tmp_path: Path
) -> None:
    queue = Queue.create(connect(url), "events", capacity=6, slots_per_record=3)
    queue.enqueue_batch(range(6))  # full before the stream starts
    seen: list[int] = []
    stream = spark.readStream.format("large_queue").option("url", url).option("queue", "events")
    query = (
        stream.option("group", "g")
        .load()
        .writeStream.foreachBatch(lambda frame, _: seen.extend(r.offset for r in frame.collect()))
        .option("checkpointLocation", str(tmp_path / "c"))
        .start()
    )
    try:
        produced, deadline = 6, time.monotonic() + 90
        while produced < 20 and time.monotonic() < deadline:  # room comes only as the stream commits
            with contextlib.suppress(QueueFullError):
                queue.enqueue(produced)
                produced += 1
            time.sleep(0.05)
        while len(seen) < 20 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        query.stop()
    assert produced == 20 and sorted(seen) == list(range(20)), (produced, seen)


def test_reads_see_only_the_published_prefix_of_lock_free_appends(spark: Any, url: str) -> None:
    queue = Queue.create(connect(url), "events", capacity=40, slots_per_record=3, appends="reserve")
    queue.enqueue_batch(range(2))
    closed = queue.appender.reserve(1, overwrite=False)
    queue.appender.close(closed, closed + 1)  # a reader closed it after the hole timeout: never visible
    queue.enqueue_batch(range(3, 10))  # offsets 3..9: spans records, visible whole
    queue.appender.reserve(1, overwrite=False)  # offset 10: not published yet
    queue.enqueue_batch(range(11, 13))  # published, but past the hole
    rows = reader(spark, url, "events").load().orderBy("offset").collect()
    assert [r.offset for r in rows] == [0, 1, *range(3, 10)]
    assert [json.loads(r.value) for r in rows] == [0, 1, *range(3, 10)]


def test_a_stream_waits_on_a_hole_and_resumes_after_it_is_closed(
    spark: Any, url: str, tmp_path: Path
) -> None:
    queue = Queue.create(
        connect(url), "events", capacity=40, slots_per_record=4, appends="reserve", hole_timeout=1.0
    )
    queue.enqueue_batch(range(3))
    hole = queue.appender.reserve(1, overwrite=False)  # its producer died
    queue.enqueue_batch(range(4, 8))
    batches: list[list[int]] = []

    def collect(frame: Any, batch_id: int) -> None:
        batches.append(sorted(r.offset for r in frame.select("offset").collect()))

    query = (
        spark.readStream.format("large_queue")
        .option("url", url)
        .option("queue", "events")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="0.2 seconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while len([o for b in batches for o in b]) < 7 and time.monotonic() < deadline:
            if query.exception():
                raise RuntimeError(str(query.exception()))
            time.sleep(0.1)
    finally:
        query.stop()
    delivered = [o for b in batches for o in b]
    assert delivered == [0, 1, 2, 4, 5, 6, 7], "a gap or a repeat after the hole"
    assert next(b for b in batches if b) == [0, 1, 2], "the stream read past an unpublished offset"
    assert queue.get(hole) is None


def test_streaming_data_loss_both_ways(spark: Any, url: str, tmp_path: Path) -> None:
    queue = Queue.create(connect(url), "ring", capacity=6, slots_per_record=3)
    queue.enqueue_batch(range(4))
    batches: list[list[int]] = []
    _stream(spark, url, "ring", tmp_path / "strict", batches)
    _stream(spark, url, "ring", tmp_path / "lenient", batches, failOnDataLoss="false")
    queue.enqueue_batch(range(5), overwrite_if_full=True)
    queue.enqueue_batch(range(5), overwrite_if_full=True)  # tail 14, head 8: offsets 4..7 are gone
    with pytest.raises(Exception, match=r"offsets 4 to 7 of queue 'ring' are no longer in the queue"):
        _stream(spark, url, "ring", tmp_path / "strict", batches)
    batches.clear()
    _stream(spark, url, "ring", tmp_path / "lenient", batches, failOnDataLoss="false")
    assert [b for b in batches if b] == [list(range(8, 14))]  # resumed at the head, no empty batches


def test_written_rows_keep_what_their_spark_types_mean(spark: Any, url: str) -> None:
    import datetime
    import decimal

    utc = datetime.timezone.utc
    instant = datetime.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=utc)
    wall = datetime.datetime(2026, 7, 8, 9, 10, 11)
    frame = spark.createDataFrame(
        [(instant, wall, datetime.date(2026, 2, 3), decimal.Decimal("1.50"), {"at": instant}, [instant])],
        "at timestamp, wall timestamp_ntz, day date, price decimal(5,2),"
        " inner struct<at: timestamp>, many array<timestamp>",
    )
    frame.write.format("large_queue").option("url", url).option("queue", "typed").option(
        "createIfMissing", "true"
    ).option("capacity", 10).mode("append").save()
    at = "2026-01-02T03:04:05.006000+00:00"  # an instant says it is one, whatever the worker's zone
    assert Queue.open(connect(url), "typed").dequeue().value == {  # type: ignore[union-attr]
        "at": at,
        "wall": "2026-07-08T09:10:11",
        "day": "2026-02-03",
        "price": "1.50",
        "inner": {"at": at},
        "many": [at],
    }
    numbers = spark.createDataFrame([(7,), (None,)], "value long")
    numbers.write.format("large_queue").option("url", url).option("queue", "typed").option(
        "valueFormat", "text"
    ).mode("append").save()  # text keeps strings as they are; a value of another type is the entry
    written = [e.value for e in Queue.open(connect(url), "typed").dequeue_batch(5)]
    assert sorted(written, key=str) == [7, None]


def test_batch_and_streaming_writes_round_trip(spark: Any, url: str, tmp_path: Path) -> None:
    frame = spark.createDataFrame([(1, "a", [1, 2]), (2, "b", [])], "k long, v string, xs array<long>")
    (
        frame.write.format("large_queue")
        .option("url", url)
        .option("queue", "out")
        .option("createIfMissing", "true")
        .option("capacity", "40")
        .option("batchSize", "1")
        .option("idempotent", "true")  # each batch of rows leaves a receipt under its task's txn id
        .mode("append")
        .save()
    )
    out = Queue.open(connect(url), "out")
    metadata = out.backend.get(out.keys.metadata)
    assert metadata is not None
    assert [t.split(":")[0] for t in metadata.bins["receipts"]] == ["spark", "spark"]
    back = reader(spark, url, "out").schema("k long, v string, xs array<long>").load().orderBy("k").collect()
    assert [(r.k, r.v, r.xs) for r in back] == [(1, "a", [1, 2]), (2, "b", [])]
    values = spark.createDataFrame([("x",), ("y",)], "value string")
    values.write.format("large_queue").option("url", url).option("queue", "out").option(
        "valueFormat", "text"
    ).mode("append").save()
    assert sorted(
        json.loads(r.value) for r in reader(spark, url, "out", startingOffsets=2).load().collect()
    ) == ["x", "y"]
    copy = (
        spark.readStream.format("large_queue")
        .option("url", url)
        .option("queue", "out")
        .load()
        .selectExpr("value")
        .writeStream.format("large_queue")
        .option("url", url)
        .option("queue", "copy")
        .option("valueFormat", "json")
        .option("createIfMissing", "true")
        .option("capacity", "40")
        .option("checkpointLocation", str(tmp_path / "sink"))
        .trigger(availableNow=True)
        .start()
    )
    copy.awaitTermination(120)
    copied = [e.value for e in Queue.open(connect(url), "copy").dequeue_batch(40)]
    originals = [json.loads(r.value) for r in reader(spark, url, "out").load().orderBy("offset").collect()]
    assert sorted(map(json.dumps, copied)) == sorted(map(json.dumps, originals)), (
        "the copy lost or repeated entries"
    )
    with pytest.raises(Exception, match="needs option 'capacity'"):
        frame.write.format("large_queue").option("url", url).option("queue", "new").option(
            "createIfMissing", "true"
        ).mode("append").save()
    with pytest.raises(Exception, match="append"):
        frame.write.format("large_queue").option("url", url).option("queue", "out").mode("overwrite").save()


@pytest.mark.parametrize("idempotent", ["true", "false"])
def test_a_micro_batch_run_again_from_its_checkpoint_is_enqueued_once_when_idempotent(
    spark: Any, url: str, tmp_path: Path, idempotent: str
) -> None:
    Queue.create(connect(url), "in", capacity=40).enqueue_batch(range(12))

    def run() -> None:
        query = (
            spark.readStream.format("large_queue")
            .option("url", url)
            .option("queue", "in")
            .load()
            .selectExpr("value")
            .writeStream.format("large_queue")
            .option("url", url)
            .option("queue", "out")
            .option("createIfMissing", "true")
            .option("capacity", "40")
            .option("batchSize", "5")  # three batches of rows per task: each has its own txn id
            .option("idempotent", idempotent)
            .option("checkpointLocation", str(tmp_path / "sink"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    # The query died after its write and before micro-batch 0 reached the commit log: a restart
    # from the checkpoint runs micro-batch 0 again, over the same offsets of "in".
    for name in ("0", ".0.crc"):
        (tmp_path / "sink" / "commits" / name).unlink(missing_ok=True)
    run()
    out = Queue.open(connect(url), "out")
    written = sorted(e.value for e in out.dequeue_batch(40))  # type: ignore[type-var]
    if idempotent == "true":
        assert written == list(range(12))
    else:  # at least once: the batch run again is enqueued again
        assert written == sorted([*range(12), *range(12)])


def test_spark_bench_reads_every_encoding_as_the_same_rows(spark: Any, place: Place) -> None:
    from large_queue.spark import _bench

    lines: list[str] = []
    figures = _bench.run(place.url, entries=3000, repeats=1, pause=0, log=lines.append)
    labels = ("queue", "queue native", "queue json", "parquet", "floor")
    assert all(figures[f"{label} rows/s"] > 0 for label in labels)
    for label in (
        "queue",
        "queue native",
        "queue json",
        "floor",
    ):  # each ratio is that read's rate over Parquet's
        assert figures[f"{label} ratio"] == pytest.approx(
            figures[f"{label} rows/s"] / figures["parquet rows/s"]
        )
    printed = "\n".join(lines)
    assert all(f"queue ({kind} entries) -> Spark" in printed for kind in ("msgpack", "native", "JSON")), (
        printed
    )


def test_a_mistyped_embedded_store_path_is_an_error_and_makes_no_file(spark: Any, tmp_path: Path) -> None:
    url = f"embedded://{tmp_path}/mistyped/store.db"
    with pytest.raises(Exception, match="there is no store file at"):
        reader(spark, url, "events").load().count()
    with pytest.raises(Exception, match="there is no store file at"):
        spark.range(3).write.format("large_queue").option("url", url).option("queue", "events").mode(
            "append"
        ).save()
    assert not (tmp_path / "mistyped").exists()
    spark.range(3).write.format("large_queue").option("url", url).option("queue", "events").option(
        "createIfMissing", "true"
    ).option("capacity", 10).mode("append").save()  # asked to create the queue: the store too
    assert Queue.open(connect(url), "events").info().size == 3


def test_registering_names_a_worker_python_that_cannot_import_the_library(tmp_path: Path) -> None:
    from large_queue import InvalidArgumentError
    from large_queue.spark import register

    python = tmp_path / "python3"  # a Python without this library, as a bare python3 on PATH would be
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    context = SimpleNamespace(pythonExec=str(python), master="local[2]")
    session = SimpleNamespace(sparkContext=context, dataSource=SimpleNamespace(register=lambda source: None))
    with pytest.raises(
        InvalidArgumentError, match=r"cannot import large_queue: start the session with PYSPARK_PYTHON="
    ):
        register(session)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("offset string, n long", "column 'offset' is bigint"),
        ("offset long, value struct<n:long>", "column 'value' is string"),
        ("queue int, offset long", "column 'queue' is string"),
        ("OFFSET long, n long", "the fixed column is named 'offset'"),
    ],
)
def test_fixed_columns_of_the_wrong_type_fail_at_planning(
    spark: Any, url: str, schema: str, message: str
) -> None:
    Queue.create(connect(url), "events", capacity=10, slots_per_record=5).enqueue_batch([{"n": 1}])
    with pytest.raises(Exception, match=message):
        reader(spark, url, "events").schema(schema).load().collect()


def test_a_stream_refuses_batch_options_and_a_start_past_the_end(
    spark: Any, url: str, tmp_path: Path
) -> None:
    Queue.create(connect(url), "events", capacity=40, slots_per_record=5).enqueue_batch(range(30))
    batches: list[list[int]] = []
    with pytest.raises(Exception, match=r"option\(s\) endingOffsets do not apply to a streaming read"):
        _stream(spark, url, "events", tmp_path / "a", batches, endingOffsets=10)
    with pytest.raises(Exception, match="startingOffsets 60 is past the end 30"):
        _stream(spark, url, "events", tmp_path / "b", batches, startingOffsets=60)
    with pytest.raises(Exception, match="startingOffsets and startingTimestamp do not apply"):
        _stream(spark, url, "events", tmp_path / "c", batches, group="g", startingOffsets="latest")
    assert batches == []
    frame = spark.createDataFrame([(json.dumps({"n": 1}),)], "value string")
    write = frame.write.format("large_queue").option("url", url).option("queue", "events")
    with pytest.raises(Exception, match=r"option\(s\) startingOffsets do not apply to a write"):
        write.option("startingOffsets", "0").mode("append").save()


def test_a_stream_whose_queue_was_created_again_reports_it_and_skips_nothing(
    spark: Any, url: str, tmp_path: Path
) -> None:
    Queue.create(connect(url), "events", capacity=100, slots_per_record=7).enqueue_batch(range(10))
    batches: list[list[int]] = []
    _stream(spark, url, "events", tmp_path / "strict", batches)
    _stream(spark, url, "events", tmp_path / "lenient", batches, failOnDataLoss="false")
    Queue.delete(connect(url), "events")
    Queue.create(connect(url), "events", capacity=100, slots_per_record=7).enqueue_batch(range(15))
    with pytest.raises(Exception, match="was deleted and created again since this stream's checkpoint"):
        _stream(spark, url, "events", tmp_path / "strict", batches)
    batches.clear()
    _stream(spark, url, "events", tmp_path / "lenient", batches, failOnDataLoss="false")
    assert [o for b in batches for o in b] == list(
        range(15)
    )  # the new queue from its head: 0..14, not 10..14


def test_floats_json_has_no_number_for_read_as_sparks_json_tokens_and_are_written_back(
    spark: Any, url: str
) -> None:
    nan, inf = float("nan"), float("inf")
    Queue.create(connect(url), "events", capacity=10).enqueue_batch([{"x": nan, "y": [inf, -inf, None]}])
    read = reader(spark, url, "events").load()
    assert read.collect()[0].value == '{"x":NaN,"y":[Infinity,-Infinity,null]}'
    parsed = read.selectExpr("from_json(value, 'x double, y array<double>') as v").collect()[0].v
    assert math.isnan(parsed.x) and parsed.y == [inf, -inf, None]  # Spark's own JSON reads them
    read.select("value").write.format("large_queue").option("url", url).option("queue", "copy").option(
        "createIfMissing", "true"
    ).option("capacity", 10).mode("append").save()
    copied = Queue.open(connect(url), "copy").dequeue().value  # type: ignore[union-attr]
    assert math.isnan(copied["x"]) and copied["y"] == [inf, -inf, None]


def test_a_float_with_a_fraction_in_an_integer_column_of_a_schema_is_refused(spark: Any, url: str) -> None:
    queue = Queue.create(connect(url), "events", capacity=10)
    queue.enqueue_batch([{"price": 10.0, "sizes": [1, 2]}, {"price": 2.99, "sizes": [3]}])
    with pytest.raises(Exception, match=r"offset 1 .*'price' \(int64\) would lose the fraction of 2.99"):
        reader(spark, url, "events").schema("price long").load().collect()
    rows = (
        reader(spark, url, "events", endingOffsets=1).schema("price long, sizes array<int>").load().collect()
    )
    assert [(r.price, r.sizes) for r in rows] == [(10, [1, 2])]  # a whole float fits
    queue.enqueue({"price": 1, "sizes": [0.5]})
    with pytest.raises(Exception, match=r"'sizes'.*would lose the fraction"):
        reader(spark, url, "events", startingOffsets=2).schema("sizes array<int>").load().collect()


def test_an_entry_that_does_not_fit_the_schema_is_named_by_its_offset(spark: Any, url: str) -> None:
    queue = Queue.create(connect(url), "events", capacity=10)
    queue.enqueue_batch([{"n": 1}, {"n": 2}, {"n": "oops"}, {"n": 4}])
    with pytest.raises(
        Exception, match=r"the entry at offset 2 of queue 'events' does not fit the given schema"
    ):
        reader(spark, url, "events").schema("n long").load().collect()


def test_a_json_value_with_an_integer_past_64_bits_is_refused_not_made_a_float(spark: Any, url: str) -> None:
    Queue.create(connect(url), "out", capacity=10)
    for text, said in [(f'{{"n": {2**64}}}', "64-bit"), ("[1e400]", "out of the range of a double")]:
        with pytest.raises(Exception, match=said):
            spark.createDataFrame([(text,)], "value string").write.format("large_queue").option(
                "url", url
            ).option("queue", "out").mode("append").save()
    assert Queue.open(connect(url), "out").info().size == 0


@pytest.mark.parametrize(
    ("columns", "named"),
    [
        ("select 1 as id, interval 3 days as ttl", "column ttl is of type interval day"),
        ("select map(named_struct('a', 1), 'x') as m", r"column m \(its keys\) is of type struct<a:int>"),
        ("select named_struct('at', map(1.5D, 'x')) as s", r"column s.at \(its keys\) is of type double"),
        ("select 1 as id, array(interval 1 day) as value", r"column value\[\] is of type interval day"),
    ],
)
def test_a_column_no_entry_can_hold_is_refused_before_anything_is_written(
    spark: Any, url: str, columns: str, named: str
) -> None:
    queue = Queue.create(connect(url), "out", capacity=10)
    with pytest.raises(Exception, match=named):
        spark.sql(columns).write.format("large_queue").option("url", url).option("queue", "out").mode(
            "append"
        ).save()
    assert queue.info().size == 0


@pytest.mark.parametrize(
    ("columns", "named"),
    [
        ("select id, map(cast(id as int), 'x') as m from range(20)", r"column m \(its keys\) is of type int"),
        (
            "select id, named_struct('raw', unhex('00ff')) as s from range(20)",
            "column s.raw is of type binary",
        ),
    ],
)
@pytest.mark.parametrize("made", ["before", "by the write"])
def test_a_column_a_json_queue_cannot_hold_is_refused_before_anything_is_written(
    spark: Any, url: str, columns: str, named: str, made: str
) -> None:
    write = spark.sql(columns).write.format("large_queue").option("url", url).option("queue", "out")
    if made == "before":
        Queue.create(connect(url), "out", capacity=100, encoding="json")
    else:
        write = (
            write.option("createIfMissing", "true").option("capacity", 100).option("entryEncoding", "json")
        )
    with pytest.raises(Exception, match=named + ".*JSON-encoded queue"):
        write.mode("append").save()
    with pytest.raises(QueueNotFoundError) if made == "by the write" else contextlib.nullcontext():
        assert Queue.open(connect(url), "out").info().size == 0  # nothing written (or created)


def test_creation_options_apply_only_when_a_queue_is_created_and_must_match_the_queue(
    spark: Any, url: str
) -> None:
    Queue.create(connect(url), "out", capacity=10, slots_per_record=5)
    frame = spark.createDataFrame([(1,)], "n long")

    def write(**options: object) -> None:
        writer = frame.write.format("large_queue").option("url", url).option("queue", "out")
        for key, value in options.items():
            writer = writer.option(key, str(value))
        writer.mode("append").save()

    with pytest.raises(
        Exception, match=r"option\(s\) capacity do not apply to a write without createIfMissing"
    ):
        write(capacity=5)
    with pytest.raises(Exception, match=r"exists with other settings.*capacity=5 \(the queue has 10\)"):
        write(createIfMissing="true", capacity=5)
    with pytest.raises(Exception, match=r"entryEncoding=json \(the queue has msgpack\)"):
        write(createIfMissing="true", capacity=10, entryEncoding="json")
    write(createIfMissing="true", capacity=10, slotsPerRecord=5)  # as it is: written
    assert Queue.open(connect(url), "out").info().size == 1


def test_the_path_of_load_and_save_names_the_queue(spark: Any, url: str) -> None:
    Queue.create(connect(url), "events", capacity=10).enqueue_batch(["a", "b"])
    read = spark.read.format("large_queue").option("url", url).load("events")
    assert [r.value for r in read.orderBy("offset").collect()] == ['"a"', '"b"']
    read.select("value").write.format("large_queue").option("url", url).option(
        "createIfMissing", "true"
    ).option("capacity", 10).mode("append").save("copy")
    assert [e.value for e in Queue.open(connect(url), "copy").dequeue_batch(5)] == ["a", "b"]
    with pytest.raises(Exception, match="name two queues"):
        spark.read.format("large_queue").option("url", url).option("queue", "events").load("copy").collect()
