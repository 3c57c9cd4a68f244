"""The queue: a circular buffer over one metadata record and many buffer records.

Enqueue and dequeue take the queue lock (one command that also reads head,
tail and a fencing token), touch each buffer record they need once (one
``operate`` with several list operations, guarded by fencing), and publish
the new head/tail in one guarded commit that also releases the lock. A batch
shares the lock and the commit, so a batch of n entries costs
``2 + buffer records touched`` round trips. Offset reads take no lock.

Dequeued slots are erased, but never by the dequeue that delivers them:
a dequeuer whose lock is broken while it is paused would otherwise erase an
entry that is still at the head. Instead every dequeue erases the slots of
the buffer records it reads that lie below the head it read (dead for good,
because the head only grows) and that no earlier dequeue erased: the
metadata record keeps ``erased_below``, written by each dequeue's commit.
A dequeued value therefore stays in the store at most until the next dequeue
from its record or until its slot is reused, and a dequeue sends only the
erasures it newly makes (a run of slots is one range operation).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from large_queue import _records as rec
from large_queue import errors
from large_queue._entries import (
    NATIVE,
    RECORD_OVERHEAD_BYTES,
    SLOT_OVERHEAD_BYTES,
    check_encoding,
    check_entries,
    max_entry_bytes,
)
from large_queue._frozen import frozen
from large_queue._stats import Counters, QueueStats
from large_queue.backends import (
    Backend,
    ListGetRange,
    ListSetRange,
    Operation,
    RecordKey,
    Write,
    WriteMode,
    connect,
)
from large_queue.backends.conditions import Condition
from large_queue.fencing import DEFAULT_COUNTER_LIMIT, mark, no_newer_writer, same_queue
from large_queue.lock import LockGrant, LockPolicy, QueueLock

if TYPE_CHECKING:
    from large_queue.cluster import Consumer

log = logging.getLogger("large_queue")

MAX_TXN_ID_CHARS = 128
#: tries of an (idempotent) buffer command that times out
BUFFER_ATTEMPTS = 3
MIN_ENTRY_BYTES = 16
MIN_RECORD_SIZE_LIMIT = 8192
# the default number of slots per record leaves each slot at least this much room
DEFAULT_MIN_SLOT_BYTES = 1024
# Buffer records a queue may have. Creating and deleting a queue take one command per
# buffer record (about 100 s for a million on Aerospike here), and each record holds
# 64 bytes of Aerospike's primary index in memory on every node.
MAX_RECORD_COUNT = 1_000_000
#: a create records its progress every this many buffer records, so that deleting
#: an interrupted create touches only the records it made
CREATE_PROGRESS_EVERY = 1000


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One queue entry: its offset, its value and when it was enqueued (client ms)."""

    offset: int
    value: Any
    enqueued_at_ms: int


@dataclass(frozen=True, kw_only=True)
class QueueInfo:
    """A snapshot of a queue's metadata record."""

    name: str
    namespace: str
    buffer_namespace: str
    capacity: int
    head_offset: int
    tail_offset: int
    size: int
    slots_per_record: int
    record_count: int
    lock_owner: str | None
    lock_ttl: float
    max_entry_bytes: int
    encoding: str


def _new_process_id() -> None:
    global _process_id
    _process_id = os.urandom(8).hex()


# Default txn ids: a random id of this process and a counter, unique without a
# system call per operation (a forked child draws its own process id).
_process_id = ""
_new_process_id()
os.register_at_fork(after_in_child=_new_process_id)
_txn_counter = itertools.count()


class _ReleasingOnError:
    """Releases a grant's lock when the body fails before its commit, so others need not wait the TTL.

    Not after a lost lock (nothing to release) nor an in-doubt commit:
    releasing then could turn "maybe applied" into a wrong answer for
    nobody's benefit; that lock simply expires. (A class, not a generator:
    it is entered by every operation.)
    """

    def __init__(self, lock: QueueLock, grant: LockGrant) -> None:
        self.lock = lock
        self.grant = grant

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, (errors.LockLostError, errors.OutcomeUnknownError)):
            return
        try:
            self.lock.release(self.grant)
        except errors.LargeQueueError:
            log.debug("could not release the lock after an error", exc_info=True)


