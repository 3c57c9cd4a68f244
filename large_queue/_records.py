"""How a queue is laid out in records: keys, bin names, shape and offset math.

I/O-free. A queue named ``q`` is the set ``q`` holding one metadata record
(key ``queue-metadata``) and ``record_count`` buffer records (keys
``queue-buffer-0`` ...), each a list of ``slots_per_record`` slots. Offset
``o`` lives in buffer record ``(o // slots_per_record) % record_count`` at
slot ``o % slots_per_record``. A slot is None (empty) or
``[offset, value, enqueued_at_ms]``: storing the offset lets a reader tell a
live entry from another lap's.

The metadata record carries ``format`` so later versions can migrate.
Format 3 is a queue whose producers append without the lock
(:mod:`large_queue.appends`): its empty slots are ``[-1]`` instead of None,
a published slot may carry a fourth element (the last offset of its batch),
and a slot closed by a reader is a tombstone ``[offset]``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from large_queue import errors
from large_queue._entries import ENCODINGS, NATIVE, decode_entry
from large_queue.backends import RecordKey

# Format 1: entries stored as native values. Format 2 adds the ``encoding``
# bin; queues whose entries are not native use it, so a library that knows
# only format 1 refuses them instead of handing out encoded bytes.
FORMAT_VERSION = 1
ENCODED_FORMAT_VERSION = 2
# Format 3: format 2 whose producers reserve offsets and publish them without the lock.
RESERVED_FORMAT_VERSION = 3
# Format 4: format 3 whose readers mark a run as being closed before they close it, and whose
# head moves that may pass unpublished offsets are recorded (``skipped_to``), so that a receipt
# of a reservation whose slots were reused can be told published; a library that knows only
# format 3 would close runs unmarked, so it must refuse the queue.
MARKED_FORMAT_VERSION = 4
FORMATS = (FORMAT_VERSION, ENCODED_FORMAT_VERSION, RESERVED_FORMAT_VERSION, MARKED_FORMAT_VERSION)
#: formats whose producers reserve offsets
RESERVED_FORMATS = (RESERVED_FORMAT_VERSION, MARKED_FORMAT_VERSION)
#: how producers append: under the queue lock, or by reserving offsets (format 3)
LOCKED_APPENDS = "lock"
RESERVED_APPENDS = "reserve"
#: an empty slot of a format-3 queue: an offset below every offset
EMPTY_SLOT: list[int] = [-1]

METADATA_KEY = "queue-metadata"
BUFFER_KEY_PREFIX = "queue-buffer-"
# the cluster shim's records (large_queue.cluster), in the metadata namespace
OWNER_KEY = "queue-owner"
NODES_KEY = "queue-nodes"
NODE_KEY_PREFIX = "queue-node-"
NODES = "nodes"  # bin of the nodes record: the ids of nodes that ever joined
GROUP_KEY_PREFIX = "queue-group-"  # a consumer group's owner record; its nodes' records follow it

# metadata bins (Aerospike bin names are at most 15 bytes)
FORMAT = "format"
READY = "ready"
CREATED = "created"  # buffer records a create had made when it last said so (until ready)
HEAD = "head"
TAIL = "tail"
LOCK_OWNER = "lock_owner"
LOCK_TTL_MS = "lock_ttl_ms"
FENCE_EPOCH = "fence_epoch"
FENCE_COUNTER = "fence_ctr"
RECORD_COUNT = "record_count"
SLOTS_PER_RECORD = "slots_per_rec"
BUFFER_NAMESPACE = "buffer_ns"
MAX_ENTRY_BYTES = "max_entry"
INCARNATION = "incarnation"  # random id of this queue's creation, in metadata and buffer records
DELETING = "deleting"  # set (1) by a delete before it removes the buffers: the queue is going
ERASED_BELOW = "erased_below"  # dequeued slots below this offset were erased (where they could be)
ENCODING = "encoding"
LOCK_AT = "lock_at"  # format 3: when the lock was taken or renewed, on the store's clock (ms)
HOLE_MS = "hole_ms"  # format 3: how long a reservation may stay unpublished before readers close it
PUBLISHED = "published"  # format 3: every offset below it is published or closed (a hint that only grows)
GROUPS = "groups"  # the names of the queue's consumer groups (absent: none); written under the lock
RECEIPTS = "receipts"  # txn id -> [store ms, first offset, count, "e" | "d"]: see large_queue._receipts
#: first offset -> [store ms, first offset, count] of each run of reserved offsets a reader (or its own
#: producer) closed: what tells a closed reservation from a published one after its slots are reused.
#: Format 4 adds a fourth item: CLOSING while the run is being closed, CLOSED once its tombstones are in
CLOSED_RUNS = "closed_runs"
CLOSING = "i"
CLOSED_RUN = "c"
#: format 4: the head was moved to here by a command that may pass unpublished offsets (a producer
#: overwriting the oldest entries, a consumer group's head): a reservation below it may have been
#: skipped unpublished. Only grows
SKIPPED_TO = "skipped_to"
RECEIPT_KEEP = "rcpt_keep"  # how many receipts the log keeps at most (absent: the default)
RECEIPT_AGE_MS = "rcpt_age_ms"  # how long the log keeps a receipt, in ms (absent: the default)
MAX_AGE_MS = "max_age_ms"  # entries older than this (ms, store's clock) leave from the head (absent: none)
#: receipts kept at most, and for how long (seconds), unless a queue was created with others
DEFAULT_RECEIPT_KEEP = 100
DEFAULT_RECEIPT_AGE = 3600.0

#: every metadata bin but the receipt log: what reading the queue's state needs
STATE_BINS = (
    FORMAT,
    READY,
    CREATED,
    HEAD,
    TAIL,
    LOCK_OWNER,
    LOCK_TTL_MS,
    FENCE_EPOCH,
    FENCE_COUNTER,
    RECORD_COUNT,
    SLOTS_PER_RECORD,
    BUFFER_NAMESPACE,
    MAX_ENTRY_BYTES,
    INCARNATION,
    ERASED_BELOW,
    ENCODING,
    LOCK_AT,
    HOLE_MS,
    PUBLISHED,
    GROUPS,
    RECEIPT_KEEP,
    RECEIPT_AGE_MS,
    MAX_AGE_MS,
    SKIPPED_TO,
    DELETING,
)

# buffer bins (the fence bins share their names with the metadata counter's)
SLOTS = "slots"

NO_OWNER = ""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
MAX_QUEUE_NAME_BYTES = 63
MAX_NAMESPACE_BYTES = 31


def check_name(kind: str, value: object, limit: int) -> str:
    """Return ``value`` if it is a valid queue or namespace name, else raise."""
    if not isinstance(value, str):
        raise errors.InvalidArgumentError(f"{kind} must be a string, not {type(value).__name__}")
    if not _NAME.fullmatch(value) or len(value) > limit:
        raise errors.InvalidArgumentError(
            f"{kind} {value!r} is invalid: use 1 to {limit} letters, digits, '_', '.' or '-',"
            " starting with a letter or digit"
        )
    return value


@dataclass(frozen=True, kw_only=True)
class QueueShape:
    """The fixed geometry of a queue, as stored in its metadata record."""

    record_count: int
    slots_per_record: int

    @property
    def capacity(self) -> int:
        """Entries the queue holds when full."""
        return self.record_count * self.slots_per_record

    def record_of(self, offset: int) -> int:
        """Index of the buffer record holding ``offset``."""
        return (offset // self.slots_per_record) % self.record_count

    def slot_of(self, offset: int) -> int:
        """Index of ``offset``'s slot within its buffer record."""
        return offset % self.slots_per_record

    def runs(self, start: int, stop: int) -> dict[int, list[range]]:
        """Offsets of ``[start, stop)`` as runs of consecutive slots, grouped by buffer record.

        Records come in first-touch order; a record holds two runs when the
        range wraps around into its start.
        """
        grouped: dict[int, list[range]] = {}
        offset = start
        while offset < stop:
            end = min(stop, (offset // self.slots_per_record + 1) * self.slots_per_record)
            grouped.setdefault(self.record_of(offset), []).append(range(offset, end))
            offset = end
        return grouped


@functools.lru_cache(maxsize=4096)
def _buffer_key(namespace: str, name: str, record_index: int) -> RecordKey:
    return RecordKey(namespace, name, f"{BUFFER_KEY_PREFIX}{record_index}")


@dataclass(frozen=True, kw_only=True)
class QueueKeys:
    """The record keys of one queue."""

    name: str
    metadata_namespace: str
    buffer_namespace: str

    @functools.cached_property
    def metadata(self) -> RecordKey:
        """Key of the metadata record."""
        return RecordKey(self.metadata_namespace, self.name, METADATA_KEY)

    def buffer(self, record_index: int) -> RecordKey:
        """Key of buffer record ``record_index``."""
        return _buffer_key(self.buffer_namespace, self.name, record_index)

    @property
    def owner(self) -> RecordKey:
        """Key of the cluster shim's owner record."""
        return RecordKey(self.metadata_namespace, self.name, OWNER_KEY)

    @property
    def nodes(self) -> RecordKey:
        """Key of the cluster shim's list of nodes."""
        return RecordKey(self.metadata_namespace, self.name, NODES_KEY)

    def node(self, node_id: str) -> RecordKey:
        """Key of a node's heartbeat record."""
        return RecordKey(self.metadata_namespace, self.name, f"{NODE_KEY_PREFIX}{node_id}")

    def group(self, group: str | None) -> OwnerKeys:
        """Keys of the ownership records of consumer group ``group`` (None: the queue's own cursor)."""
        if group is None:
            return OwnerKeys(
                owner=self.owner,
                nodes=self.nodes,
                node_prefix=(self.metadata_namespace, self.name, NODE_KEY_PREFIX),
            )
        prefix = f"{GROUP_KEY_PREFIX}{group}"
        return OwnerKeys(
            owner=RecordKey(self.metadata_namespace, self.name, prefix),
            nodes=RecordKey(self.metadata_namespace, self.name, f"{prefix}-nodes"),
            node_prefix=(self.metadata_namespace, self.name, f"{prefix}-node-"),
        )


@dataclass(frozen=True, kw_only=True)
class OwnerKeys:
    """The keys of one cursor's ownership records: the owner record, the node list, node heartbeats."""

    owner: RecordKey
    nodes: RecordKey
    node_prefix: tuple[str, str, str]

    def node(self, node_id: str) -> RecordKey:
        """Key of a node's heartbeat record."""
        namespace, set_name, prefix = self.node_prefix
        return RecordKey(namespace, set_name, f"{prefix}{node_id}")


@dataclass(frozen=True, kw_only=True)
class Metadata:
    """A validated metadata record."""

    shape: QueueShape
    head: int
    tail: int
    buffer_namespace: str
    lock_owner: str
    lock_ttl_ms: int
    fence_epoch: int
    fence_counter: int
    max_entry_bytes: int
    encoding: str
    incarnation: str | None  # None for a queue made before incarnations were kept
    appends: str = LOCKED_APPENDS
    hole_timeout_ms: int = 0  # format 3 only
    published: int = 0  # format 3 only: offsets below it are settled
    groups: tuple[str, ...] = ()  # the queue's consumer groups
    receipt_keep: int = DEFAULT_RECEIPT_KEEP
    receipt_age_ms: int = int(DEFAULT_RECEIPT_AGE * 1000)
    max_age_ms: int | None = None  # retention by age (see large_queue._retention); None: none
    #: format 4: runs are marked before they are closed, and head moves that may skip are recorded
    marked: bool = False

    @property
    def reserved(self) -> bool:
        """True if producers append by reserving offsets (format 3)."""
        return self.appends == RESERVED_APPENDS


_INTEGER_BINS = (
    FORMAT,
    READY,
    HEAD,
    TAIL,
    LOCK_TTL_MS,
    FENCE_EPOCH,
    FENCE_COUNTER,
    RECORD_COUNT,
    SLOTS_PER_RECORD,
    MAX_ENTRY_BYTES,
)


def parse_metadata(queue: str, bins: dict[str, Any]) -> Metadata:
    """Validate a metadata record's bins, naming the first problem found."""

    def corrupt(problem: str) -> errors.CorruptQueueError:
        return errors.CorruptQueueError(f"metadata record of queue {queue!r}: {problem}", queue=queue)

    if FORMAT not in bins:
        raise corrupt(
            f"it has no {FORMAT!r} bin, so this library did not write it (a queue of the original"
            " large_queue code, or another program's record): it is left as it is; create a queue under"
            " another name"
        )
    for name in _INTEGER_BINS:
        if name not in bins:
            raise corrupt(f"bin {name!r} is missing")
        if type(bins[name]) is not int:
            raise corrupt(f"bin {name!r} holds {type(bins[name]).__name__}, not an integer")
    for name in (LOCK_OWNER, BUFFER_NAMESPACE):
        if not isinstance(bins.get(name), str):
            raise corrupt(f"bin {name!r} is missing or not a string")
    if bins[FORMAT] not in FORMATS:
        raise corrupt(
            f"format version {bins[FORMAT]} is not supported"
            f" (this library reads {', '.join(map(str, FORMATS))})"
        )
    encoding = bins.get(ENCODING) if bins[FORMAT] != FORMAT_VERSION else NATIVE
    reserved = bins[FORMAT] in RESERVED_FORMATS
    marked = bins[FORMAT] == MARKED_FORMAT_VERSION
    for name in (HOLE_MS, PUBLISHED, *((SKIPPED_TO,) if marked else ())) if reserved else ():
        if type(bins.get(name)) is not int:
            raise corrupt(f"bin {name!r} is missing or not an integer")
    for name in (RECEIPT_KEEP, RECEIPT_AGE_MS, MAX_AGE_MS):
        if name in bins and (type(bins[name]) is not int or bins[name] < 1):
            raise corrupt(f"bin {name!r} holds {bins[name]!r}, not a positive integer")
    if encoding not in ENCODINGS:
        raise corrupt(f"entry encoding {encoding!r} is not supported (known: {', '.join(ENCODINGS)})")
    incarnation = bins.get(INCARNATION)
    if incarnation is not None and not isinstance(incarnation, str):
        raise corrupt(f"bin {INCARNATION!r} holds {type(incarnation).__name__}, not a string")
    if bins[READY] != 1:
        raise errors.CorruptQueueError(
            f"queue {queue!r} was not completely created; delete it and create it again", queue=queue
        )
    if bins[RECORD_COUNT] < 1 or bins[SLOTS_PER_RECORD] < 1:
        raise corrupt("record count and slots per record must be positive")
    shape = QueueShape(record_count=bins[RECORD_COUNT], slots_per_record=bins[SLOTS_PER_RECORD])
    head, tail = bins[HEAD], bins[TAIL]
    if not 0 <= head <= tail <= head + shape.capacity:
        raise corrupt(f"head {head} and tail {tail} break 0 <= head <= tail <= head + {shape.capacity}")
    if reserved and bins[PUBLISHED] > tail:
        raise corrupt(f"bin {PUBLISHED!r} holds {bins[PUBLISHED]}, past the tail {tail}")
    return Metadata(
        shape=shape,
        head=head,
        tail=tail,
        buffer_namespace=bins[BUFFER_NAMESPACE],
        lock_owner=bins[LOCK_OWNER],
        lock_ttl_ms=bins[LOCK_TTL_MS],
        fence_epoch=bins[FENCE_EPOCH],
        fence_counter=bins[FENCE_COUNTER],
        max_entry_bytes=bins[MAX_ENTRY_BYTES],
        encoding=encoding,
        incarnation=incarnation,
        appends=RESERVED_APPENDS if reserved else LOCKED_APPENDS,
        hole_timeout_ms=bins[HOLE_MS] if reserved else 0,
        published=bins[PUBLISHED] if reserved else 0,
        groups=tuple(bins.get(GROUPS) or ()),
        receipt_keep=bins.get(RECEIPT_KEEP, DEFAULT_RECEIPT_KEEP),
        receipt_age_ms=bins.get(RECEIPT_AGE_MS, int(DEFAULT_RECEIPT_AGE * 1000)),
        max_age_ms=bins.get(MAX_AGE_MS),
        marked=marked,
    )


def empty_buffer(
    slots_per_record: int, token: tuple[int, int], incarnation: str | None, *, reserved: bool = False
) -> dict[str, Any]:
    """The bins of a buffer record with no entries, marked as written by ``token``.

    ``reserved``: for a format-3 queue, whose empty slots are ``[-1]``.
    """
    empty = EMPTY_SLOT if reserved else None
    bins: dict[str, Any] = {FENCE_EPOCH: token[0], FENCE_COUNTER: token[1], SLOTS: [empty] * slots_per_record}
    if incarnation is not None:
        bins[INCARNATION] = incarnation
    return bins


def slot_entry(queue: str, record: int, slot: Any, offset: int, encoding: str) -> tuple[Any, int] | None:
    """``(value, enqueued_at_ms)`` if ``slot`` holds ``offset``'s entry, else None.

    The value is decoded as the queue's ``encoding`` stores entries.
    """
    if slot is None:
        return None
    if not isinstance(slot, list) or len(slot) not in (1, 3, 4) or type(slot[0]) is not int:
        raise errors.CorruptQueueError(
            f"buffer record {record} of queue {queue!r} holds a malformed slot for offset {offset}",
            queue=queue,
        )
    if slot[0] != offset or len(slot) == 1:  # another lap's, or (format 3) empty or closed
        return None
    try:
        return decode_entry(encoding, slot[1]), slot[2]
    except ValueError as exc:
        raise errors.CorruptQueueError(
            f"buffer record {record} of queue {queue!r} holds no valid entry for offset {offset}: {exc}",
            queue=queue,
        ) from None
