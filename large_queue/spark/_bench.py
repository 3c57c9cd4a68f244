"""``large-queue bench --spark``: rows/s reading a queue into Spark, against Parquet.

Both reads run in one local session on the same rows and end in
``write.format("noop")``, so the ratio compares the sources, not the sinks.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

from large_queue.backends import connect
from large_queue.queue import Queue


def _timed_noop(frame: Any) -> float:
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def run(
    url: str | None, *, entries: int = 1_000_000, partitions: int = 4, log: Any = print
) -> dict[str, float]:
    """Fill a queue with ``entries`` events, then time both reads (best of two each)."""
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
                [{"id": n, "user": n % 977, "kind": "click"} for n in range(first, first + 1000)]
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
        queue_seconds = min(_timed_noop(source) for _ in range(2))
        parquet_seconds = min(_timed_noop(parquet) for _ in range(2))
        Queue.delete(store, name)
    figures = {
        "queue rows/s": entries / queue_seconds,
        "parquet rows/s": entries / parquet_seconds,
        "ratio": parquet_seconds / queue_seconds,
    }
    log(f"queue -> Spark:   {figures['queue rows/s']:>12,.0f} rows/s ({queue_seconds:.2f} s)")
    log(f"Parquet -> Spark: {figures['parquet rows/s']:>12,.0f} rows/s ({parquet_seconds:.2f} s)")
    log(f"ratio to Parquet: {figures['ratio']:.2f}")
    return figures
