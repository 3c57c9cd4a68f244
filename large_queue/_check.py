"""``large-queue check``: report what is wrong with a queue's records.

It reads the metadata record and every buffer record (batch gets, so a few
round trips) and names each problem: bins missing or of the wrong type, head
and tail out of order, a missing buffer record, a malformed slot, a slot
holding an offset that does not belong there, a live offset whose entry is
gone, a fencing mark ahead of the metadata's counter, a consumer group
without its owner record. It changes nothing, except with ``repair=True``,
which recreates missing buffer records (empty, with the live offsets they
held closed where producers append without the lock, so readers pass them at
once: what they held is gone either way, and the report says which offsets).
A batch whose last offset is closed so is closed whole, its parts in intact
records too, since readers show a batch whole or not at all; the report
names those offsets as well. Head, tail and slot contents are never
rewritten: guessing them could lose data.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from large_queue import _records as rec
from large_queue import errors
from large_queue._entries import decode_entry
from large_queue.appends._prefix import Settled, settle
from large_queue.backends import Backend, ListGetRange, Record, WriteMode, connect

BATCH = 200
MAX_LISTED = 10


@dataclass(kw_only=True)
class CheckReport:
    """The findings of one check."""

    queue: str
    namespace: str
    problems: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    live_entries: int | None = 0  #: None: not counted (records missing or unreadable)

    @property
    def ok(self) -> bool:
        """True when no problem was found (or every one was repaired)."""
        return not self.problems

    def lines(self) -> list[str]:
        """The report as printable lines."""
        head = f"queue {self.queue!r} in namespace {self.namespace!r}:"
        body = [f"  problem: {p}" for p in self.problems] + [f"  repaired: {r}" for r in self.repaired]
        body += [f"  note: {n}" for n in self.notes]
        verdict = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        counted = (
            "live entries not counted" if self.live_entries is None else f"{self.live_entries} live entries"
        )
        return [head, *body, f"  {counted}; {verdict}"]


def check_queue(store: Any, name: str, *, namespace: str | None = None, repair: bool = False) -> CheckReport:
    """Check a queue's records; with ``repair``, recreate missing buffer records."""
    backend = connect(store)
    namespace = namespace or backend.default_namespace
    report = CheckReport(queue=name, namespace=namespace)
    keys = rec.QueueKeys(name=name, metadata_namespace=namespace, buffer_namespace=namespace)
    try:
        record = backend.get(keys.metadata)
    except errors.CorruptRecordError as exc:
        report.problems.append(f"the metadata record cannot be read: {exc}")
        return report
    if record is None:
        report.problems.append("the metadata record does not exist (no such queue)")
        return report
    if record.bins.get(rec.DELETING):  # nothing to check, and nothing to repair: it is going
        report.problems.append(
            "the queue is being deleted (or its delete was interrupted: deleting it again finishes it)"
        )
        return report
    try:
        metadata = rec.parse_metadata(name, record.bins)
    except errors.CorruptQueueError as exc:
        report.problems.append(str(exc))
        return report
    if metadata.lock_owner:
        report.notes.append(
            f"locked by txn {metadata.lock_owner!r} (an operation in progress, or an expired lock)"
        )
    keys = rec.QueueKeys(name=name, metadata_namespace=namespace, buffer_namespace=metadata.buffer_namespace)
    _check_buffers(backend, keys, metadata, report, repair)
    _check_groups(backend, keys, metadata, report)
    return report


def _check_groups(backend: Backend, keys: rec.QueueKeys, metadata: rec.Metadata, report: CheckReport) -> None:
    """Every consumer group the metadata lists has its owner record (cursor and in-flight entries)."""
    if not metadata.groups:
        return
    owners = backend.batch_read([(keys.group(group).owner, None) for group in metadata.groups])
    for group, owner in zip(metadata.groups, owners, strict=True):
        if owner is None:
            report.problems.append(
                f"consumer group {group!r} is listed but its owner record is missing: where it had got"
                f" to is gone (large-queue groups {keys.name} --delete {group}, then create it again)"
            )


