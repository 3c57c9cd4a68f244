"""The ``large_queue`` PySpark data source (Python Data Source API, pyspark >= 4.0).

Batch reads take one snapshot of [head, tail) on the driver and split it into
segments (runs of whole buffer records); each task reads its segment with
batch gets (one round trip per batch of records) and yields Arrow record
batches. Streaming reads use queue offsets as Spark offsets. Writes enqueue
rows in batches (:mod:`._write`; what a row becomes: :mod:`._rows`). Reading never dequeues.

Connections are opened inside tasks and reused per worker process; nothing
unpicklable travels with the reader or the writer.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from large_queue import errors
from large_queue.appends._prefix import HoleWatch
from large_queue.cluster import _groups
from large_queue.queue import Queue
from large_queue.spark._arrow import read_segment
from large_queue.spark._options import (
    SourceOptions,
    check_range,
    data_loss,
    for_reading,
    for_writing,
    recreated,
    resolve,
    segments,
    starting_offset,
)
from large_queue.spark._stores import open_queue
from large_queue.spark._write import BatchWriter, StreamWriter

log = logging.getLogger("large_queue.spark")

JSON_SCHEMA = "queue string, offset long, value string, enqueued_at timestamp"


def _checked_schema(schema: StructType, value_format: str) -> StructType:
    """A user's schema, its fixed columns (queue, offset, value, enqueued_at) of their own types.

    Checked at planning: a wrong type would otherwise fail each task with a
    conversion error. The other columns are fields of the JSON entries.
    """
    fixed = {  # as JSON_SCHEMA and BINARY_SCHEMA say (parsing DDL needs a session: planning has none)
        "queue": StringType(),
        "offset": LongType(),
        "value": BinaryType() if value_format == "binary" else StringType(),
        "enqueued_at": TimestampType(),
    }
    for field in schema.fields:
        lowered = field.name.lower()
        if lowered not in fixed:
            continue
        if field.name != lowered:
            raise errors.InvalidArgumentError(
                f"column {field.name!r}: the fixed column is named {lowered!r} (lower case); entry fields"
                " cannot take that name"
            )
        want = fixed[lowered]
        times = (TimestampType(), TimestampNTZType())
        if field.dataType != want and not (lowered == "enqueued_at" and field.dataType in times):
            raise errors.InvalidArgumentError(
                f"column {field.name!r} is {want.simpleString()} (valueFormat={value_format}),"
                f" not {field.dataType.simpleString()}"
            )
    return schema


BINARY_SCHEMA = "queue string, offset long, value binary, enqueued_at timestamp"

#: what each streaming query's driver has seen of holes, by queue (kept across micro-batches)
_hole_watches: dict[tuple[int, str | None, str | None, str, str | None], HoleWatch] = {}


@dataclasses.dataclass(frozen=True)
class Segment(InputPartition):
    """Offsets [start, stop) of one queue: a run of whole buffer records.

    ``incarnation`` is the creation of the queue they were planned in.
    """

    start: int
    stop: int
    incarnation: str | None = None


def _read_segment(options: SourceOptions, schema: StructType, segment: Segment) -> Iterator[pa.RecordBatch]:
    """Read one segment with batch gets; yield Arrow record batches."""
    if segment.start >= segment.stop:
        return
    try:
        queue = open_queue(options)
    except errors.QueueNotFoundError:
        if options.fail_on_data_loss:
            raise recreated(options.queue, segment.start, segment.stop) from None
        log.warning(
            "queue %r was deleted: offsets %d..%d skipped", options.queue, segment.start, segment.stop - 1
        )
        return
    yield from read_segment(
        queue,
        segment.start,
        segment.stop,
        value_format=options.value_format,
        fail_on_data_loss=options.fail_on_data_loss,
        schema=schema,
        incarnation=segment.incarnation,
    )


class _BatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        if options.group is not None:
            raise errors.InvalidArgumentError(
                "option 'group' is for streaming reads (a group's cursor moves when a micro-batch"
                " commits); a batch read reads offsets and commits nothing"
            )
        queue = open_queue(options)  # planning time: a missing queue or bad offsets fail here
        self.incarnation = queue.incarnation
        info = queue.info()
        start = starting_offset(options, queue, info.head_offset, info.tail_offset)
        end = resolve(options.ending, info.head_offset, info.tail_offset)
        start = check_range(
            options.queue,
            start,
            end,
            info.head_offset,
            info.tail_offset,
            options.fail_on_data_loss,
            sought=options.starting_timestamp,
        )
        self.segments = segments(
            queue.shape,
            start,
            end,
            min_partitions=options.min_partitions,
            records_per_partition=options.records_per_partition,
        )

    def partitions(self) -> list[InputPartition]:
        return [Segment(lo, hi, self.incarnation) for lo, hi in self.segments] or [Segment(0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Segment)
        return _read_segment(self.options, self.schema, partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.target: int | None = None
        queue = open_queue(options)  # planning time: a missing queue fails here
        if options.group is not None:
            if queue.capacity < 2:  # see latestOffset: a micro-batch must leave room behind it
                raise errors.InvalidArgumentError(
                    f"queue {options.queue!r} has capacity 1: a stream reading as a group needs a queue of"
                    " capacity 2 or more (Spark acks a micro-batch only once there are entries after it)"
                )
            _groups.ensure(queue, options.group)  # created at the head on first use

    def _bounds(self) -> tuple[Queue, int, int]:
        """The queue, and its head and the end of its published prefix now.

        A stream waits on the prefix: a hole it has seen open past the queue's
        hole timeout (across micro-batches, on this driver's clock) it closes.
        """
        queue = open_queue(self.options)
        # the driver's clock of holes in this creation of the queue (another creation has its own timeout)
        key = (os.getpid(), self.options.url, self.options.namespace, self.options.queue, queue.incarnation)
        queue.holes = _hole_watches.setdefault(key, queue.holes)
        head, tail = queue.published_tail(close_overdue=True)
        return queue, head, tail

    def initialOffset(self) -> dict[str, Any]:
        queue, head, tail = self._bounds()
        if self.options.group is not None:  # where the group has acked up to (the checkpoint wins later)
            start = _groups.acked(queue, self.options.group)
        else:
            start = starting_offset(self.options, queue, head, tail)
            if start > tail:
                raise errors.InvalidArgumentError(
                    f"startingOffsets {start} is past the end {tail} of queue {self.options.queue!r}'s"
                    " published entries: a stream starts at an offset it can read"
                )
        if start < head:
            if self.options.fail_on_data_loss:
                raise data_loss(self.options.queue, start, head)
            start = head
        return self._offset(queue, start)

    @staticmethod
    def _offset(queue: Queue, offset: int) -> dict[str, Any]:
        """A stream offset: the queue offset, and which creation of the queue it is one of."""
        return (
            {"offset": offset, "incarnation": queue.incarnation} if queue.incarnation else {"offset": offset}
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def _begin(self, queue: Queue, start: dict[str, Any], head: int, tail: int) -> int:
        """Where reading resumes: ``start``'s offset, or the head if the queue moved past it.

        A checkpoint of another creation of the queue (deleted and created
        again since), or past its end (the same, for a queue of an older
        format), is data loss too: its offsets name other entries now.
        """
        offset: int = start["offset"]
        made = start.get("incarnation")
        if (made is not None and made != queue.incarnation) or offset > tail:
            if self.options.fail_on_data_loss:
                raise errors.QueueError(
                    f"queue {self.options.queue!r} was deleted and created again since this stream's"
                    f" checkpoint (offset {offset}, the queue's published entries end at {tail}): what the"
                    " stream had not read of it is gone; set failOnDataLoss=false to go on from its head",
                    queue=self.options.queue,
                )
            log.warning(
                "queue %r was created again since the checkpoint; resuming at its head %d",
                self.options.queue,
                head,
            )
            return head
        if offset >= head:
            return offset
        if self.options.fail_on_data_loss:
            raise data_loss(self.options.queue, offset, head)
        log.warning(
            "queue %r: offsets %d..%d are gone; resuming at the head", self.options.queue, offset, head - 1
        )
        return head

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        queue, head, tail = self._bounds()
        begin = self._begin(queue, start, head, tail)
        end = tail if self.target is None else min(tail, max(self.target, begin))
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        if self.options.group is not None:
            # Spark commits a micro-batch (and so moves the group's cursor and the head it holds back)
            # only as it plans the next one, and plans one only for new entries: a batch of the whole
            # queue would leave a full queue no room for them, and the stream would wait for ever
            end = min(end, begin + max(1, queue.capacity // 2))
        return self._offset(queue, max(end, begin))

    def reportLatestOffset(self) -> dict[str, Any]:
        queue, _, tail = self._bounds()
        return self._offset(queue, tail)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._bounds()[2]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        queue, head, tail = self._bounds()
        begin = self._begin(queue, start, head, tail)
        if end.get("incarnation", queue.incarnation) != queue.incarnation:
            # ``end`` was planned in a creation deleted since (``_begin`` said so): none of it is left to
            # read, and the next batch starts at this creation's head
            return [Segment(0, 0)]
        planned = segments(
            queue.shape,
            begin,
            end["offset"],
            min_partitions=self.options.min_partitions,
            records_per_partition=self.options.records_per_partition,
        )
        return [Segment(lo, hi, queue.incarnation) for lo, hi in planned] or [Segment(0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Segment)
        return _read_segment(self.options, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Reading never dequeues; as a group (option ``group``), moves the group's cursor to ``end``.

        The group then holds back the queue's head like any other group.
        """
        if self.options.group is None:
            return
        queue = open_queue(self.options)
        if end.get("incarnation", queue.incarnation) != queue.incarnation:
            # offsets of a creation deleted since: acking them here would skip this creation's entries
            log.warning(
                "queue %r was created again since offset %d was planned: group %r's cursor stays",
                self.options.queue,
                end["offset"],
                self.options.group,
            )
            return
        _groups.commit_cursor(queue, self.options.group, end["offset"])


class LargeQueueDataSource(DataSource):
    """``spark.read.format("large_queue")`` and friends; see the package docs for options."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "large_queue"

    def schema(self) -> str:
        """``queue``, ``offset``, ``value`` (JSON text or msgpack bytes) and ``enqueued_at``."""
        return (
            BINARY_SCHEMA
            if for_reading(SourceOptions.parse(self.options)).value_format == "binary"
            else JSON_SCHEMA
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader over one snapshot of the queue."""
        options = for_reading(SourceOptions.parse(self.options), streaming=False)
        return _BatchReader(options, _checked_schema(schema, options.value_format))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A streaming reader whose offsets are queue offsets."""
        options = for_reading(SourceOptions.parse(self.options), streaming=True)
        return _StreamReader(options, _checked_schema(schema, options.value_format))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer that enqueues rows."""
        if overwrite:
            raise errors.InvalidArgumentError(
                "large_queue supports mode('append') only: a queue is not overwritten"
            )
        return BatchWriter(for_writing(SourceOptions.parse(self.options)), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A streaming writer that enqueues each micro-batch."""
        return StreamWriter(for_writing(SourceOptions.parse(self.options)), schema)
