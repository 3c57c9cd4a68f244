"""Spark connector: read queues as DataFrames (batch and streaming) and write DataFrames into queues.

Install with ``pip install 'large-queue[spark]'`` and register once per session::

    from large_queue.spark import register
    register(spark)
    df = spark.read.format("large_queue").option("queue", "events").load()
    df.write.format("large_queue").option("queue", "results").mode("append").save()

Options (case-insensitive): ``url`` (as :func:`large_queue.connect`; default
``LARGE_QUEUE_URL`` or the embedded store), ``namespace``, ``queue``
(required, or the path of ``load()`` / ``save()``), ``startingOffsets`` / ``endingOffsets`` (``earliest``,
``latest`` or an offset), ``startingTimestamp`` (ms since the epoch: the first entry enqueued
then or later), ``minPartitions``, ``recordsPerPartition``,
``valueFormat`` (``json`` | ``binary``; writes decode a string value column as JSON and bytes as
msgpack by default, and ``text`` keeps a string), ``failOnDataLoss`` (default true),
``maxOffsetsPerTrigger`` and ``group`` (streaming: read as that consumer group, whose cursor
moves as Spark commits micro-batches), and for writing ``batchSize``, ``idempotent``
(a task run again enqueues nothing twice, within the limits the README states), ``createIfMissing``,
``capacity``, ``slotsPerRecord``, ``entryEncoding`` (``msgpack`` | ``native`` | ``json``)
and ``appends`` (``reserve`` | ``lock``), the last four for a queue that
``createIfMissing`` creates (``msgpack`` and ``reserve`` unless told). The README's Spark
section says what each does.

A queue created with ``encoding="json"`` stores each entry's JSON text,
which becomes a ``json`` value column as it is; one created with
``encoding="msgpack"`` (the default) stores msgpack bytes, which become a
``binary`` value column as they are: such reads skip decoding entries.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from large_queue import errors
from large_queue.spark._source import LargeQueueDataSource


def register(spark: Any) -> None:
    """Register the ``large_queue`` format with a SparkSession.

    On a local session it first checks that Spark's Python workers can
    import this library: they run ``PYSPARK_PYTHON`` (or
    ``spark.pyspark.python``), by default the first ``python3`` on the path,
    which is not this virtual environment's unless it is activated.
    """
    context = spark.sparkContext
    python = context.pythonExec
    if str(context.master).startswith("local") and python != sys.executable:
        found = subprocess.run([python, "-c", "import large_queue"], capture_output=True, check=False)
        if found.returncode != 0:
            raise errors.InvalidArgumentError(
                f"Spark's Python workers run {python!r}, which cannot import large_queue: start the"
                f" session with PYSPARK_PYTHON={sys.executable} (or spark.pyspark.python) set"
            )
    spark.dataSource.register(LargeQueueDataSource)


__all__ = ["LargeQueueDataSource", "register"]