def _check_buffers(
    backend: Backend, keys: rec.QueueKeys, metadata: rec.Metadata, report: CheckReport, repair: bool
) -> None:
    """Check every buffer record, :data:`BATCH` at a time, and count the live entries as they come.

    The records are read in ring order from the head's, so that the live
    offsets are counted in order with only one batch of records in memory
    (and the head's record, which a full queue's last offsets lie in too).
    """
    shape = metadata.shape
    first = shape.record_of(metadata.head)
    order = [(first + step) % shape.record_count for step in range(shape.record_count)]
    counting: _LiveCount = (
        _PrefixCount(backend, keys, metadata) if metadata.reserved else _PlainCount(metadata)
    )
    head_slots: list[Any] | None = None
    base = metadata.head - shape.slot_of(metadata.head)  # the first offset of the head's record
    ahead: dict[int, tuple[Any, Any]] = {}  # buffer records marked past the counter read first
    for part in range(0, len(order), BATCH):
        indexes = order[part : part + BATCH]
        window: dict[int, list[Any] | None] = {}
        for index, buffer in zip(indexes, _read_buffers(backend, keys, indexes), strict=True):
            window[index] = _check_buffer(
                backend, keys, metadata, report, repair, index, buffer, ahead, counting.tombstones
            )
        if part == 0:
            head_slots = window[first]
        window[first] = head_slots
        counting.count(window, reach=base + (part + len(indexes)) * shape.slots_per_record)
    # A full queue's last offsets lie in the head's record again.
    counting.count({first: head_slots}, reach=metadata.tail)
    now = functools.cache(lambda: _metadata_now(backend, keys, metadata))
    if ahead:
        token = (now().fence_epoch, now().fence_counter)
        for index, marks in ahead.items():
            if marks > token:
                report.problems.append(
                    f"buffer record {index} has fencing mark {marks}, ahead of the queue's counter {token}"
                )
    report.live_entries = counting.finish(report, lambda: now().head)


def _metadata_now(backend: Backend, keys: rec.QueueKeys, metadata: rec.Metadata) -> rec.Metadata:
    """The queue's metadata, read again after its records (as first read if it cannot be read).

    Appends under the lock move the fencing counter while a check runs, and
    producers appending with ``overwrite_if_full`` move the head: the buffer
    records they mark and the slots they overwrite meanwhile are not damage
    (the counter moved first, the head passed the slots first).
    """
    try:
        record = backend.get(keys.metadata)
        now = rec.parse_metadata(keys.name, record.bins) if record is not None else None
    except errors.LargeQueueError:
        return metadata
    return now if now is not None and now.incarnation == metadata.incarnation else metadata


def _passed(report: CheckReport, offsets: list[int], head_now: Callable[[], int], head: int) -> list[int]:
    """``offsets`` not passed by the head since the check began (those passed are noted)."""
    if not offsets:
        return offsets
    now = head_now()
    passed = [offset for offset in offsets if offset < now]
    if passed:
        report.notes.append(
            f"{len(passed)} offsets were overwritten while they were checked: the head moved from {head} to"
            f" {now} meanwhile (entries dequeued, or dropped by producers appending with overwrite_if_full),"
            " and later entries took their slots"
        )
    return [offset for offset in offsets if offset >= now]