def _existing_buffers(metadata: dict[str, Any], name: str, namespace: str) -> Iterator[RecordKey]:
    """Keys of the buffer records a queue's metadata says exist (an interrupted create made only some)."""
    record_count = metadata.get(rec.RECORD_COUNT)
    buffer_namespace = metadata.get(rec.BUFFER_NAMESPACE, namespace)
    if type(record_count) is not int or not isinstance(buffer_namespace, str):
        return
    created = metadata.get(rec.CREATED)
    if metadata.get(rec.READY) != 1 and type(created) is int:
        record_count = min(record_count, created + CREATE_PROGRESS_EVERY)
    keys = rec.QueueKeys(name=name, metadata_namespace=namespace, buffer_namespace=buffer_namespace)
    for index in range(record_count):
        yield keys.buffer(index)


def _txn_id(txn_id: object) -> str:
    if txn_id is None:
        return f"{_process_id}-{next(_txn_counter)}"
    if type(txn_id) not in (int, str) or str(txn_id) == "":
        raise errors.InvalidArgumentError(f"txn_id must be a non-empty str or an int, got {txn_id!r}")
    text = str(txn_id)
    if len(text) > MAX_TXN_ID_CHARS:
        raise errors.InvalidArgumentError(f"txn_id is longer than {MAX_TXN_ID_CHARS} characters")
    return text


def _positive_int(name: str, value: object) -> int:
    if type(value) is not int or value < 1:
        raise errors.InvalidArgumentError(f"{name} must be a positive int, got {value!r}")
    return value


