"""Spark writes into a queue: each task enqueues its rows in batches, at least once or exactly once.

A task turns its rows into entries (:mod:`._rows`) and enqueues them in
batches of ``batchSize`` (at most the queue's capacity), each one
reservation and one publish per buffer record. A full queue is waited on,
for up to a minute, for consumers to make room.

Plain writes are at least once: a task that fails after some of its batches
were enqueued leaves them, and Spark's retry enqueues them again. With
``idempotent=true`` each batch carries a txn id that names it the same way
in every attempt, so the queue's receipts (:mod:`large_queue._receipts`)
turn a batch enqueued before into a no-op. The timeline of a streaming
query that dies between its write and its commit::

    t=0  micro-batch 7 runs: partition 0 enqueues its batches
         "spark:<query id>:7:0:0" and ":7:0:1"; each leaves a receipt.
    t=1  the driver dies before micro-batch 7 is in the commit log.
    t=5  the query restarts from its checkpoint and runs micro-batch 7
         again over the same offsets: partition 0's batches carry the same
         txn ids; the queue answers each with the first call's offsets and
         writes nothing. Nothing is enqueued twice.

A batch write's txn ids start with an id the driver draws when the write
is planned, which every attempt of its tasks carries. Two conditions hold
it together, both said in the README: the source gives a task run again
the same rows in the same order (a batch whose count differs is refused;
one that differs in content only is not detected), and the queue's receipt
log still holds the first attempt's receipts (``receipts`` and
``receipt_ttl``, queue settings: one receipt per batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from large_queue import _records as rec
from large_queue import errors
from large_queue._entries import JSON
from large_queue.queue import DEFAULT_APPENDS, Queue
from large_queue.spark._options import SourceOptions
from large_queue.spark._rows import check_writable, entry_maker
from large_queue.spark._stores import open_queue, store

log = logging.getLogger("large_queue.spark")

FULL_QUEUE_WAIT_SECONDS = 60.0
#: Spark's local properties of a micro-batch's tasks: the query's id (kept in its checkpoint) and the batch
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclasses.dataclass(frozen=True)
class Enqueued(WriterCommitMessage):
    """What one write task enqueued: how many entries, first and last offset."""

    count: int
    first_offset: int | None
    last_offset: int | None


def prepare_queue(options: SourceOptions, schema: StructType) -> None:
    """Driver side, before any task: open the queue, or create it if asked to.

    The schema is checked against what the queue's encoding holds first
    (:func:`check_writable`): a column no entry can hold fails here, before
    anything is created or written.

    With ``createIfMissing``, a queue that is there already must have the
    settings the options give (``capacity``, ``slotsPerRecord``,
    ``entryEncoding``, ``appends``): else ``InvalidArgumentError`` names the
    difference, instead of writing into a queue other than the one described.
    """
    check_writable(schema)
    try:
        queue = open_queue(options)
    except errors.QueueNotFoundError:
        if not options.create_if_missing:
            raise
        if options.capacity is None:
            raise errors.InvalidArgumentError("createIfMissing needs option 'capacity'") from None
        check_writable(schema, as_json=options.entry_encoding == JSON)
        with contextlib.suppress(errors.QueueExistsError):  # a concurrent writer created it
            Queue.create(
                store(options.url, create=True),
                options.queue,
                capacity=options.capacity,
                slots_per_record=options.slots_per_record,
                namespace=options.namespace,
                encoding=options.entry_encoding,
                appends=options.appends or DEFAULT_APPENDS,
            )
        return
    _check_settings(queue, options)
    check_writable(schema, as_json=queue.encoding == JSON)


def _check_settings(queue: Queue, options: SourceOptions) -> None:
    """``InvalidArgumentError`` if the creation options given differ from the queue's settings."""
    given = options.given
    wanted = [
        ("capacity", options.capacity, queue.capacity),
        ("slotsPerRecord", options.slots_per_record, queue.shape.slots_per_record),
        ("entryEncoding", options.entry_encoding if "entryencoding" in given else None, queue.encoding),
        ("appends", options.appends, rec.RESERVED_APPENDS if queue.reserved else rec.LOCKED_APPENDS),
    ]
    differ = [
        f"{name}={want} (the queue has {have})" for name, want, have in wanted if want not in (None, have)
    ]
    if differ:
        raise errors.InvalidArgumentError(
            f"queue {options.queue!r} exists with other settings than the options give: {', '.join(differ)};"
            " drop those options to write into it as it is"
        )


