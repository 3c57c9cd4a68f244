"""Producers enqueue events; Spark reads the queue in bulk, aggregates, and writes the result.

The result goes to Parquet and into a results queue. Runs on LARGE_QUEUE_URL,
else on a temporary embedded store; needs the spark extra
(``pip install 'large-queue[spark]'``) and Java 17.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import tempfile

from large_queue import Queue, connect

PRODUCERS, EVENTS_PER_PRODUCER = 3, 20_000


def produce(url: str, producer: int) -> None:
    queue = Queue.open(connect(url), "clicks")
    for first in range(0, EVENTS_PER_PRODUCER, 500):
        queue.enqueue_batch(
            [
                {"producer": producer, "user": f"user-{n % 50}", "ms": n % 1000}
                for n in range(first, first + 500)
            ]
        )


def main() -> int:
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        print("spark_pipeline: Spark needs Java 17 or newer (java on PATH, or JAVA_HOME); skipped")
        return 0
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import this environment's large_queue
    from pyspark.sql import SparkSession

    from large_queue.spark import register

    with tempfile.TemporaryDirectory() as directory:
        url = os.environ.get("LARGE_QUEUE_URL") or f"embedded://{directory}/pipeline.db"
        store = connect(url)
        taken = [name for name in ("clicks", "click-totals") if name in Queue.names(store)]
        if taken:  # someone's queues: this example makes and deletes its own
            print(f"spark_pipeline: queues {taken} exist on {url}; delete them (large-queue delete NAME)")
            return 1
        Queue.create(store, "clicks", capacity=PRODUCERS * EVENTS_PER_PRODUCER)
        context = multiprocessing.get_context("spawn")
        producers = [context.Process(target=produce, args=(url, p)) for p in range(PRODUCERS)]
        for process in producers:
            process.start()
        for process in producers:
            process.join()

        spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        events = (
            spark.read.format("large_queue")
            .option("url", url)
            .option("queue", "clicks")
            .schema("offset long, producer int, user string, ms long")
            .load()
        )
        totals = (
            events.groupBy("user")
            .agg({"ms": "sum", "offset": "count"})
            .withColumnsRenamed({"sum(ms)": "total_ms", "count(offset)": "clicks"})
        )
        totals.write.mode("overwrite").parquet(os.path.join(directory, "totals.parquet"))
        (
            totals.write.format("large_queue")
            .option("url", url)
            .option("queue", "click-totals")
            .option("createIfMissing", "true")
            .option("capacity", "1000")
            .mode("append")
            .save()
        )
        results = Queue.open(store, "click-totals").dequeue_batch(1000)
        from_parquet = spark.read.parquet(os.path.join(directory, "totals.parquet")).count()
        spark.stop()
        for name in ("clicks", "click-totals"):
            Queue.delete(store, name)

    clicks = sum(entry.value["clicks"] for entry in results)
    print(f"{PRODUCERS} producers enqueued {PRODUCERS * EVENTS_PER_PRODUCER:,} events")
    print(f"Spark aggregated them into {len(results)} per-user totals ({from_parquet} rows in Parquet too)")
    print(f"clicks accounted for: {clicks:,}")
    return 0 if clicks == PRODUCERS * EVENTS_PER_PRODUCER and from_parquet == len(results) == 50 else 1


if __name__ == "__main__":
    sys.exit(main())
