"""Options of the ``large_queue`` Spark data source, checked before any task runs.

I/O-free: parsing, validation and the planning of segments (contiguous runs of
buffer records) from a snapshot of head and tail.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from large_queue import errors
from large_queue._entries import DEFAULT_ENCODING, ENCODINGS, check_encoding
from large_queue._records import LOCKED_APPENDS, RESERVED_APPENDS, QueueShape

VALUE_FORMATS = ("json", "binary")
#: what a writer also takes: keep a string value column as it is, a string entry
WRITE_VALUE_FORMATS = (*VALUE_FORMATS, "text")
OPTIONS = (
    "url",
    "namespace",
    "queue",
    "startingOffsets",
    "startingTimestamp",
    "endingOffsets",
    "minPartitions",
    "recordsPerPartition",
    "valueFormat",
    "failOnDataLoss",
    "maxOffsetsPerTrigger",
    "batchSize",
    "createIfMissing",
    "capacity",
    "slotsPerRecord",
    "entryEncoding",
    "appends",
    "idempotent",
    "group",
)
# options Spark itself may hand to a data source with the user's
_SPARK_OPTIONS = ("path", "checkpointlocation")
MAX_ENTRIES_PER_PARTITION = 500_000


def _integer(options: Mapping[str, str], name: str, default: int | None, *, minimum: int = 0) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise errors.InvalidArgumentError(f"option {name}={text!r} is not an integer") from None
    if value < minimum:
        raise errors.InvalidArgumentError(f"option {name}={value} must be at least {minimum}")
    return value


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise errors.InvalidArgumentError(f"option {name}={text!r} must be true or false")
    return text.lower() == "true"


def _bound(options: Mapping[str, str], name: str, default: str) -> str | int:
    given = options.get(name.lower())
    text = (default if given is None else given).strip().lower()
    if text in ("earliest", "latest"):
        return text
    try:
        offset = int(text)
    except ValueError:
        raise errors.InvalidArgumentError(
            f"option {name}={given!r} must be 'earliest', 'latest' or an offset"
        ) from None
    if offset < 0:
        raise errors.InvalidArgumentError(f"option {name}={offset} must not be negative")
    return offset


#: options each kind of use takes beside url, namespace, queue and valueFormat (lower case)
_WRITE_ONLY = frozenset(
    {"batchsize", "createifmissing", "capacity", "slotsperrecord", "entryencoding", "appends", "idempotent"}
)
_READ_ONLY = frozenset(
    {
        "startingoffsets",
        "startingtimestamp",
        "endingoffsets",
        "minpartitions",
        "recordsperpartition",
        "failondataloss",
        "maxoffsetspertrigger",
        "group",
    }
)
_CREATION = frozenset({"capacity", "slotsperrecord", "entryencoding", "appends"})
_BATCH_READ_ONLY = frozenset({"endingoffsets"})
_STREAM_READ_ONLY = frozenset({"maxoffsetspertrigger"})  # a group on a batch read: refused with why


def _refuse(options: SourceOptions, names: frozenset[str], use: str) -> None:
    """``InvalidArgumentError`` naming the options given that ``use`` does not take (not silently ignored)."""
    wrong = sorted(name for name in OPTIONS if name.lower() in names and name.lower() in options.given)
    if wrong:
        raise errors.InvalidArgumentError(f"option(s) {', '.join(wrong)} do not apply to {use}")


def for_reading(options: SourceOptions, *, streaming: bool | None = None) -> SourceOptions:
    """``options``, refused if they only make sense for writing (``streaming`` told: for the other read)."""
    if options.value_format not in VALUE_FORMATS:
        raise errors.InvalidArgumentError(
            f"option valueFormat={options.value_format!r} is for writes; reads give json or binary"
        )
    if streaming is not None:
        _refuse(
            options,
            _WRITE_ONLY | (_BATCH_READ_ONLY if streaming else _STREAM_READ_ONLY),
            "a streaming read" if streaming else "a batch read",
        )
    if streaming and options.group is not None and options.given & {"startingoffsets", "startingtimestamp"}:
        raise errors.InvalidArgumentError(
            "a stream read as a group starts where the group's cursor is: startingOffsets and"
            " startingTimestamp do not apply"
        )
    return options


def for_writing(options: SourceOptions) -> SourceOptions:
    """``options``, refused if they only make sense for reading, or for creating a queue where no
    ``createIfMissing`` asks for one."""
    _refuse(options, _READ_ONLY, "a write")
    if not options.create_if_missing:
        _refuse(
            options, _CREATION, "a write without createIfMissing=true (they describe the queue it creates)"
        )
    return options


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """Everything the data source was given, validated."""

    url: str | None
    namespace: str | None
    queue: str
    starting: str | int
    ending: str | int
    min_partitions: int
    records_per_partition: int | None
    value_format: str
    value_format_given: bool
    fail_on_data_loss: bool
    max_offsets_per_trigger: int | None
    batch_size: int
    create_if_missing: bool
    capacity: int | None
    slots_per_record: int | None
    entry_encoding: str
    appends: str | None  # for createIfMissing: how the new queue's producers append (None: the default)
    group: str | None = None  # streaming: read as this consumer group, committing its cursor
    #: writes: each batch of rows carries a txn id, so that a task or micro-batch run again adds nothing twice
    idempotent: bool = False
    #: start at the first entry enqueued at or after this moment (ms since the epoch), not at ``starting``
    starting_timestamp: int | None = None
    #: the options given (lower case): each use refuses those it does not take
    given: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate the options Spark passed (keys are case-insensitive there)."""
        lowered = {key.lower(): value for key, value in options.items()}
        known = {name.lower() for name in OPTIONS} | set(_SPARK_OPTIONS)
        unknown = sorted(key for key in options if key.lower() not in known)
        if unknown:
            raise errors.InvalidArgumentError(
                f"unknown option(s) {', '.join(map(repr, unknown))}; the large_queue source takes"
                f" {', '.join(OPTIONS)}"
            )
        queue, path = lowered.get("queue"), lowered.get("path")
        if queue and path and queue != path:
            raise errors.InvalidArgumentError(
                f"option queue={queue!r} and the path {path!r} (of load() or save()) name two queues:"
                " give one"
            )
        queue = queue or path
        if not queue:
            raise errors.InvalidArgumentError(
                "a queue name is required: .option('queue', 'name'), or .load('name') / .save('name')"
            )
        value_format = lowered.get("valueformat", "json").lower()
        if value_format not in WRITE_VALUE_FORMATS:
            raise errors.InvalidArgumentError(
                f"option valueFormat={lowered['valueformat']!r} must be one of {', '.join(VALUE_FORMATS)}"
                " (and, for writes, text)"
            )
        if "startingtimestamp" in lowered and "startingoffsets" in lowered:
            raise errors.InvalidArgumentError(
                "options startingOffsets and startingTimestamp both say where to start: give one"
            )
        return cls(
            url=lowered.get("url"),
            namespace=lowered.get("namespace"),
            queue=queue,
            starting=_bound(lowered, "startingOffsets", "earliest"),
            ending=_bound(lowered, "endingOffsets", "latest"),
            min_partitions=_integer(lowered, "minPartitions", 1, minimum=1) or 1,
            records_per_partition=_integer(lowered, "recordsPerPartition", None, minimum=1),
            value_format=value_format,
            value_format_given="valueformat" in lowered,
            fail_on_data_loss=_boolean(lowered, "failOnDataLoss", True),
            max_offsets_per_trigger=_integer(lowered, "maxOffsetsPerTrigger", None, minimum=1),
            batch_size=_integer(lowered, "batchSize", 1000, minimum=1) or 1000,
            create_if_missing=_boolean(lowered, "createIfMissing", False),
            capacity=_integer(lowered, "capacity", None, minimum=1),
            slots_per_record=_integer(lowered, "slotsPerRecord", None, minimum=1),
            entry_encoding=_entry_encoding(lowered),
            appends=_appends(lowered),
            group=_group(lowered),
            idempotent=_boolean(lowered, "idempotent", False),
            starting_timestamp=_integer(lowered, "startingTimestamp", None, minimum=0),
            given=frozenset(lowered),
        )