def _check_buffer(
    backend: Backend,
    keys: rec.QueueKeys,
    metadata: rec.Metadata,
    report: CheckReport,
    repair: bool,
    index: int,
    buffer: Record | errors.CorruptRecordError | None,
    ahead: dict[int, tuple[Any, Any]],
    tombstones: set[int],
) -> list[Any] | None:
    """Report what is wrong with buffer record ``index`` (recreate it if missing and ``repair``).

    Its slots if they can be counted, else None. Fencing marks ahead of the
    counter go to ``ahead``, to be weighed against the counter read again;
    the offsets a repair closes go to ``tombstones``.
    """
    shape = metadata.shape
    token = (metadata.fence_epoch, metadata.fence_counter)
    where = f"buffer record {index}"
    if isinstance(buffer, errors.CorruptRecordError):
        live = _live_in(shape, index, metadata.head, metadata.tail)
        held = f"; the live offsets it holds cannot be read: {_listed(live)}" if live else ""
        report.problems.append(f"{where} cannot be read ({buffer}){held}")
        return None
    if buffer is None:
        live = _live_in(shape, index, metadata.head, metadata.tail)
        lost = f"; the live offsets it held are gone: {_listed(live)}" if live else ""
        if not repair:
            report.problems.append(f"{where} is missing{lost}")
            return None
        bins = rec.empty_buffer(
            shape.slots_per_record, token, metadata.incarnation, reserved=metadata.reserved
        )
        if metadata.reserved:  # gone, published or not: closed, so readers pass them at once
            for offset in live:  # (and a producer still to publish one is refused)
                bins[rec.SLOTS][shape.slot_of(offset)] = [offset]
            tombstones.update(live)
        # marked with the current token: only newer holders can write it
        backend.put(keys.buffer(index), bins, mode=WriteMode.CREATE_ONLY)
        report.repaired.append(f"{where} was missing and was recreated empty{lost}")
        return list(bins[rec.SLOTS])
    slots = buffer.bins.get(rec.SLOTS)
    if buffer.bins.get(rec.INCARNATION) != metadata.incarnation:
        report.problems.append(
            f"{where} belongs to another creation of the queue (incarnation"
            f" {buffer.bins.get(rec.INCARNATION)!r}, not {metadata.incarnation!r})"
        )
        return None
    marks = (buffer.bins.get(rec.FENCE_EPOCH), buffer.bins.get(rec.FENCE_COUNTER))
    if not all(type(mark) is int for mark in marks):
        report.problems.append(f"{where} has missing or non-integer fencing marks {marks}")
    elif marks > token:  # reported if still ahead of the counter read again after the records
        ahead[index] = marks
    if not isinstance(slots, list) or len(slots) != shape.slots_per_record:
        report.problems.append(f"{where} does not hold a list of {shape.slots_per_record} slots")
        return None
    for position, slot in enumerate(slots):
        if slot is None:
            continue
        if not _well_formed(slot, metadata.reserved):
            report.problems.append(f"{where} slot {position} is malformed: {slot!r:.80}")
        elif slot[0] >= metadata.tail:  # an append in progress, or a locked one never committed
            report.notes.append(
                f"{where} slot {position} holds offset {slot[0]}, at or beyond the tail"
                f" {metadata.tail} (an append under way, or one that was never committed)"
            )
        elif len(slot) < 3 and (slot[0] == -1 or metadata.reserved):
            continue  # empty, or a closed reservation (lock-free appends)
        elif slot[0] % shape.capacity != index * shape.slots_per_record + position:
            report.problems.append(f"{where} slot {position} holds offset {slot[0]}, which belongs elsewhere")
        else:
            try:
                decode_entry(metadata.encoding, slot[1])
            except ValueError as exc:
                report.problems.append(f"{where} slot {position} holds no valid entry: {exc}")
    return slots


class _LiveCount:
    """Counts the live entries of ``[head, tail)`` from records fed in ring order from the head's."""

    def __init__(self) -> None:
        self.tombstones: set[int] = set()  #: the offsets a repair closed

    def count(self, window: dict[int, list[Any] | None], reach: int) -> None:
        """Count what the records of ``window`` hold of ``[head, reach)`` (None: not countable)."""
        raise NotImplementedError

    def finish(self, report: CheckReport, head_now: Callable[[], int]) -> int | None:
        """Report what was found; the count (None if records that hold live offsets could not be read).

        ``head_now`` reads the head again, for slots that no longer hold their offset.
        """
        raise NotImplementedError