class Queue:
    """A durable FIFO queue far larger than one record.

    Example::

        store = large_queue.connect("embedded:///tmp/q.db")
        queue = Queue.create(store, "events", capacity=10_000)
        offset = queue.enqueue({"id": 1})
        entry = queue.dequeue()          # Entry(offset=0, value={'id': 1}, ...)

    ``store`` is anything :func:`large_queue.connect` accepts. Instances are
    cheap and safe to share between threads; every operation reads the
    current head and tail from the store.
    """

    def __init__(
        self,
        backend: Backend,
        name: str,
        metadata: rec.Metadata,
        *,
        namespace: str,
        lock_policy: LockPolicy = LockPolicy(),
        fence_counter_limit: int = DEFAULT_COUNTER_LIMIT,
    ) -> None:
        self.backend = backend
        self.name = name
        self.shape = metadata.shape
        self.keys = rec.QueueKeys(
            name=name, metadata_namespace=namespace, buffer_namespace=metadata.buffer_namespace
        )
        self.max_entry_bytes = metadata.max_entry_bytes
        self.encoding = metadata.encoding
        self.lock_ttl = metadata.lock_ttl_ms / 1000
        #: which creation of the queue this handle opened: every command it sends is refused in another
        self.incarnation = metadata.incarnation
        self.counters = Counters()
        self.lock = QueueLock(
            backend,
            self.keys,
            policy=lock_policy,
            counter_limit=fence_counter_limit,
            incarnation=metadata.incarnation,
            counters=self.counters,
        )

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, namespace={self.keys.metadata_namespace!r}, capacity={self.capacity})"

    @property
    def capacity(self) -> int:
        """How many entries the queue holds when full."""
        return self.shape.capacity

    # --- lifecycle ----------------------------------------------------------------

    @classmethod
    def create(
        cls,
        store: Any,
        name: str,
        *,
        capacity: int,
        slots_per_record: int | None = None,
        namespace: str | None = None,
        buffer_namespace: str | None = None,
        lock_ttl: float = 2.0,
        record_size_limit: int | None = None,
        lock_policy: LockPolicy = LockPolicy(),
        encoding: str = NATIVE,
    ) -> Queue:
        """Create a new queue; ``QueueExistsError`` if one of that name exists.

        ``capacity`` is rounded up to whole buffer records of
        ``slots_per_record`` slots. ``record_size_limit`` is how large a
        buffer record may grow: by default the store's own limit for the
        buffer namespace (Aerospike's ``max-record-size``), and never more;
        every entry must then fit ``record_size_limit / slots_per_record``
        bytes (``queue.max_entry_bytes``). The default ``slots_per_record``
        is the capacity, at most 100, and fewer where that leaves less than
        1 KiB a slot.
        ``lock_ttl`` (seconds) is how long a silent lock holder keeps the lock.
        ``encoding`` is how entries are stored: ``"native"`` (store values, any
        entry type) or ``"json"`` (JSON text: JSON's types only; Spark reads
        the text as it is, about 30% faster).
        """
        backend = connect(store)
        rec.check_name("queue name", name, rec.MAX_QUEUE_NAME_BYTES)
        namespace = rec.check_name(
            "namespace", namespace or backend.default_namespace, rec.MAX_NAMESPACE_BYTES
        )
        buffer_namespace = rec.check_name(
            "buffer namespace", buffer_namespace or namespace, rec.MAX_NAMESPACE_BYTES
        )
        _positive_int("capacity", capacity)
        encoding = check_encoding(encoding)
        if slots_per_record is not None:
            _positive_int("slots_per_record", slots_per_record)
        if type(lock_ttl) not in (int, float) or not 0.001 <= lock_ttl <= 86400:
            raise errors.InvalidArgumentError(f"lock_ttl must be 0.001 to 86400 seconds, got {lock_ttl!r}")
        if record_size_limit is not None and (
            type(record_size_limit) is not int or record_size_limit < MIN_RECORD_SIZE_LIMIT
        ):
            raise errors.InvalidArgumentError(
                f"record_size_limit must be an int of at least {MIN_RECORD_SIZE_LIMIT} bytes,"
                f" got {record_size_limit!r}"
            )
        store_limit = backend.max_record_bytes(buffer_namespace)
        if store_limit < MIN_RECORD_SIZE_LIMIT:
            raise errors.InvalidArgumentError(
                f"the store's records hold at most {store_limit} bytes in namespace {buffer_namespace!r};"
                f" a queue needs at least {MIN_RECORD_SIZE_LIMIT}"
            )
        if record_size_limit is None:
            record_size_limit = store_limit
        elif record_size_limit > store_limit:
            raise errors.InvalidArgumentError(
                f"record_size_limit={record_size_limit} is more than the store's records hold in namespace"
                f" {buffer_namespace!r} ({store_limit} bytes)"
            )
        if slots_per_record is None:
            fitting = (record_size_limit - RECORD_OVERHEAD_BYTES) // (
                DEFAULT_MIN_SLOT_BYTES + SLOT_OVERHEAD_BYTES
            )
            slots_per_record = max(1, min(capacity, 100, fitting))
        entry_limit = max_entry_bytes(record_size_limit, slots_per_record)
        if entry_limit < MIN_ENTRY_BYTES:
            raise errors.InvalidArgumentError(
                f"slots_per_record={slots_per_record} leaves {entry_limit} bytes per entry in a"
                f" {record_size_limit}-byte record; use fewer slots per record"
            )
        record_count = math.ceil(capacity / slots_per_record)
        if record_count > MAX_RECORD_COUNT:
            raise errors.InvalidArgumentError(
                f"capacity={capacity} needs {record_count:,} buffer records of {slots_per_record} slots;"
                f" a queue has at most {MAX_RECORD_COUNT:,} (creating and deleting it take a command per"
                " record, and each holds index memory on every node): use more slots per record or a"
                " smaller capacity",
            )
        keys = rec.QueueKeys(name=name, metadata_namespace=namespace, buffer_namespace=buffer_namespace)
        incarnation = os.urandom(8).hex()
        metadata_bins = {
            rec.FORMAT: rec.FORMAT_VERSION if encoding == NATIVE else rec.ENCODED_FORMAT_VERSION,
            rec.READY: 0,
            rec.CREATED: 0,
            rec.HEAD: 0,
            rec.TAIL: 0,
            rec.LOCK_OWNER: rec.NO_OWNER,
            rec.LOCK_TTL_MS: max(1, round(lock_ttl * 1000)),
            rec.FENCE_EPOCH: 0,
            rec.FENCE_COUNTER: 0,
            rec.RECORD_COUNT: record_count,
            rec.SLOTS_PER_RECORD: slots_per_record,
            rec.BUFFER_NAMESPACE: buffer_namespace,
            rec.MAX_ENTRY_BYTES: entry_limit,
            rec.INCARNATION: incarnation,
        }
        if encoding != NATIVE:
            metadata_bins[rec.ENCODING] = encoding
        # The create-only metadata write claims the name; buffers come next and
        # the queue becomes usable only when ``ready`` is set, so an interrupted
        # create is reported as such instead of looking like a broken queue.
        try:
            backend.put(keys.metadata, metadata_bins, mode=WriteMode.CREATE_ONLY)
        except errors.RecordExistsError:
            raise errors.QueueExistsError(
                f"queue {name!r} already exists in namespace {namespace!r}", queue=name
            ) from None
        empty_buffer = rec.empty_buffer(slots_per_record, (0, 0), incarnation)
        try:
            for index in range(record_count):
                backend.put(keys.buffer(index), empty_buffer)
                if (index + 1) % CREATE_PROGRESS_EVERY == 0:
                    backend.put(keys.metadata, {rec.CREATED: index + 1}, mode=WriteMode.UPDATE_ONLY)
        except BaseException:
            with contextlib.suppress(errors.LargeQueueError):  # what it can; a later delete does the rest
                cls.delete(backend, name, namespace=namespace)
            raise
        backend.put(keys.metadata, {rec.READY: 1}, mode=WriteMode.UPDATE_ONLY)
        return cls.open(backend, name, namespace=namespace, lock_policy=lock_policy)

    @classmethod
    def open(
        cls,
        store: Any,
        name: str,
        *,
        namespace: str | None = None,
        lock_policy: LockPolicy = LockPolicy(),
        fence_counter_limit: int = DEFAULT_COUNTER_LIMIT,
    ) -> Queue:
        """Open an existing queue; ``QueueNotFoundError`` if there is none."""
        backend = connect(store)
        rec.check_name("queue name", name, rec.MAX_QUEUE_NAME_BYTES)
        namespace = rec.check_name(
            "namespace", namespace or backend.default_namespace, rec.MAX_NAMESPACE_BYTES
        )
        metadata = cls._read_metadata(backend, name, namespace)
        return cls(
            backend,
            name,
            metadata,
            namespace=namespace,
            lock_policy=lock_policy,
            fence_counter_limit=fence_counter_limit,
        )

    @staticmethod
    def _read_metadata(backend: Backend, name: str, namespace: str) -> rec.Metadata:
        keys = rec.QueueKeys(name=name, metadata_namespace=namespace, buffer_namespace=namespace)
        try:
            record = backend.get(keys.metadata)
        except errors.CorruptRecordError as exc:
            raise errors.CorruptQueueError(
                f"the metadata record of queue {name!r} cannot be read ({exc})", queue=name
            ) from exc
        if record is None:
            raise errors.QueueNotFoundError(
                f"queue {name!r} does not exist in namespace {namespace!r}", queue=name
            )
        return rec.parse_metadata(name, record.bins)

    @staticmethod
    def names(store: Any, *, namespace: str | None = None) -> list[str]:
        """The names of the queues in ``namespace``, sorted: a scan, for administration.

        Each queue is the set holding its metadata record.
        """
        backend = connect(store)
        return backend.sets_holding(namespace or backend.default_namespace, rec.METADATA_KEY)

    @staticmethod
    def delete(store: Any, name: str, *, namespace: str | None = None) -> bool:
        """Delete a queue and all its records; False if it did not exist.

        The metadata record goes first, so no new operation can start on a
        half-deleted queue; then the buffer records and the cluster shim's
        records, so a queue created again under the name starts afresh.
        Buffer records left by an interrupted delete are replaced when a
        queue of that name is created again. A queue whose create was
        interrupted is deleted in proportion to the records that create made.
        """
        backend = connect(store)
        rec.check_name("queue name", name, rec.MAX_QUEUE_NAME_BYTES)
        namespace = rec.check_name(
            "namespace", namespace or backend.default_namespace, rec.MAX_NAMESPACE_BYTES
        )
        keys = rec.QueueKeys(name=name, metadata_namespace=namespace, buffer_namespace=namespace)
        try:
            record = backend.get(keys.metadata)
        except errors.CorruptRecordError:  # its shape is unreadable: buffers are removed until one is missing
            backend.remove(keys.metadata)
            index = 0
            while backend.remove(keys.buffer(index)):
                index += 1
        else:
            if record is None:
                return False
            backend.remove(keys.metadata)
            for key in _existing_buffers(record.bins, name, namespace):
                backend.remove(key)
        nodes = backend.get(keys.nodes)
        node_ids = nodes.bins.get(rec.NODES) if nodes is not None else None
        for node_id in node_ids if isinstance(node_ids, list) else []:
            if isinstance(node_id, str):
                backend.remove(keys.node(node_id))
        backend.remove(keys.nodes)
        backend.remove(keys.owner)
        return True

    # --- producing -------------------------------------------------------------------

    def enqueue(self, entry: Any, *, txn_id: str | int | None = None, overwrite_if_full: bool = False) -> int:
        """Append one entry; return its offset.

        ``QueueFullError`` if the queue is full, unless ``overwrite_if_full``,
        which drops the oldest entry instead. Costs 3 round trips.
        """
        return self.enqueue_batch([entry], txn_id=txn_id, overwrite_if_full=overwrite_if_full).start

    def enqueue_batch(
        self, entries: Iterable[Any], *, txn_id: str | int | None = None, overwrite_if_full: bool = False
    ) -> range:
        """Append entries under one lock and one commit; return their offsets.

        Either all entries are enqueued or none is. Every entry is checked
        (type and size) before anything is written.
        """
        values = check_entries(entries, self.max_entry_bytes, self.encoding)
        txn = _txn_id(txn_id)
        count = len(values)
        if count > self.capacity:
            raise errors.InvalidArgumentError(
                f"a batch of {count} entries does not fit queue {self.name!r} of capacity {self.capacity}"
            )
        if count == 0:
            return range(0)
        grant = self.lock.acquire(txn)
        with self._releasing_on_error(grant):
            grant, new_head, new_tail = self._write_entries(
                grant, values, overwrite_if_full=overwrite_if_full
            )
            offsets = range(new_tail - count, new_tail)
            self.lock.commit(grant, head=new_head, tail=new_tail, known={"offsets": offsets})
        self.counters.add(enqueue_calls=1, entries_enqueued=count)
        return offsets

    def _write_entries(
        self, grant: LockGrant, values: list[Any], *, overwrite_if_full: bool
    ) -> tuple[LockGrant, int, int]:
        """The middle step of an enqueue: write the slots, one command per record.

        Returns the (possibly renewed) grant and the head and tail to commit.
        """
        head, tail = grant.head, grant.tail
        count = len(values)
        if tail + count - head > self.capacity and not overwrite_if_full:
            raise errors.QueueFullError(
                f"queue {self.name!r} has {self.capacity - (tail - head)} free slots,"
                f" {count} requested (capacity {self.capacity})",
                queue=self.name,
            )
        new_tail = tail + count
        now_ms = time.time_ns() // 1_000_000
        for record, runs in self.shape.runs(tail, new_tail).items():
            writes = [
                self._slot_writes(self.shape.slot_of(run.start), [[o, values[o - tail], now_ms] for o in run])
                for run in runs
            ]
            grant, _ = self._buffer_command(grant, record, writes, read=None)
        return grant, max(head, new_tail - self.capacity), new_tail

    # --- consuming -------------------------------------------------------------------

    def dequeue(self, *, txn_id: str | int | None = None) -> Entry | None:
        """Remove and return the head entry, or None if the queue is empty. 3 round trips."""
        taken = self.dequeue_batch(1, txn_id=txn_id)
        return taken[0] if taken else None

    def dequeue_batch(self, max_entries: int, *, txn_id: str | int | None = None) -> list[Entry]:
        """Remove and return up to ``max_entries`` entries from the head, in order.

        An entry whose slot was overwritten by a later lap (possible only with
        ``overwrite_if_full``) is skipped and logged; the call then goes on
        until it returns at least one entry or finds the queue empty.
        """
        _positive_int("max_entries", max_entries)
        txn = _txn_id(txn_id)
        while True:
            taken, skipped = self._dequeue_once(max_entries, txn)
            if taken or not skipped:
                return taken

    def _dequeue_once(self, max_entries: int, txn: str) -> tuple[list[Entry], int]:
        grant = self.lock.acquire(txn)
        with self._releasing_on_error(grant):
            grant, taken, skipped, new_head = self._read_entries(grant, max_entries)
            self.lock.commit(grant, head=new_head, erased_below=grant.head, known={"entries": taken})
        self.counters.add(dequeue_calls=1, entries_dequeued=len(taken), entries_overwritten=skipped)
        if skipped:  # only now is it certain: a holder whose lock broke may see reused slots
            log.warning("queue %r: %d entries were overwritten before they were dequeued", self.name, skipped)
        return taken, skipped

    def _read_entries(self, grant: LockGrant, max_entries: int) -> tuple[LockGrant, list[Entry], int, int]:
        """The middle step of a dequeue: read the head entries, one command per record.

        Also erases this record's slots below the head. Returns the (possibly
        renewed) grant, the entries in offset order, how many slots no longer
        held their entry, and the head to commit.
        """
        head, tail = grant.head, grant.tail
        stop = head + min(max_entries, tail - head)
        taken: list[Entry] = []
        skipped = 0
        erasable = self.shape.runs(self._first_erasable(grant), head)
        by_record = self.shape.runs(head, stop)
        for record, runs in by_record.items():
            first = min(self.shape.slot_of(run.start) for run in runs)
            last = max(self.shape.slot_of(run[-1]) for run in runs)
            erase = [
                self._slot_writes(self.shape.slot_of(run.start), [None] * len(run))
                for run in erasable.get(record, ())
            ]
            grant, slots = self._buffer_command(
                grant, record, erase, read=ListGetRange(rec.SLOTS, first, last - first + 1)
            )
            native = self.encoding == NATIVE
            for run in runs:
                index = self.shape.slot_of(run.start) - first
                for offset in run:
                    slot = slots[index]
                    index += 1
                    # the common case, checked inline; anything else goes through slot_entry
                    if (
                        native
                        and type(slot) is list
                        and len(slot) == 3
                        and slot[0] == offset
                        and type(slot[0]) is int
                    ):
                        taken.append(frozen(Entry, offset=offset, value=slot[1], enqueued_at_ms=slot[2]))
                        continue
                    found = rec.slot_entry(self.name, record, slot, offset, self.encoding)
                    if found is None:
                        skipped += 1
                    else:
                        taken.append(frozen(Entry, offset=offset, value=found[0], enqueued_at_ms=found[1]))
        if any(len(runs) > 1 for runs in by_record.values()):
            taken.sort(key=lambda entry: entry.offset)  # a record's second run came before other records'
        return grant, taken, skipped, stop

    def _first_erasable(self, grant: LockGrant) -> int:
        """The lowest dequeued offset whose slot may still hold its value and may be erased.

        Offsets below ``erased_below`` were erased by earlier dequeues; a slot
        more than one record's worth below the head is left to be reused;
        ``o + capacity >= tail`` means no committed entry has taken the slot since.
        """
        return max(
            0, grant.erased_below, grant.head - self.shape.slots_per_record, grant.tail - self.capacity
        )

    def stats(self) -> QueueStats:
        """What this handle has done and met since it was opened (see :class:`QueueStats`)."""
        return self.counters.snapshot()

    # --- sharing between nodes ----------------------------------------------------------

    def consumer(
        self, node_id: str, *, time_slice: float = 5.0, timeout: float = 10.0, **options: Any
    ) -> Consumer:
        """A consumer for node ``node_id`` that shares this queue with other nodes.

        Use it as a context manager; see :class:`large_queue.cluster.Consumer`.
        Do not dequeue directly from a queue that nodes share this way.
        """
        from large_queue.cluster import Consumer

        return Consumer(self, node_id, time_slice=time_slice, timeout=timeout, **options)

    # --- reading without the lock --------------------------------------------------------

    def get(self, offset: int) -> Entry | None:
        """The entry at ``offset`` if it is in the queue now, else None. Takes no lock.

        None when ``offset`` is outside [head, tail) or its slot already holds
        another lap's entry. Costs 2 round trips (metadata, then one slot).
        """
        if type(offset) is not int or offset < 0:
            raise errors.InvalidArgumentError(f"offset must be a non-negative int, got {offset!r}")
        metadata = self._current_metadata()
        if not metadata.head <= offset < metadata.tail:
            return None
        record = self.shape.record_of(offset)
        slot_index = self.shape.slot_of(offset)
        self.counters.add(commands=1)
        result = self.backend.operate(self.keys.buffer(record), [ListGetRange(rec.SLOTS, slot_index, 1)])
        slots = result.get(rec.SLOTS)
        if not isinstance(slots, list) or len(slots) != 1:
            raise errors.CorruptQueueError(
                f"buffer record {record} of queue {self.name!r} has no slot {slot_index}", queue=self.name
            )
        found = rec.slot_entry(self.name, record, slots[0], offset, self.encoding)
        return None if found is None else Entry(offset=offset, value=found[0], enqueued_at_ms=found[1])

    def info(self) -> QueueInfo:
        """Name, namespaces, shape, head, tail, size and lock holder, as stored now."""
        metadata = self._current_metadata()
        return QueueInfo(
            name=self.name,
            namespace=self.keys.metadata_namespace,
            buffer_namespace=metadata.buffer_namespace,
            capacity=metadata.shape.capacity,
            head_offset=metadata.head,
            tail_offset=metadata.tail,
            size=metadata.tail - metadata.head,
            slots_per_record=metadata.shape.slots_per_record,
            record_count=metadata.shape.record_count,
            lock_owner=metadata.lock_owner or None,
            lock_ttl=metadata.lock_ttl_ms / 1000,
            max_entry_bytes=metadata.max_entry_bytes,
            encoding=metadata.encoding,
        )

    def _current_metadata(self) -> rec.Metadata:
        """The metadata record now; ``QueueNotFoundError`` if the queue is not the one this handle opened."""
        self.counters.add(commands=1)
        metadata = self._read_metadata(self.backend, self.name, self.keys.metadata_namespace)
        if metadata.incarnation != self.incarnation:
            raise self.lock.replaced_error(created_again=True)
        return metadata

    # --- buffer access under the lock ------------------------------------------------------

    def _slot_writes(self, first_slot: int, slots: list[Any]) -> ListSetRange | Write:
        """The operation that sets a run of slots: the whole bin when the run is the whole record.

        Replacing the bin spares Aerospike a list edit (and the client half the operations).
        """
        if first_slot == 0 and len(slots) == self.shape.slots_per_record:
            return Write(rec.SLOTS, slots)
        return ListSetRange(rec.SLOTS, first_slot, slots)

    def _buffer_command(
        self, grant: LockGrant, record: int, writes: list[ListSetRange | Write], *, read: ListGetRange | None
    ) -> tuple[LockGrant, list[Any]]:
        """One command on a buffer record under the lock, renewing the lock first when due.

        Renews when half the lock TTL has passed (long batches). Returns the
        (possibly renewed) grant and the slots read.
        """
        if time.monotonic() - grant.acquired_at > self.lock_ttl / 2:
            grant = self.lock.renew(grant)
        return grant, self._fenced_command(grant, record, writes, read=read)

    def _fenced_command(
        self, grant: LockGrant, record: int, writes: list[ListSetRange | Write], *, read: ListGetRange | None
    ) -> list[Any]:
        """Fenced writes, then a read, on one buffer record; returns the slots read.

        ``LockLostError`` if a later holder's token has written the record.
        """
        operations: list[Operation] = [*writes, *mark(grant.token)] if writes else []
        if read is not None:
            operations.append(read)
        if writes:
            guard: Condition | None = no_newer_writer(grant.token, self.incarnation)
        else:
            guard = None if self.incarnation is None else same_queue(self.incarnation)
        try:
            result = self._retrying_timeouts(self.keys.buffer(record), operations, guard)
        except errors.ConditionNotMetError:
            replaced = self.lock.replaced()
            if replaced is not None:
                raise replaced from None
            self.counters.add(fencing_refusals=1, locks_lost=1)
            raise errors.LockLostError(
                f"txn {grant.txn_id!r} lost the lock of queue {self.name!r}: a later holder"
                f" (token > {grant.token}) has written buffer record {record}; nothing was committed",
                queue=self.name,
                txn_id=grant.txn_id,
            ) from None
        except errors.RecordNotFoundError:
            raise self.lock.replaced() or errors.CorruptQueueError(
                f"buffer record {record} of queue {self.name!r} is missing", queue=self.name
            ) from None
        except errors.CorruptRecordError as exc:
            raise errors.CorruptQueueError(
                f"buffer record {record} of queue {self.name!r} cannot be read ({exc}); its other records"
                " can (large-queue check names what is damaged)",
                queue=self.name,
                record=record,
            ) from exc
        slots: list[Any] = result.get(rec.SLOTS, [])
        if read is not None and not isinstance(slots, list):
            raise errors.CorruptQueueError(
                f"buffer record {record} of queue {self.name!r} has no slot list", queue=self.name
            )
        return slots

    def _retrying_timeouts(
        self, key: RecordKey, operations: list[Operation], guard: Condition | None
    ) -> dict[str, Any]:
        """Run an idempotent buffer command, repeating it if it times out.

        A buffer command sets slots and fencing marks to absolute values, so
        applying it twice is the same as once; nothing it does is visible
        before the commit. Other errors are not retried.
        """
        for attempt in range(1, BUFFER_ATTEMPTS + 1):
            self.counters.add(commands=1)
            try:
                return self.backend.operate(key, operations, condition=guard)
            except errors.BackendTimeoutError:
                if attempt == BUFFER_ATTEMPTS:
                    raise
                self.counters.add(timeouts_repeated=1)
        raise AssertionError("BUFFER_ATTEMPTS must be positive")

    def _releasing_on_error(self, grant: LockGrant) -> _ReleasingOnError:
        """Release the lock if the body fails before its commit, so others need not wait the TTL."""
        return _ReleasingOnError(self.lock, grant)