def _appends(lowered: Mapping[str, str]) -> str | None:
    given = lowered.get("appends")
    if given is not None and given.lower() not in (LOCKED_APPENDS, RESERVED_APPENDS):
        raise errors.InvalidArgumentError(
            f"option appends={given!r} must be {RESERVED_APPENDS!r} or {LOCKED_APPENDS!r}"
        )
    return given.lower() if given is not None else None


def _group(lowered: Mapping[str, str]) -> str | None:
    group = lowered.get("group")
    if group is None:
        return None
    from large_queue.cluster._groups import check_group

    return check_group(group)


def _entry_encoding(lowered: Mapping[str, str]) -> str:
    given = lowered.get("entryencoding", DEFAULT_ENCODING)
    try:
        return check_encoding(given.lower())
    except errors.InvalidArgumentError:
        raise errors.InvalidArgumentError(
            f"option entryEncoding={given!r} must be one of {', '.join(ENCODINGS)}"
        ) from None


def starting_offset(options: SourceOptions, queue: Any, head: int, tail: int) -> int:
    """Where a read starts: ``startingTimestamp`` sought in the queue, or ``startingOffsets`` resolved."""
    if options.starting_timestamp is not None:
        return int(min(tail, queue.offset_at(options.starting_timestamp)))
    return resolve(options.starting, head, tail)