class _PlainCount(_LiveCount):
    """A queue whose appends take the lock: each live offset's slot must hold it."""

    def __init__(self, metadata: rec.Metadata) -> None:
        super().__init__()
        self.metadata = metadata
        self.holding = 0
        self.missing: list[int] = []
        self.counted: set[int] = set()

    def count(self, window: dict[int, list[Any] | None], reach: int) -> None:
        """Count the live offsets each record of ``window`` holds (the order does not matter here)."""
        metadata = self.metadata
        for index, slots in window.items():
            if slots is None or index in self.counted:
                continue  # a record that cannot be counted is reported with it
            self.counted.add(index)
            for offset in _live_in(metadata.shape, index, metadata.head, metadata.tail):
                slot = slots[metadata.shape.slot_of(offset)]
                if isinstance(slot, list) and slot and slot[0] == offset:
                    self.holding += 1
                else:
                    self.missing.append(offset)

    def finish(self, report: CheckReport, head_now: Callable[[], int]) -> int | None:
        """Report the live offsets whose slots lost their entry; how many hold theirs."""
        missing = _passed(report, sorted(self.missing), head_now, self.metadata.head)
        if missing:
            report.problems.append(f"live offsets whose slots no longer hold their entry: {_listed(missing)}")
        return self.holding


class _PrefixCount(_LiveCount):
    """A queue with lock-free appends: ``[head, tail)`` settled in order, as readers do."""

    def __init__(self, backend: Backend, keys: rec.QueueKeys, metadata: rec.Metadata) -> None:
        super().__init__()
        self.backend = backend
        self.keys = keys
        self.metadata = metadata
        self.start = metadata.head
        self.after: Settled | None = None
        self.verdicts: dict[int, str] = {}
        self.window: dict[int, list[Any] | None] = {}
        self.entries = self.closed = 0
        self.overwritten: list[int] = []
        self.lost: list[int] = []  # below the published mark, so once published: their entries are gone
        self.pending: list[int] = []
        self.batch_parts: list[int] = []  # intact, closed with their batch by a repair's tombstone
        self.malformed: str | None = None
        self.blocked = False  # past a record that cannot be read: not settled further

    def count(self, window: dict[int, list[Any] | None], reach: int) -> None:
        """Settle ``[start, reach)`` (every offset, past an unpublished one too), part by part."""
        shape, tail = self.metadata.shape, self.metadata.tail
        self.window = window
        stop = min(reach, tail)
        if self.blocked or self.start >= stop:
            return
        if any(window.get(index) is None for index in _records_of(shape, self.start, stop)):
            self.blocked = True  # not settled past them: already reported with their records
            return
        while self.start < stop:
            try:
                settled = settle(self.start, stop, self._slot_at, self._fetch, self.verdicts, self.after)
            except _Unreadable:
                self.blocked = True
                return
            except ValueError as exc:
                self.malformed, self.blocked = str(exc), True
                return
            self.entries += len(settled.entries)
            self.closed += settled.closed
            if self.tombstones:
                self._closed_by_repair(settled)
            self.overwritten += settled.overwritten
            self.after = settled
            self.start = settled.end
            if settled.end < stop:
                (self.lost if settled.end < self.metadata.published else self.pending).append(settled.end)
                self.start += 1

    def _closed_by_repair(self, settled: Settled) -> None:
        """Take the offsets of ``settled`` that a repair's tombstones closed out of the producers' count.

        Besides the tombstones, the parts of a spanning batch kept in records
        that are intact: their batch's last offset lay in the missing record,
        and a batch is shown whole or not at all.
        """
        for offset in range(settled.start, settled.end):
            slot = self._slot_at(offset)
            if offset in self.tombstones:
                self.closed -= 1
            elif len(slot) == 4 and slot[0] == offset and slot[3] in self.tombstones:
                self.closed -= 1
                self.batch_parts.append(offset)

    def _slot_at(self, offset: int) -> Any:
        slots = self.window[self.metadata.shape.record_of(offset)]
        assert slots is not None  # checked before settling
        return slots[self.metadata.shape.slot_of(offset)]

    def _fetch(self, offset: int) -> Any:
        """The slot of a spanning batch's last offset, read alone where its record is not at hand."""
        shape = self.metadata.shape
        slots = self.window.get(shape.record_of(offset))
        if slots is not None:
            return slots[shape.slot_of(offset)]
        try:
            found = self.backend.operate(
                self.keys.buffer(shape.record_of(offset)), [ListGetRange(rec.SLOTS, shape.slot_of(offset), 1)]
            )
        except (errors.RecordNotFoundError, errors.CorruptRecordError):
            raise _Unreadable from None
        slots = found.get(rec.SLOTS)
        if not isinstance(slots, list) or not slots:
            raise _Unreadable
        return slots[0]

    def finish(self, report: CheckReport, head_now: Callable[[], int]) -> int | None:
        """Report lost, overwritten, closed and pending offsets; the entries counted."""
        if self.malformed:
            report.problems.append(f"a live slot is malformed: {self.malformed}")
        overwritten = _passed(report, self.overwritten, head_now, self.metadata.head)
        if overwritten:
            report.problems.append(f"{len(overwritten)} live offsets whose slots hold a later lap's entry")
        if self.lost:
            report.problems.append(
                f"live offsets below the published mark {self.metadata.published} hold no entry (lost):"
                f" {_listed(self.lost)}"
            )
        if self.batch_parts:
            report.repaired.append(
                f"offsets {_listed(self.batch_parts)} were closed too, though their records are intact:"
                " they belong to batches whose last offset the missing records held, and a batch is"
                " delivered whole or not at all (whether it had been published cannot be told)"
            )
        if self.closed:
            report.notes.append(
                f"{self.closed} reserved offsets were closed unpublished (their producers failed)"
            )
        if self.pending:
            report.notes.append(
                f"offsets {_listed(self.pending)} are reserved and not published yet: the prefix ends at"
                f" {self.pending[0]} (readers close them after the hole timeout if their producers never"
                " publish)"
            )
        return None if self.blocked else self.entries