def _task_txn_prefix(write_id: str, streaming: bool) -> str:
    """What names this task's batches in every attempt: the write (or micro-batch) and the partition."""
    context = TaskContext.get()
    if context is None:
        raise errors.InvalidArgumentError("an idempotent write runs inside Spark tasks only")
    name = write_id
    if streaming:
        query = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        if query and batch:  # otherwise this run's own id: retried tasks are still covered
            name = f"{query}:{batch}"
    return f"spark:{name}:{context.partitionId()}"


def write_rows(
    options: SourceOptions, schema: StructType, rows: Iterator[Row], txn_prefix: str | None
) -> Enqueued:
    """Enqueue ``rows`` in batches; with ``txn_prefix``, batch ``n`` carries txn id ``<prefix>:<n>``."""
    queue = open_queue(options)
    entry = entry_maker(options, schema)
    size = min(options.batch_size, queue.capacity)
    count, first, last = 0, None, None
    batch: list[Any] = []

    def flush() -> None:
        nonlocal count, first, last
        txn_id = None if txn_prefix is None else f"{txn_prefix}:{count // size}"
        deadline = time.monotonic() + FULL_QUEUE_WAIT_SECONDS
        delay = 0.01
        while True:
            try:
                offsets = queue.enqueue_batch(batch, txn_id=txn_id)
                break
            except errors.QueueFullError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(delay)  # consumers are behind: wait for room
                delay = min(delay * 2, 1.0)
            except errors.InvalidArgumentError as exc:
                if txn_id is None or "already names" not in str(exc):
                    raise
                raise errors.InvalidArgumentError(
                    f"a task run again gave other rows than its first attempt ({exc}); an idempotent"
                    " write needs a source that gives each task the same rows in the same order"
                ) from None
        count += len(offsets)
        first = offsets.start if first is None else first
        last = offsets.stop - 1
        batch.clear()

    for row in rows:
        batch.append(entry(row))
        if len(batch) >= size:
            flush()
    if batch:
        flush()
    return Enqueued(count, first, last)


class BatchWriter(DataSourceWriter):
    """A batch write: every task enqueues its rows (see the module's timeline for retries)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.write_id = uuid.uuid4().hex  # drawn once, on the driver: every task attempt carries it
        prepare_queue(options, schema)

    def write(self, iterator: Iterator[Row]) -> Enqueued:
        """Enqueue one task's rows."""
        prefix = _task_txn_prefix(self.write_id, streaming=False) if self.options.idempotent else None
        return write_rows(self.options, self.schema, iterator, prefix)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log what the write enqueued."""
        total = sum(m.count for m in messages if isinstance(m, Enqueued))
        log.info("enqueued %d rows into queue %r", total, self.options.queue)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log what a failed write leaves enqueued."""
        done = sum(m.count for m in messages if isinstance(m, Enqueued))
        log.error(
            "write to queue %r failed; %d rows from successful tasks stay enqueued, and the batches the"
            " failing tasks had enqueued before they failed",
            self.options.queue,
            done,
        )


class StreamWriter(DataSourceStreamWriter):
    """A streaming write: each micro-batch's tasks enqueue their rows."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.write_id = uuid.uuid4().hex
        prepare_queue(options, schema)

    def write(self, iterator: Iterator[Row]) -> Enqueued:
        """Enqueue one task's rows."""
        prefix = _task_txn_prefix(self.write_id, streaming=True) if self.options.idempotent else None
        return write_rows(self.options, self.schema, iterator, prefix)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log what the micro-batch enqueued."""
        total = sum(m.count for m in messages if isinstance(m, Enqueued))
        log.info("micro-batch %d: enqueued %d rows into queue %r", batchId, total, self.options.queue)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log that a failed micro-batch leaves what it enqueued."""
        log.error(
            "micro-batch %d to queue %r failed; rows already enqueued stay", batchId, self.options.queue
        )


__all__ = ["BatchWriter", "Enqueued", "StreamWriter", "prepare_queue", "write_rows"]
