"""The queue: a circular buffer over one metadata record and many buffer records.

Producers append in one of two ways, chosen when the queue is made. By
default (``appends="reserve"``, :mod:`large_queue.appends`) they take no
lock: one command on the metadata record reserves the offsets, then one
command per buffer record publishes the entries into their slots, guarded
by the slots themselves, so a batch of n entries costs ``1 + buffer records
touched`` round trips. With ``appends="lock"`` (the reference protocol) an
enqueue takes the queue lock (one command that also reads head, tail and a
fencing token), touches each buffer record it needs once (one ``operate``
with several list operations, guarded by fencing), and publishes the new
tail in one guarded commit that also releases the lock: ``2 + buffer records
touched``. A dequeue takes the lock in the same way, unless what it read
ahead lets it take its entries with one command and no lock
(:mod:`large_queue._quick_take`). Offset reads take no lock.

Dequeued slots are erased, but never by the dequeue that delivers them:
a dequeuer whose lock is broken while it is paused would otherwise erase an
entry that is still at the head. Instead every dequeue erases the slots of
the buffer records it reads that lie below the head it read (dead for good,
because the head only grows) and that no earlier dequeue erased: the
metadata record keeps ``erased_below``, written by each dequeue's commit.
A dequeued value therefore stays in the store at most until the next dequeue
from its record or until its slot is reused, and a dequeue sends only the
erasures it newly makes (a run of slots is one range operation). The
dequeues themselves live in :mod:`large_queue._dequeue`, the fenced buffer
commands under the lock in :mod:`large_queue._locked`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from large_queue import _dequeue, _lifecycle, _locked, _receipts, _retention, errors
from large_queue import _records as rec
from large_queue._entries import (
    DEFAULT_ENCODING,
    MSGPACK,
    NATIVE,
    check_entries,
    check_entry,
    decode_entry,
    entries_of,
)
from large_queue._entries import Entry as Entry  # the entry a dequeue returns, at home here for users
from large_queue._frozen import frozen
from large_queue._lifecycle import flag, positive_int, seconds
from large_queue._msgpack import unpack
from large_queue._quick_take import QuickTakes
from large_queue._read_ahead import ReadAhead
from large_queue._stats import Counters, QueueStats
from large_queue._txn import txn_id as _txn_id
from large_queue._waiting import IdlePoller
from large_queue.appends import Appender, dropped
from large_queue.appends._prefix import HoleWatch
from large_queue.appends._reader import PrefixReader
from large_queue.backends import (
    Backend,
    connect,
)
from large_queue.fencing import DEFAULT_COUNTER_LIMIT
from large_queue.lock import LockGrant, LockPolicy, QueueLock
from large_queue.producer import DEFAULT_MAX_BATCH

if TYPE_CHECKING:
    import datetime

    from large_queue.cluster import Consumer, GroupInfo
    from large_queue.producer import Producer


#: how new queues append unless told otherwise
DEFAULT_APPENDS = rec.RESERVED_APPENDS


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
    appends: str = rec.LOCKED_APPENDS  #: "reserve" or "lock": how producers append
    reserved_tail: int = 0  #: the end of the offsets producers have reserved (= tail_offset under the lock)
    hole_timeout: float | None = None  #: seconds a reader waits on an unpublished reservation ("reserve")
    max_age: float | None = None  #: seconds an entry is kept after its enqueue (None: however old)
    groups: tuple[GroupInfo, ...] = ()  #: the consumer groups: cursors, lag, in flight, lost, dead-lettered
    #: what keeps readers from the published prefix's end (a buffer record that cannot be read):
    #: ``tail_offset`` and ``size`` then stop at what is known settled. None: nothing found
    damaged: str | None = None


class Queue:
    """A durable FIFO queue far larger than one record.

    Example::

        store = large_queue.connect("embedded:///tmp/q.db")
        queue = Queue.create(store, "events", capacity=10_000)
        offset = queue.enqueue({"id": 1})
        entry = queue.dequeue()          # Entry(offset=0, value={'id': 1}, ...)

    ``store`` is anything :func:`large_queue.connect` accepts. Instances are
    cheap and safe to share between threads; every operation reads the
    current head and tail from the store, or (a dequeue of entries read
    ahead) is refused by it where they are no longer what this handle left.
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
        if not isinstance(lock_policy, LockPolicy):
            raise errors.InvalidArgumentError(f"lock_policy must be a LockPolicy, got {lock_policy!r}")
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
        self._idle = IdlePoller()  # waiting dequeues of this handle poll no faster than it allows
        #: producers append by reserving offsets, without the lock (see :mod:`large_queue.appends`)
        self.reserved = metadata.reserved
        #: format 4: closers mark runs first, and head moves that may skip are recorded
        self.marked = metadata.marked
        self.hole_timeout = metadata.hole_timeout_ms / 1000
        #: the receipt log's bounds and operations (see :mod:`large_queue._receipts`)
        self.receipts = _receipts.Receipts(metadata.receipt_keep, metadata.receipt_age_ms)
        #: entries older than this (ms, by the store's clock) leave from the head (None: kept however old)
        self.max_age_ms = metadata.max_age_ms
        self.lock = QueueLock(
            backend,
            self.keys,
            policy=lock_policy,
            counter_limit=fence_counter_limit,
            incarnation=metadata.incarnation,
            counters=self.counters,
            stamped=metadata.reserved,
        )
        self.appender = Appender(
            backend,
            self.keys,
            self.shape,
            incarnation=metadata.incarnation or "",
            counters=self.counters,
            closed_mark=self.receipts.closed_run,
            marked=metadata.marked,
        )
        self.prefix = PrefixReader(
            backend, self.keys, self.shape, self.appender, HoleWatch(self.hole_timeout), self.counters
        )
        #: entries this handle's dequeues read ahead (lock-free appends), taken later with no read
        self.read_ahead = ReadAhead()
        #: where this handle's last dequeue left the head: the guess of the next one's slots
        self.head_guess = _dequeue.HeadGuess(self, metadata.head, self.read_ahead)
        #: the token and head of this handle's last commit: its next dequeue may need no lock
        self.quick_takes = QuickTakes()
        #: the store's clock as this handle tells it between reads (consumers judge age by it)
        self.store_clock = _retention.StoreClock(self.appender.store_now)

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, namespace={self.keys.metadata_namespace!r}, capacity={self.capacity})"

    @property
    def holes(self) -> HoleWatch:
        """When this handle first saw each unpublished offset (readers close holes open too long)."""
        return self.prefix.watch

    @holes.setter
    def holes(self, watch: HoleWatch) -> None:
        self.prefix.watch = watch

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
        encoding: str = DEFAULT_ENCODING,
        appends: str = DEFAULT_APPENDS,
        hole_timeout: float = 2.0,
        receipts: int | None = None,
        receipt_ttl: float = rec.DEFAULT_RECEIPT_AGE,
        max_age: float | None = None,
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
        ``encoding`` is how entries are stored: ``"msgpack"`` (the default:
        each entry's msgpack bytes; the store's client converts one value a
        slot, so batches go faster), ``"native"`` (the store's own values,
        which other Aerospike clients read as they are; no NUL in a str) or
        ``"json"`` (JSON text: JSON's types only; Spark reads the text as it
        is). All three give back the same values (see :mod:`large_queue._entries`).
        ``appends`` is how producers append: ``"reserve"`` (two round trips,
        no lock: producers do not wait on each other; see
        :mod:`large_queue.appends`) or ``"lock"`` (three round trips under the
        queue lock: the reference protocol, readable by earlier versions of
        this library). ``hole_timeout`` (seconds, ``"reserve"`` only) is how
        long a reader waits on a reserved offset that is not published (its
        producer paused or died) before closing it.
        ``receipts`` (default 100, fewer where the metadata record is
        smaller) and ``receipt_ttl`` (seconds) bound the receipt log: the
        calls given a ``txn_id`` whose outcome the queue remembers (see
        :meth:`outcome`); a receipt takes about 40 bytes plus its txn id in
        the metadata record.
        ``max_age`` (seconds; default None, kept however old) is retention by
        age: an entry older than that, by the store's clock, is dropped from
        the head by the next operation that passes it (see :meth:`expire`).
        """
        backend = connect(store)
        namespace = _lifecycle.create(
            backend,
            name,
            capacity=capacity,
            slots_per_record=slots_per_record,
            namespace=namespace,
            buffer_namespace=buffer_namespace,
            lock_ttl=lock_ttl,
            record_size_limit=record_size_limit,
            encoding=encoding,
            appends=appends,
            hole_timeout=hole_timeout,
            receipts=receipts,
            receipt_ttl=receipt_ttl,
            max_age=max_age,
        )
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
        return _lifecycle.read_metadata(backend, name, namespace)

    @staticmethod
    def names(store: Any, *, namespace: str | None = None) -> list[str]:
        """The names of the queues in ``namespace``, sorted: a scan, for administration.

        Each queue is the set holding its metadata record.
        """
        backend = connect(store)
        namespace = rec.check_name(
            "namespace", namespace or backend.default_namespace, rec.MAX_NAMESPACE_BYTES
        )
        return backend.sets_holding(namespace, rec.METADATA_KEY)

    @staticmethod
    def delete(store: Any, name: str, *, namespace: str | None = None) -> bool:
        """Delete a queue and all its records; False if it did not exist.

        The metadata record is marked first, so no new operation can start on
        a half-deleted queue (opens and handles find it gone); then the buffer
        records and the cluster shim's records go, and the metadata record
        last. A delete interrupted on the way leaves the marked record, which
        ``names`` still lists: deleting it again finishes the job. A queue whose create was
        interrupted is deleted in proportion to the records that create made.
        """
        return _lifecycle.delete(connect(store), name, namespace)

    # --- producing -------------------------------------------------------------------

    def enqueue(self, entry: Any, *, txn_id: str | int | None = None, overwrite_if_full: bool = False) -> int:
        """Append one entry; return its offset.

        ``QueueFullError`` if the queue is full, unless ``overwrite_if_full``,
        which drops the oldest entry instead (counted in ``stats().entries_overwritten``
        and logged at INFO). Costs 3 round trips (2 where
        producers append without the lock). With ``txn_id`` the call is
        idempotent: see :meth:`enqueue_batch`.
        """
        checked = check_entry(entry, self.max_entry_bytes, self.encoding)
        overwriting = flag("overwrite_if_full", overwrite_if_full)
        return self._append_checked([checked], txn_id=txn_id, overwrite_if_full=overwriting).start

    def enqueue_batch(
        self, entries: Iterable[Any], *, txn_id: str | int | None = None, overwrite_if_full: bool = False
    ) -> range:
        """Append entries; return their offsets.

        Either all entries are enqueued or none is. Every entry is checked
        (type and size) before anything is written. Costs 2 + buffer records
        touched round trips under the lock, or 1 + buffer records touched
        where producers append without it (``appends="reserve"``); on
        Aerospike, which sends the records before the last in one batch
        command, at most 3.

        ``txn_id`` (your id for this call, unique per call; an int is its decimal text) makes it
        idempotent: the call leaves a receipt, and a call whose ``txn_id``
        already has one writes nothing and returns the first call's offsets,
        so a call that failed or timed out in doubt can simply be made again
        (see :meth:`outcome`). The same ``txn_id`` with another batch size,
        or one that named a dequeue, is ``InvalidArgumentError``.
        """
        values = check_entries(entries, self.max_entry_bytes, self.encoding)
        overwriting = flag("overwrite_if_full", overwrite_if_full)
        return self._append_checked(values, txn_id=txn_id, overwrite_if_full=overwriting)

    def _enqueue_as(self, entry: Any, holder: str | int, overwrite_if_full: bool) -> int:
        """An enqueue whose txn id names the lock holder only, as the reference API's does (no receipt)."""
        values = [check_entry(entry, self.max_entry_bytes, self.encoding)]
        overwriting = flag("overwrite_if_full", overwrite_if_full)
        return self._append_checked(values, txn_id=holder, overwrite_if_full=overwriting, receipt=False).start

    def _dequeue_as(self, holder: str | int) -> Entry | None:
        """A dequeue whose txn id names the lock holder only, as the reference API's does (no receipt)."""
        taken = _dequeue.now(self, 1, _txn_id(holder), False)
        return taken[0] if taken else None

    def _append_checked(
        self,
        values: list[Any],
        *,
        txn_id: str | int | None = None,
        overwrite_if_full: bool = False,
        receipt: bool = True,
    ) -> range:
        """:meth:`enqueue_batch` of entries already checked (as ``check_entries`` returns them).

        ``receipt=False``: ``txn_id`` names the lock holder only.
        """
        count = len(values)
        if count > self.capacity:
            raise errors.InvalidArgumentError(
                f"a batch of {count} entries does not fit queue {self.name!r} of capacity {self.capacity}"
            )
        if count == 0:
            if txn_id is not None:  # nothing to write, but a bad id is still refused
                _txn_id(txn_id)
            return range(0)
        try:
            return self._append_now(values, txn_id, overwrite_if_full, receipt)
        except errors.QueueFullError:
            if not _retention.made_room(self):  # no entry old enough to leave: full it is
                raise
        return self._append_now(values, txn_id, overwrite_if_full, receipt)

    def _append_now(
        self, values: list[Any], txn_id: str | int | None, overwrite_if_full: bool, receipt: bool
    ) -> range:
        """One attempt of :meth:`_append_checked` (``QueueFullError`` if there is no room now)."""
        count = len(values)
        mine = receipt and txn_id is not None
        if self.reserved:
            if mine:  # counted there: a call answered from its receipt enqueued nothing
                txn = _txn_id(txn_id)
                try:
                    return _receipts.append_once(self, values, txn, overwrite_if_full)
                except errors.OutcomeUnknownError as exc:
                    exc.txn_id = exc.txn_id or txn  # the publish's, which names no txn
                    raise
            if txn_id is not None:  # it names nothing here (no lock), but a bad one is still refused
                _txn_id(txn_id)
            with self.backend.grouped():  # on the embedded store, one transaction: no hole for others to see
                first, now_ms = self.appender.reserve_stamped(count, overwrite=overwrite_if_full)
                self.appender.publish(first, values, now_ms)
            self.counters.add(enqueue_calls=1, entries_enqueued=count)
            return range(first, first + count)
        txn = _txn_id(txn_id)
        with self.lock.holding(txn, receipt=mine) as grant:
            if grant.receipt is not None:
                return self._repeated(grant, _receipts.ENQUEUE, count).offsets
            grant, new_head, new_tail = _locked.write_entries(
                self, grant, values, overwrite_if_full=overwrite_if_full
            )
            offsets = range(new_tail - count, new_tail)
            put = self.receipts.committed(txn, _receipts.ENQUEUE, offsets) if mine else None
            self.lock.commit(grant, head=new_head, tail=new_tail, receipt=put, known={"offsets": offsets})
        dropped(self.counters, self.name, grant.head, new_head)
        self.counters.add(enqueue_calls=1, entries_enqueued=count)
        return offsets

    def _repeated_dequeue(self, grant: LockGrant) -> list[Entry]:
        """A dequeue whose txn already has a receipt: the entries the first call removed."""
        return _receipts.repeated_dequeue(self, self._repeated(grant, _receipts.DEQUEUE, None))

    def _repeated(self, grant: LockGrant, operation: str, count: int | None) -> _receipts.Receipt:
        """A call whose txn already has a receipt: release the lock and return the receipt (checked)."""
        assert grant.receipt is not None
        receipt = _receipts.parse(self.name, grant.txn_id, grant.receipt)
        self.lock.release(grant)
        _receipts.check_repeat(self, receipt, operation, count)
        self.counters.bump("repeats_answered")
        return receipt

    def outcome(self, txn_id: str | int, *, within: float | None = None) -> _receipts.Outcome:
        """What became of the call that carried ``txn_id``: committed, pending, not committed or unknown.

        One read of the metadata record (and, for a lock-free enqueue, of one
        slot). ``within``: the call was made at most that many seconds ago
        (default: the receipt TTL); "not committed" is answered only if the
        receipt log still covers that long, else "unknown". See
        :class:`large_queue.Outcome`.
        """
        if txn_id is None:
            raise errors.InvalidArgumentError("outcome needs the txn_id the call carried, got None")
        if within is not None:
            within = seconds("within", within, zero=True, most=_retention.MAX_AGE_LIMIT)
        return _receipts.outcome(self, _txn_id(txn_id), within)

    def producer(
        self,
        *,
        linger: float = 0.005,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_pending: int = 10_000,
        overwrite_if_full: bool = False,
        idempotent: bool = False,
    ) -> Producer:
        """A producer that appends single entries sent from many threads in batches.

        Use it as a context manager; see :class:`large_queue.producer.Producer`.
        """
        from large_queue.producer import Producer

        return Producer(
            self,
            linger=linger,
            max_batch=max_batch,
            max_pending=max_pending,
            overwrite_if_full=overwrite_if_full,
            idempotent=idempotent,
        )

    # --- consuming -------------------------------------------------------------------

    def dequeue(self, *, txn_id: str | int | None = None, timeout: float | None = None) -> Entry | None:
        """Remove and return the head entry, or None if the queue is empty. 3 round trips.

        On a store that reads beside a write in one round trip (Aerospike), a
        queue with ``appends="reserve"`` reads the head's slots with the lock's
        acquire where this handle's last dequeue left the head: 2 round trips
        for a lone consumer. Such a read takes up to 16 slots ahead, and where
        nobody took the lock since this handle's last dequeue, the next ones
        take those entries without it: 1 round trip (:mod:`large_queue._quick_take`).

        ``timeout``: wait up to that many seconds for an entry (see :meth:`dequeue_batch`).
        """
        taken = self.dequeue_batch(1, txn_id=txn_id, timeout=timeout)
        return taken[0] if taken else None

    def dequeue_batch(
        self, max_entries: int, *, txn_id: str | int | None = None, timeout: float | None = None
    ) -> list[Entry]:
        """Remove and return up to ``max_entries`` entries from the head, in order.

        An entry whose slot was overwritten by a later lap (possible only with
        ``overwrite_if_full``) is skipped and logged; the call then goes on
        until it returns at least one entry or finds the queue empty.

        With ``timeout`` (seconds), an empty queue is watched until an entry
        is published or the time is up: one read of the metadata record per
        poll, polls backing off from 5 ms to 0.1 s (see :mod:`large_queue._waiting`:
        at most 10 a second however the calls come). A lock held by another
        consumer (one that died holding it, say), or an embedded store's file
        held by a process stopped inside a command, is waited for until the
        time is up too, not longer: then nothing is returned, as for an empty
        queue (``info()`` tells them apart). ``GroupsInUseError`` if the queue
        is consumed by consumer groups.
        """
        positive_int("max_entries", max_entries)
        txn = _txn_id(txn_id)
        if timeout is not None:
            timeout = seconds("timeout", timeout, zero=True, most=_retention.MAX_AGE_LIMIT)
        mine = txn_id is not None
        if not timeout:
            return _dequeue.now(self, max_entries, txn, mine)
        taken = self._dequeue_waiting(max_entries, txn, mine, time.monotonic() + timeout)
        self.counters.bump("dequeue_calls")  # once, however many polls and passes it took
        return taken

    def _dequeue_waiting(self, max_entries: int, txn: str, mine: bool, deadline: float) -> list[Entry]:
        while True:
            ready = True
            if self._idle.idle:  # one read of the metadata record tells whether a dequeue could find any
                if not self._idle.wait_turn(deadline):
                    return []
                ready = self._has_entries()
            try:
                taken = ready and _dequeue.now(self, max_entries, txn, mine, deadline=deadline, counted=False)
            except errors.LockNotAcquiredError:
                if time.monotonic() < deadline:
                    raise  # the acquire timeout, shorter than the caller's: as without a timeout
                return []
            if taken:
                self._idle.found_something()
                return taken
            self._idle.found_nothing()

    def _has_entries(self) -> bool:
        metadata = self.current_metadata()
        return metadata.tail > metadata.head

    def _entry_of(self, offset: int, found: tuple[Any, int]) -> Entry:
        """The entry of a slot already decoded by :func:`large_queue._records.slot_entry`."""
        return frozen(Entry, offset=offset, value=found[0], enqueued_at_ms=found[1])

    def _entries(self, settled: list[tuple[int, Any, int]]) -> list[Entry]:
        """The entries of settled ``(offset, stored value, enqueued_at_ms)`` rows, in their order."""
        if self.encoding == NATIVE:  # values as stored: no call per entry
            return entries_of(settled)
        if self.encoding == MSGPACK:
            try:
                return entries_of(settled, unpack)
            except (ValueError, TypeError):
                pass  # not bytes, or not msgpack: the call per entry below names its offset
        return [self._entry(*found) for found in settled]

    def _entry(self, offset: int, stored: Any, enqueued_at_ms: int) -> Entry:
        """The entry of a settled slot, its value decoded as the queue stores it."""
        if self.encoding == NATIVE:
            return frozen(Entry, offset=offset, value=stored, enqueued_at_ms=enqueued_at_ms)
        try:
            value = decode_entry(self.encoding, stored)
        except ValueError as exc:
            raise self.prefix.corrupt(offset, f"no valid entry for offset {offset}: {exc}") from None
        return frozen(Entry, offset=offset, value=value, enqueued_at_ms=enqueued_at_ms)

    def stats(self) -> QueueStats:
        """What this handle has done and met since it was opened (see :class:`QueueStats`)."""
        return self.counters.snapshot()

    # --- sharing between nodes ----------------------------------------------------------

    def consumer(
        self, node_id: str, *, time_slice: float = 5.0, timeout: float = 10.0, **options: Any
    ) -> Consumer:
        """A consumer for node ``node_id`` that shares this queue (or one of its groups) with other nodes.

        Use it as a context manager; see :class:`large_queue.cluster.Consumer`.
        With ``group="billing"`` it consumes as that consumer group (created
        on first use): every group sees every entry. Do not dequeue directly
        from a queue that nodes share without a group; one with groups refuses it.
        """
        from large_queue.cluster import Consumer

        return Consumer(self, node_id, time_slice=time_slice, timeout=timeout, **options)

    # --- consumer groups ----------------------------------------------------------------

    def create_group(self, name: str) -> bool:
        """Create consumer group ``name`` at the head (it sees every entry still queued); False if it exists.

        From then on the queue refuses destructive dequeues. 5 round trips under the queue lock (6 for
        the queue's first group, which also reads the ungrouped owner record).
        """
        from large_queue.cluster import _groups

        return _groups.create(self, name)

    def delete_group(self, name: str) -> bool:
        """Delete consumer group ``name`` and its cursor; False if there is none."""
        from large_queue.cluster import _groups

        return _groups.delete(self, name)

    def seek_group(self, name: str, to: int | str | datetime.datetime) -> int:
        """Move consumer group ``name``'s cursor: replay from an earlier offset, or skip ahead.

        ``to``: an offset (an int), ``"head"``, ``"tail"``, or a moment (an
        aware ``datetime``: the first entry enqueued at or after it).
        The group's owner is fenced and the next owner delivers from there;
        messages in flight are forgotten. Returns the new cursor. See
        :func:`large_queue.cluster._groups.seek`.
        """
        from large_queue.cluster import _groups

        return _groups.seek(self, name, to)

    def groups(self) -> list[GroupInfo]:
        """Every consumer group: owner, cursors, lag, in flight, lost and dead-lettered counts."""
        from large_queue.cluster import _groups

        return _groups.describe_all(self)

    def group(self, name: str) -> GroupInfo:
        """Consumer group ``name`` as stored now (``GroupNotFoundError`` if there is none)."""
        from large_queue.cluster import _groups

        return _groups.describe(self, name)

    # --- reading without the lock --------------------------------------------------------

    def get(self, offset: int) -> Entry | None:
        """The entry at ``offset`` if it is in the queue now, else None. Takes no lock.

        None when ``offset`` is outside [head, tail) or its slot already holds
        another lap's entry. Costs 2 round trips (metadata, then one slot).
        Where producers append without the lock, None also when ``offset`` is
        past the published prefix (a reserved offset before it, or it, is not
        yet published): readers see only the published prefix. An offset past
        what is known settled (the stored hint, or what this handle settled)
        is reached by settling the slots before it, a batch read of 64 buffer
        records at a time, and the hint is moved there (one more command).
        """
        from large_queue import _offset_reads

        if type(offset) is not int or offset < 0:
            raise errors.InvalidArgumentError(f"offset must be a non-negative int, got {offset!r}")
        return _offset_reads.get(self, offset)

    def peek(self, max_entries: int = 100, *, start: int | None = None) -> list[Entry]:
        """Up to ``max_entries`` entries from the head (or from offset ``start``) on, without taking them.

        Takes no lock and writes nothing: the entries stay for consumers. In
        offset order; offsets below the head, closed reservations and slots
        a later lap took are passed over, and the read stops at the end of
        the published prefix, so fewer come back only where the queue ends
        first. A later peek from the offset after the last entry goes on
        where this one stopped. Costs 2 round trips for up to 64 buffer
        records (see :mod:`large_queue._offset_reads`).
        """
        from large_queue import _offset_reads

        positive_int("max_entries", max_entries)
        if start is not None and (type(start) is not int or start < 0):
            raise errors.InvalidArgumentError(f"start must be None or a non-negative int, got {start!r}")
        return _offset_reads.peek(self, start, max_entries)

    def offset_at(self, moment: Any) -> int:
        """The first offset enqueued at or after ``moment``, for replay and offset reads.

        ``moment``: a timezone-aware ``datetime``, or milliseconds since the
        epoch (an int, as ``Entry.enqueued_at_ms``). Searches ``[head, end of
        the published prefix)`` by bisection over buffer records: about
        ``log2(records)`` round trips. Returns the end of the prefix when every
        entry is older, and the head when none is. Times are the store's clock
        when each enqueue took its offsets, whatever the producers' clocks say.
        """
        from large_queue import _seek

        return _seek.offset_at(self, _seek.as_ms(moment))

    def expire(self) -> range:
        """Drop the entries older than the queue's ``max_age`` from the head now; return their offsets.

        Dequeues, consumers and full enqueues drop expired entries as they
        pass them; this is for an operator or a timer that wants the room
        back sooner (the dropped values stay in their slots, as dequeued ones
        may, until a later lap or a dequeue's erasure reaches them: the store's
        memory is not given back). Takes the lock: about
        ``log2(records) + 3`` round trips. An empty range if the queue was
        created without ``max_age`` or nothing has expired. Consumer groups
        see the offsets dropped below their cursors as lost, with the range.
        """
        return _retention.drop_expired(self)

    def purge(self) -> range:
        """Drop every entry now: the head moves to the tail; return the offsets dropped.

        Takes the lock: three round trips, and one more for each consumer
        group. An enqueue still in flight when it commits (reserved, not yet
        published) is dropped too; one that commits after it is kept.
        Consumer groups and the cluster shim count the dropped offsets they
        had not acked as lost. See :func:`large_queue._retention.purge`.
        """
        return _retention.purge(self)

    def info(self) -> QueueInfo:
        """Name, namespaces, shape, head, tail, size and lock holder, as stored now.

        Where producers append without the lock, ``tail_offset`` is the end of
        the published prefix (what readers see) and ``reserved_tail`` the end
        of what producers have reserved. Where a buffer record on the way
        cannot be read, ``damaged`` says so and ``tail_offset`` stops at what
        readers are known to have settled.
        """
        metadata = self.current_metadata()
        tail = metadata.tail
        damaged = None
        if self.reserved:
            try:
                tail = self._published_tail(metadata)
            except errors.CorruptQueueError as exc:  # a damaged buffer record: what is known settled
                damaged = f"{exc} (large-queue check {self.name} names what is lost)"
                tail = max(metadata.head, metadata.published)
        groups: list[GroupInfo] = []
        if metadata.groups:
            from large_queue.cluster import _groups

            groups, damaged_groups = _groups.describe_listed(self, metadata.groups, tail, metadata.head)
            damaged = damaged or damaged_groups
        return QueueInfo(
            name=self.name,
            namespace=self.keys.metadata_namespace,
            buffer_namespace=metadata.buffer_namespace,
            capacity=metadata.shape.capacity,
            head_offset=metadata.head,
            tail_offset=tail,
            size=tail - metadata.head,
            slots_per_record=metadata.shape.slots_per_record,
            record_count=metadata.shape.record_count,
            lock_owner=metadata.lock_owner or None,
            lock_ttl=metadata.lock_ttl_ms / 1000,
            max_entry_bytes=metadata.max_entry_bytes,
            encoding=metadata.encoding,
            appends=metadata.appends,
            reserved_tail=metadata.tail,
            hole_timeout=metadata.hole_timeout_ms / 1000 if self.reserved else None,
            max_age=metadata.max_age_ms / 1000 if metadata.max_age_ms is not None else None,
            groups=tuple(groups),
            damaged=damaged,
        )

    def published_tail(self, *, close_overdue: bool = False) -> tuple[int, int]:
        """``(head, end of the published prefix)`` now: what a reader may read.

        ``close_overdue``: a reader that waits on the prefix (a streaming
        reader) closes a hole it has seen open past the hole timeout.
        """
        metadata = self.current_metadata()
        if not self.reserved:
            return metadata.head, metadata.tail
        return metadata.head, self._published_tail(metadata, close_overdue=close_overdue)

    def _published_tail(self, metadata: rec.Metadata, *, close_overdue: bool = False) -> int:
        end, settled = self.prefix.prefix_end(metadata.head, metadata.published, metadata.tail)
        if close_overdue and settled is not None and self.prefix.close_overdue(settled):
            end, _ = self.prefix.prefix_end(metadata.head, metadata.published, self.current_metadata().tail)
        return end

    def current_metadata(self) -> rec.Metadata:
        """The metadata record now; ``QueueNotFoundError`` if the queue is not the one this handle opened."""
        self.counters.bump("commands")
        metadata = self._read_metadata(self.backend, self.name, self.keys.metadata_namespace)
        if metadata.incarnation != self.incarnation:
            raise self.lock.replaced_error(created_again=True)
        return metadata