class _Unreadable(Exception):
    """A slot that decides a spanning batch lies in a record that cannot be read."""


def _well_formed(slot: Any, reserved: bool) -> bool:
    """A slot as the queue's format writes them (see :mod:`large_queue._records`)."""
    if not (isinstance(slot, list) and slot and type(slot[0]) is int):
        return False
    if len(slot) >= 3 and type(slot[2]) is not int:  # its enqueue time, in ms
        return False
    if not reserved:
        return len(slot) == 3
    if len(slot) == 1:
        return slot[0] >= -1
    return slot[0] >= 0 and (
        len(slot) == 3 or (len(slot) == 4 and type(slot[3]) is int and slot[3] >= slot[0])
    )


def _live_in(shape: rec.QueueShape, index: int, head: int, tail: int) -> list[int]:
    """The offsets of ``[head, tail)`` that buffer record ``index`` holds (one a slot at most)."""
    capacity = shape.slots_per_record * shape.record_count
    first_slot = index * shape.slots_per_record
    live = []
    for position in range(first_slot, first_slot + shape.slots_per_record):
        offset = head + (position - head) % capacity  # the first offset from the head in that slot
        if offset < tail:
            live.append(offset)
    return sorted(live)


def _records_of(shape: rec.QueueShape, head: int, tail: int) -> range | set[int]:
    """The buffer records ``[head, tail)`` lies in."""
    if tail - head >= shape.slots_per_record * shape.record_count:
        return range(shape.record_count)
    return {shape.record_of(offset) for offset in range(head, tail, shape.slots_per_record)} | (
        {shape.record_of(tail - 1)} if tail > head else set()
    )


def _read_buffers(
    backend: Backend, keys: rec.QueueKeys, indexes: list[int]
) -> list[Record | errors.CorruptRecordError | None]:
    """Buffer records in one batch; one by one when the batch holds a damaged one, to name it."""
    try:
        return list(backend.batch_get([keys.buffer(i) for i in indexes]))
    except errors.CorruptRecordError:
        records: list[Record | errors.CorruptRecordError | None] = []
        for index in indexes:
            try:
                records.append(backend.get(keys.buffer(index)))
            except errors.CorruptRecordError as exc:
                records.append(exc)
        return records


def _listed(offsets: list[int]) -> str:
    shown = ", ".join(map(str, offsets[:MAX_LISTED]))
    return f"{shown} (and {len(offsets) - MAX_LISTED} more)" if len(offsets) > MAX_LISTED else shown
