"""``large-queue bench --spark``: rows/s reading a queue into Spark, against Parquet.

Five reads of the same rows run in one local session, each ending in
``write.format("noop")`` so the figures compare sources, not sinks:

- a queue of msgpack entries (the default encoding), through the
  ``large_queue`` data source;
- a queue holding the same events as native entries (the store's own values);
- a queue holding them as JSON entries, whose stored text becomes the
  ``value`` column as it is (the bench first checks that the three queues
  read as the same offsets and values);
- a Parquet file holding exactly the rows the msgpack queue read produced;
- Spark's floor for any Python data source: a source whose tasks yield the
  same rows as ready-made Arrow batches, doing no work of their own. The gap
  between this line and Parquet belongs to Spark's Python data source path
  (task start-up, Arrow transfer to the JVM); the gap between the queue and
  this line is the connector's own work.

After a warm-up round, ``repeats`` rounds each time every read once, so that a
slow moment of the machine hits all of them; each read starts after a short
pause, so that no earlier read's processes are still busy. Rates are each
read's best round; a ratio to Parquet is the median over rounds of that
round's ratio, which pairs reads taken moments apart (as the producers'
bench does).
"""

from __future__ import annotations

import os
import statistics
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


def _timed_noop(frame: Any, pause: float) -> float:
    time.sleep(pause)  # first let any earlier read's processes finish their work
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


def _fill(store: Any, name: str, entries: int, encoding: str) -> None:
    Queue.delete(store, name)
    queue = Queue.create(store, name, capacity=entries, slots_per_record=100, encoding=encoding)
    for first in range(0, entries, 1000):
        queue.enqueue_batch(
            [{"id": n, "user": n % 977, "kind": "click"} for n in range(first, min(first + 1000, entries))]
        )


def run(
    url: str | None,
    *,
    entries: int = 1_000_000,
    partitions: int | None = None,
    repeats: int = 5,
    pause: float = 0.5,
    log: Any = print,
) -> dict[str, float]:
    """Fill three queues with ``entries`` events, then time the reads in ``repeats`` rounds.

    The same events go into a queue of each entry encoding: ``msgpack`` (the
    default), ``native`` and ``json``, whose stored text the reader passes on
    as it is.
    ``partitions`` defaults to the session's parallelism (one task per core),
    which is how a job reading a whole queue should set ``minPartitions``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from large_queue.spark import register

    with tempfile.TemporaryDirectory() as directory:
        url = url or f"embedded://{directory}/bench.db"
        store = connect(url)
        names = {"msgpack": "bench-spark", "native": "bench-spark-native", "json": "bench-spark-json"}
        started = time.perf_counter()
        for encoding, name in names.items():
            _fill(store, name, entries, encoding)
        log(f"enqueued {entries:,} entries into each of 3 queues in {time.perf_counter() - started:.1f} s")
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        partitions = partitions or spark.sparkContext.defaultParallelism
        sources = {
            encoding: spark.read.format("large_queue")
            .option("url", url)
            .option("queue", name)
            .option("minPartitions", partitions)
            .load()
            for encoding, name in names.items()
        }
        parquet_path = os.path.join(directory, "events.parquet")
        sources["msgpack"].write.parquet(parquet_path)
        parquet = spark.read.parquet(parquet_path)
        same = ["offset", "value"]  # the queue name and enqueue times differ between the queues
        if parquet.count() != entries or any(
            not sources[encoding].select(same).exceptAll(parquet.select(same)).isEmpty()
            for encoding in ("native", "json")
        ):
            raise RuntimeError("the msgpack, native and JSON-encoded queues did not read as the same rows")
        spark.dataSource.register(FloorSource)
        floor = (
            spark.read.format("large_queue_bench_floor")
            .option("path", parquet_path)
            .option("partitions", partitions)
            .load()
        )
        frames = {
            "queue": sources["msgpack"],
            "queue native": sources["native"],
            "queue json": sources["json"],
            "parquet": parquet,
            "floor": floor,
        }
        for frame in frames.values():  # a warm-up round: the JVM compiles each read's code paths
            _timed_noop(frame, pause)
        rounds = [
            {label: _timed_noop(frame, pause) for label, frame in frames.items()} for _ in range(repeats)
        ]
        for name in names.values():
            Queue.delete(store, name)
    best = {label: min(round_[label] for round_ in rounds) for label in frames}
    figures = {f"{label} rows/s": entries / seconds for label, seconds in best.items()}
    ratios = {
        label: sorted(round_["parquet"] / round_[label] for round_ in rounds)
        for label in ("queue", "queue native", "queue json", "floor")
    }
    figures.update({f"{label} ratio": statistics.median(values) for label, values in ratios.items()})
    log(
        f"partitions: {partitions}; rows/s: the best of {repeats} rounds after a warm-up;"
        " ratio to Parquet: the median of the rounds' ratios (each round times every read once)"
    )
    lines = {
        "queue": "queue (msgpack entries) -> Spark",
        "queue native": "queue (native entries) -> Spark",
        "queue json": "queue (JSON entries) -> Spark",
        "parquet": "Parquet -> Spark",
        "floor": "Python source floor (prebuilt Arrow batches)",
    }
    for label, text in lines.items():
        ratio = ""
        if label in ratios:
            spread = f"{ratios[label][0]:.2f}-{ratios[label][-1]:.2f}"
            ratio = (
                f"  {figures[f'{label} ratio']:.2f} of Parquet (rounds: {spread};"
                f" best vs best: {best['parquet'] / best[label]:.2f})"
            )
        log(f"{text:46} {figures[f'{label} rows/s']:>12,.0f} rows/s ({best[label]:.2f} s){ratio}")
    return figures
