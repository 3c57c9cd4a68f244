"""``large-queue bench --spark``: rows/s reading a queue into Spark, against Parquet.

Three reads of the same rows run in one local session, each ending in
``write.format("noop")`` so the figures compare sources, not sinks:

- the queue, through the ``large_queue`` data source;
- a Parquet file holding exactly the rows the queue read produced;
- Spark's floor for any Python data source: a source whose tasks yield the
  same rows as ready-made Arrow batches, doing no work of their own. The gap
  between this line and Parquet belongs to Spark's Python data source path
  (task start-up, Arrow transfer to the JVM); the gap between the queue and
  this line is the connector's own work.

Each read runs ``repeats`` times, the three interleaved so that a slow moment
of the machine hits all of them; the best run of each counts.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from large_queue.backends import connect
from large_queue.queue import Queue
from large_queue.spark._source import JSON_SCHEMA


def _timed_noop(frame: Any) -> float:
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


_TABLES: dict[str, Any] = {}


class _FloorReader(DataSourceReader):
    def __init__(self, path: str, partitions: int, schema: StructType) -> None:
        self.path = path
        self.count = partitions
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(index) for index in range(self.count)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow.parquet as pq

        if self.path not in _TABLES:  # once per worker process; the best run reads from memory
            arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
            _TABLES[self.path] = pq.read_table(self.path).cast(arrow_schema).combine_chunks()
        table = _TABLES[self.path]
        share = -(-table.num_rows // self.count)
        yield from table.slice(partition.value * share, share).to_batches(max_chunksize=10_000)


class FloorSource(DataSource):
    """Spark's floor for a Python data source: the given Parquet rows as prebuilt Arrow batches."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "large_queue_bench_floor"

    def schema(self) -> str:
        """The queue source's columns."""
        return JSON_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """Options ``path`` (a Parquet file) and ``partitions``."""
        return _FloorReader(self.options["path"], int(self.options["partitions"]), schema)


def run(
    url: str | None,
    *,
    entries: int = 1_000_000,
    partitions: int | None = None,
    repeats: int = 3,
    log: Any = print,
) -> dict[str, float]:
    """Fill a queue with ``entries`` events, then time the three reads (best of ``repeats``).

    ``partitions`` defaults to the session's parallelism (one task per core),
    which is how a job reading a whole queue should set ``minPartitions``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from large_queue.spark import register

    with tempfile.TemporaryDirectory() as directory:
        url = url or f"embedded://{directory}/bench.db"
        store = connect(url)
        name = "bench-spark"
        Queue.delete(store, name)
        queue = Queue.create(store, name, capacity=entries, slots_per_record=100)
        started = time.perf_counter()
        for first in range(0, entries, 1000):
            queue.enqueue_batch(
                [
                    {"id": n, "user": n % 977, "kind": "click"}
                    for n in range(first, min(first + 1000, entries))
                ]
            )
        log(f"enqueued {entries:,} entries in {time.perf_counter() - started:.1f} s")
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        partitions = partitions or spark.sparkContext.defaultParallelism
        source = (
            spark.read.format("large_queue")
            .option("url", url)
            .option("queue", name)
            .option("minPartitions", partitions)
            .load()
        )
        parquet_path = os.path.join(directory, "events.parquet")
        source.write.parquet(parquet_path)
        parquet = spark.read.parquet(parquet_path)
        assert parquet.count() == entries
        spark.dataSource.register(FloorSource)
        floor = (
            spark.read.format("large_queue_bench_floor")
            .option("path", parquet_path)
            .option("partitions", partitions)
            .load()
        )
        frames = {"queue": source, "parquet": parquet, "floor": floor}
        best = {label: float("inf") for label in frames}
        for _ in range(repeats):
            for label, frame in frames.items():
                best[label] = min(best[label], _timed_noop(frame))
        Queue.delete(store, name)
    figures = {
        "queue rows/s": entries / best["queue"],
        "parquet rows/s": entries / best["parquet"],
        "floor rows/s": entries / best["floor"],
        "ratio": best["parquet"] / best["queue"],
        "floor ratio": best["parquet"] / best["floor"],
    }
    log(f"partitions: {partitions}; best of {repeats} runs each")
    log(f"queue -> Spark:   {figures['queue rows/s']:>12,.0f} rows/s ({best['queue']:.2f} s)")
    log(f"Parquet -> Spark: {figures['parquet rows/s']:>12,.0f} rows/s ({best['parquet']:.2f} s)")
    log(
        f"Python source floor (prebuilt Arrow batches): {figures['floor rows/s']:>12,.0f} rows/s"
        f" ({best['floor']:.2f} s)"
    )
    log(f"ratio to Parquet: queue {figures['ratio']:.2f}; Python source floor {figures['floor ratio']:.2f}")
    return figures