def resolve(bound: str | int, head: int, tail: int) -> int:
    """An option's offset given the snapshot (earliest = head, latest = tail)."""
    if bound == "earliest":
        return head
    if bound == "latest":
        return tail
    assert isinstance(bound, int)
    return bound


def check_range(
    queue: str,
    start: int,
    end: int,
    head: int,
    tail: int,
    fail_on_data_loss: bool,
    *,
    sought: int | None = None,
) -> int:
    """Validate a batch read of [start, end); returns the first offset to read.

    ``sought``: the ``startingTimestamp`` that ``start`` was sought from, if any.
    """
    if start > end:
        given = (
            f"startingOffsets {start}" if sought is None else f"startingTimestamp {sought} (offset {start})"
        )
        raise errors.InvalidArgumentError(
            f"{given} is after endingOffsets {end} (unless given, 'latest': the end of queue {queue!r}'s"
            f" published entries, {tail} now)"
        )
    if end > tail:
        raise errors.InvalidArgumentError(
            f"endingOffsets {end} is beyond the tail {tail} of queue {queue!r}:"
            " those entries do not exist yet"
        )
    if start < head:
        if fail_on_data_loss:
            raise data_loss(queue, start, min(head, end))
        return head
    return start


def data_loss(queue: str, start: int, stop: int) -> errors.QueueError:
    """The error for offsets that are no longer in the queue."""
    return errors.QueueError(
        f"offsets {start} to {stop - 1} of queue {queue!r} are no longer in the queue (dequeued or"
        " overwritten); set failOnDataLoss=false to skip them",
        queue=queue,
        lost_from=start,
        lost_to=stop,
    )


def recreated(queue: str, start: int, stop: int) -> errors.QueueError:
    """The error for offsets planned in a creation of the queue that was deleted since."""
    return errors.QueueError(
        f"queue {queue!r} was deleted (or deleted and created again) after offsets {start} to {stop - 1}"
        " were planned: they are gone, and their numbers may name other entries now; set"
        " failOnDataLoss=false to skip them",
        queue=queue,
        lost_from=start,
        lost_to=stop,
    )


def segments(
    shape: QueueShape, start: int, end: int, *, min_partitions: int, records_per_partition: int | None
) -> list[tuple[int, int]]:
    """Split [start, end) into ranges of whole buffer records (the first and last may be partial).

    By default there are ``min_partitions`` ranges, none over
    ``MAX_ENTRIES_PER_PARTITION`` entries: a Python task has a fixed start-up
    cost, so fewer, larger segments read faster.
    """
    if start >= end:
        return []
    first_block = start // shape.slots_per_record
    last_block = (end - 1) // shape.slots_per_record
    blocks = last_block - first_block + 1
    per_partition = records_per_partition or min(
        math.ceil(blocks / min_partitions), max(1, MAX_ENTRIES_PER_PARTITION // shape.slots_per_record)
    )
    ranges = []
    for block in range(first_block, last_block + 1, per_partition):
        lo = max(start, block * shape.slots_per_record)
        hi = min(end, (block + per_partition) * shape.slots_per_record)
        ranges.append((lo, hi))
    return ranges
