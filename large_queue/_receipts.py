"""Outcome receipts: what became of a call that carried the caller's ``txn_id``.

Every enqueue, batch enqueue, dequeue and batch dequeue given a ``txn_id``
leaves a receipt in the metadata record's bounded log (bin ``receipts``):
``txn id -> [store ms, first offset, count, "e" | "d"]``. The receipt is
written by the command that commits (the lock's commit, or a lock-free
producer's reservation), so it costs no extra round trip, and the store
stamps it with its own clock. The log keeps at most ``receipts`` of them and
none older than ``receipt_ttl`` (queue settings), trimmed by the same command.

What a receipt makes possible:

- **Idempotent enqueue**: an enqueue whose txn id has a receipt writes
  nothing and returns the first call's offsets.
- **Repeated dequeue**: a dequeue whose txn id has a receipt removes nothing
  and returns the entries the first call removed (while their slots hold them).
- **Outcome lookup**: :func:`outcome` answers committed, pending, not
  committed or unknown.

The failure story of a lock-free enqueue with a txn id, as a timeline
(hole timeout 2 s)::

    t=0.0  P reserves offsets 40..41 for txn "t9": the reservation writes the
           receipt t9 -> [store ms, 40, 2, "e"] in the same command. Its
           publish times out, every attempt; P's caller gets OutcomeUnknownError.
    t=0.1  The caller calls again with txn "t9". The reservation is refused
           (a receipt for t9 exists) and the receipt read back.
           - Slot 41 holds offset 41's entry: the first publish was applied;
             the call returns 40..41 and writes nothing.
           - Slot 41 still holds an older offset: nothing was published (or
             part of a spanning batch); the call publishes 40..41 itself
             (slots already holding this txn's entries are accepted) and
             returns them.
    t=2.1  Had the caller come back only now, a reader would have closed
           40..41 with a tombstone (nothing of it visible). The call then
           reserves again, guarded by "t9's receipt still names 40" so two
           such calls cannot both reserve, and publishes the new offsets.
    t=9.0  Had it come back later still, a later lap would have reused the
           slots of 40..41: they no longer tell closed from published and
           consumed. The reader that closed them recorded the run 40+2 in
           the metadata's closed runs (bin ``closed_runs``, after its
           tombstones were in), so the call still knows it was closed and
           reserves again. Without that record (the reader died first) the
           call raises ``OutcomeUnknownError``: it cannot be told.

With the lock (``appends="lock"``, and every dequeue) the receipt is written
by the commit. The retry's acquire reads the receipt in the same command and
may take back a lock its own txn still holds (the new fencing token fences
the earlier attempt off). A receipt means the commit was applied; no receipt
and the lock not held by the txn means it was not (within the log's bounds).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from large_queue import _records as rec
from large_queue import errors
from large_queue.appends import Duplicate, ReceiptWrite
from large_queue.appends._prefix import CLOSED, ENTRY, PENDING, kind_of
from large_queue.backends import LogPut, Read
from large_queue.backends.conditions import (
    BinExists,
    Bound,
    IntBin,
    MapItem,
    MapKeyCount,
    Not,
    NowMs,
    Param,
    any_of,
    eq,
    sub,
)
from large_queue.lock import READ_STORE_CLOCK, STORE_CLOCK

if TYPE_CHECKING:
    from large_queue.queue import Entry, Queue

#: how far apart (ms) the clocks that stamp a receipt and a closed-run mark may be (nodes of a cluster)
CLOCK_MARGIN_MS = 60_000

log = logging.getLogger("large_queue")

ENQUEUE = "e"
DEQUEUE = "d"
#: a lock-free enqueue whose reservation its own call found closed: certainly not committed
CLOSED_ENQUEUE = "x"
_NAMES = {ENQUEUE: "enqueue", DEQUEUE: "dequeue", CLOSED_ENQUEUE: "enqueue"}

COMMITTED = "committed"
PENDING_STATE = "pending"
NOT_COMMITTED = "not committed"
UNKNOWN = "unknown"

#: the log holds no receipt for the txn (or no log at all)
_ABSENT = any_of(Not(BinExists(rec.RECEIPTS)), eq(MapKeyCount(rec.RECEIPTS, Param("txn")), 0))
#: the txn's receipt still names the reservation that was closed (a guarded re-reservation)
_STILL_NAMES = eq(MapItem(rec.RECEIPTS, Param("txn"), 1), Param("first"))
#: the first offset: given by the lock holder, or (lock-free) computed after the tail grew
_GIVEN_FIRST = Param("first")
_RESERVED_FIRST = sub(IntBin(rec.TAIL), Param("n"))


@dataclass(frozen=True, kw_only=True)
class Receipt:
    """What a committed (or, lock-free, reserved) call left: its operation, offsets and store time."""

    txn_id: str
    operation: str  #: "enqueue" or "dequeue"
    offsets: range  #: the offsets it appended, or the head range it dequeued
    at_ms: int  #: when, on the store's clock (ms since the epoch)
    closed: bool = False  #: a lock-free enqueue that found its reservation closed: nothing of it is visible


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What became of a call with a txn id (see :meth:`large_queue.Queue.outcome`).

    ``state`` is ``"committed"`` (``receipt`` says what it did), ``"pending"``
    (it may still commit: a lock-free enqueue reserved and not yet published
    or closed, or a locked call whose txn still holds the lock; calling it
    again with the same txn id finishes it), ``"not committed"`` (nothing of it
    is in the queue: calling again is safe) or ``"unknown"`` (the log no longer
    covers the time of the call).
    """

    txn_id: str
    state: str
    receipt: Receipt | None
    detail: str

    @property
    def committed(self) -> bool:
        """True if the call committed."""
        return self.state == COMMITTED


def parse(queue: str, txn_id: str, value: Any) -> Receipt:
    """The receipt stored as ``value``; ``CorruptQueueError`` if it is malformed."""
    if (
        type(value) is not list
        or len(value) != 4
        or not all(type(part) is int for part in value[:3])
        or value[3] not in _NAMES
    ):
        raise errors.CorruptQueueError(
            f"metadata record of queue {queue!r}: the receipt of txn {txn_id!r} is malformed: {value!r}",
            queue=queue,
        )
    at_ms, first, count, operation = value
    return Receipt(
        txn_id=txn_id,
        operation=_NAMES[operation],
        offsets=range(first, first + count),
        at_ms=at_ms,
        closed=operation == CLOSED_ENQUEUE,
    )


@functools.lru_cache(maxsize=64)
def _closed_template(keep: int, age_ms: int, stated: bool) -> LogPut:
    first = Param("first")
    items = (NowMs(), first, Param("n"), Param("state")) if stated else (NowMs(), first, Param("n"))
    return LogPut(rec.CLOSED_RUNS, first, items, keep, age_ms)


@functools.lru_cache(maxsize=64)
def _template(first: Any, keep: int, age_ms: int) -> LogPut:
    return LogPut(rec.RECEIPTS, Param("txn"), (NowMs(), first, Param("n"), Param("op")), keep, age_ms)


class Receipts:
    """The receipt log of one queue: the operations and guards that write and check it."""

    def __init__(self, keep: int, age_ms: int) -> None:
        self.keep = keep
        self.age_ms = age_ms

    def _put(self, first: Any, values: dict[str, int | str]) -> LogPut:
        return dataclasses.replace(_template(first, self.keep, self.age_ms), values=values)

    def committed(self, txn_id: str, operation: str, offsets: range) -> LogPut:
        """The receipt a lock holder's commit writes: ``operation`` on ``offsets``."""
        values: dict[str, int | str] = {
            "txn": txn_id,
            "first": offsets.start,
            "n": len(offsets),
            "op": operation,
        }
        return self._put(_GIVEN_FIRST, values)

    def closed_run(self, first: int, count: int, state: str | None = None) -> LogPut:
        """The mark of ``count`` reserved offsets from ``first`` closed before they were published.

        ``state`` (format 4): :data:`~large_queue._records.CLOSING` before the
        tombstones, :data:`~large_queue._records.CLOSED_RUN` after; None (format 3):
        closed. Kept in its own log, bounded as the receipts are: a mark is
        written after the receipt it concerns, so it stays at least as long.
        """
        put = _closed_template(self.keep, self.age_ms, state is not None)
        values: dict[str, int | str] = {"first": first, "n": count}
        if state is not None:
            values["state"] = state
        return dataclasses.replace(put, values=values)

    def reserved(self, txn_id: str, count: int) -> LogPut:
        """The receipt a lock-free reservation of ``count`` offsets writes (after its tail grew)."""
        return self._put(_RESERVED_FIRST, {"txn": txn_id, "n": count, "op": ENQUEUE})

    @staticmethod
    def absent(txn_id: str) -> Bound:
        """Guard: the log holds no receipt for ``txn_id``."""
        return Bound(_ABSENT, {"txn": txn_id})

    @staticmethod
    def still_names(txn_id: str, first: int) -> Bound:
        """Guard: ``txn_id``'s receipt still names the reservation from ``first``."""
        return Bound(_STILL_NAMES, {"txn": txn_id, "first": first})


def check_repeat(queue: Queue, receipt: Receipt, operation: str, count: int | None = None) -> None:
    """A txn id reused for another kind of call (or another batch size) is refused, naming both."""
    if receipt.operation != _NAMES[operation] or (count is not None and len(receipt.offsets) != count):
        raise errors.InvalidArgumentError(
            f"txn_id {receipt.txn_id!r} already names a {receipt.operation} of {len(receipt.offsets)}"
            f" entries on queue {queue.name!r} (offsets {receipt.offsets.start}..{receipt.offsets.stop - 1});"
            f" a txn id names one call: use a new one for this {_NAMES[operation]}"
            + (f" of {count}" if count is not None else "")
        )


def repeated_dequeue(queue: Queue, receipt: Receipt) -> list[Entry]:
    """The entries a committed dequeue removed, read again from their slots (below the head: no lock needed).

    ``EntriesGoneError`` if a slot no longer holds its entry: erased by a
    later dequeue (``appends="lock"``) or reused by a later lap.
    """
    offsets = receipt.offsets
    if not offsets:
        return []
    entries: list[Entry] = []
    gone: list[int] = []
    slots = queue.prefix.slots(offsets.start, offsets.stop)
    if queue.reserved:
        settled = queue.prefix.settle(offsets.start, offsets.stop, slots.__getitem__)
        entries = queue._entries(settled.entries)
        present = {entry.offset for entry in entries}
        gone = [
            o for o in offsets[: settled.end - offsets.start] if o not in present and _was_entry(slots[o], o)
        ]
        gone += list(offsets[settled.end - offsets.start :])
    else:
        for offset in offsets:
            found = rec.slot_entry(
                queue.name, queue.shape.record_of(offset), slots[offset], offset, queue.encoding
            )
            if found is None:
                gone.append(offset)
            else:
                entries.append(queue._entry_of(offset, found))
    if gone:
        raise errors.EntriesGoneError(
            f"txn {receipt.txn_id!r} dequeued offsets {offsets.start}..{offsets.stop - 1} of queue"
            f" {queue.name!r}, but {len(gone)} of them are no longer stored (from offset {gone[0]}):"
            " erased by a later dequeue or reused by a later lap",
            queue=queue.name,
            offsets=offsets,
        )
    return entries


def _was_entry(slot: Any, offset: int) -> bool:
    """False where a slot settled as closed (a tombstone): it never held an entry to give back."""
    try:
        return kind_of(offset, slot)[0] != CLOSED
    except ValueError:
        return True


def append_once(queue: Queue, values: list[Any], txn_id: str, overwrite: bool) -> range:
    """A lock-free append with the caller's txn id: at most once (see the module's timeline)."""
    count = len(values)
    receipt_put = queue.receipts.reserved(txn_id, count)
    replacing: int | None = None  # the first offset of a closed reservation this txn takes anew
    first = -1
    for _ in range(16):  # each turn is a state another process moved on from; a few suffice
        try:
            with queue.backend.grouped():
                guard = (
                    queue.receipts.absent(txn_id)
                    if replacing is None
                    else queue.receipts.still_names(txn_id, replacing)
                )
                first, now_ms = queue.appender.reserve_stamped(
                    count, overwrite=overwrite, receipt=ReceiptWrite(receipt_put, guard, txn_id)
                )
                # repeat: a call of this txn that found the receipt pending may have published it first
                queue.appender.publish(first, values, now_ms, repeat=True)
            queue.counters.add(enqueue_calls=1, entries_enqueued=count)  # a repeat below is not counted so
            return range(first, first + count)
        except errors.ReservationClosedError:
            # Our own publish was refused and the slots do not hold our entries now: a reader
            # closed the reservation, or another call of this txn published it and its entries
            # were consumed and their slots reused since. The receipt, read as a repeat reads it
            # (below: the reservation is guarded on no receipt), tells which: taken anew only
            # if closed, never published twice.
            replacing = None
        except Duplicate as duplicate:
            receipt = parse(queue.name, txn_id, duplicate.receipt)
            check_repeat(queue, receipt, ENQUEUE, count)
            state = CLOSED if receipt.closed else _reservation_state(queue, receipt)
            if state == ENTRY:
                queue.counters.bump("repeats_answered")
                return receipt.offsets
            if state == PENDING:
                try:
                    # stamped with the store's clock when the first call reserved them (its receipt's)
                    queue.appender.publish(receipt.offsets.start, values, receipt.at_ms, repeat=True)
                except errors.ReservationClosedError:
                    replacing = receipt.offsets.start
                    _mark_closed(queue, txn_id, receipt.offsets)
                    continue
                # the first call reserved them and never published: this one enqueued them
                queue.counters.add(repeats_answered=1, enqueue_calls=1, entries_enqueued=count)
                return receipt.offsets
            settled = CLOSED if state == CLOSED else _after_reuse(queue, receipt)
            if settled == CLOSED:
                if not receipt.closed:  # said in the receipt, should no reservation anew be possible
                    _mark_closed(queue, txn_id, receipt.offsets)
                replacing = receipt.offsets.start
                continue
            if settled == ENTRY:  # published, and consumed since
                queue.counters.bump("repeats_answered")
                return receipt.offsets
            raise _reused(queue, receipt) from None
    raise errors.LockNotAcquiredError(
        f"txn {txn_id!r} on queue {queue.name!r}: its reservation kept being closed or replaced by"
        " other calls with the same txn id; use one call per txn id at a time",
        queue=queue.name,
        txn_id=txn_id,
    )


def _mark_closed(queue: Queue, txn_id: str, offsets: range) -> None:
    """Say in the receipt that this txn's reservation ``offsets`` was found closed (one command).

    Known now, by the call itself; later, once the slots are reused, nobody
    could tell a closed reservation from a published and consumed one. If the
    write fails the receipt keeps saying "reserved", which stays true.
    """
    put = queue.receipts.committed(txn_id, CLOSED_ENQUEUE, offsets)
    queue.counters.bump("commands")
    try:
        queue.backend.operate(
            queue.keys.metadata, [put], condition=Receipts.still_names(txn_id, offsets.start)
        )
    except errors.LargeQueueError:
        log.debug("could not mark txn %r's closed reservation in its receipt", txn_id, exc_info=True)


def _reservation_state(queue: Queue, receipt: Receipt) -> str:
    """How the last slot of a lock-free receipt's reservation settles: entry, pending, closed..."""
    last = receipt.offsets.stop - 1
    try:
        kind, _ = kind_of(last, queue.prefix.fetch(last))
    except ValueError as exc:
        raise queue.prefix.corrupt(last, str(exc)) from None
    return kind


def _after_reuse(queue: Queue, receipt: Receipt) -> str | None:
    """How a lock-free receipt's reservation, whose slots a later lap reused, was settled (one read).

    CLOSED if a closed run overlaps it: a reservation is published by
    commands guarded by its own slots, so a tombstone on any of its offsets
    (on a spanning batch's last) means none of it was ever visible. Offsets
    are absolute: a run closed in another lap cannot overlap.

    ENTRY (published) in a format-4 queue when nothing marked it closing and
    nothing may have skipped it: its slots were reused, and without a skip
    a lap reuses only slots past published or closed offsets, while every
    closer marks a run before it closes it. That needs the marks of its time
    to be all there: none aged out of the log, and the log never full since.

    None: it cannot be told (a closing mark without its closed mark, an
    overwriting producer or a group's head moved past it, a format-3 queue,
    or marks of its time may be gone).
    """
    queue.counters.bump("commands")
    try:
        found = queue.backend.operate(
            queue.keys.metadata, [Read(rec.CLOSED_RUNS), Read(rec.SKIPPED_TO), READ_STORE_CLOCK]
        )
    except errors.LargeQueueError:
        return None
    log = found.get(rec.CLOSED_RUNS)
    runs = [run for run in log.values() if _is_run(run)] if type(log) is dict else []
    offsets = receipt.offsets
    closing = False
    for run in runs:
        if run[1] < offsets.stop and offsets.start < run[1] + run[2]:
            if len(run) == 3 or run[3] == rec.CLOSED_RUN:
                return CLOSED
            closing = True
    skipped = found.get(rec.SKIPPED_TO)
    if closing or not queue.marked or type(skipped) is not int or offsets.start < skipped:
        return None
    since = receipt.at_ms - CLOCK_MARGIN_MS  # marks are stamped after the reservation, maybe on another node
    if since <= found[STORE_CLOCK] - queue.receipts.age_ms:
        return None  # marks of its time may have aged out of the log
    if sum(1 for run in runs if run[0] >= since) >= queue.receipts.keep - 1:
        return None  # the log has been full since: a mark of its time may have been pushed out
    return ENTRY


def _is_run(run: Any) -> bool:
    """A closed-run mark as stored: [store ms, first offset, count] (+ its state in format 4)."""
    return type(run) is list and len(run) in (3, 4) and all(type(item) is int for item in run[:3])


def _reused(queue: Queue, receipt: Receipt) -> errors.OutcomeUnknownError:
    return errors.OutcomeUnknownError(
        f"txn {receipt.txn_id!r} reserved offsets {receipt.offsets.start}..{receipt.offsets.stop - 1}"
        f" of queue {queue.name!r}, whose slots a later lap has reused since: it may have been published (and"
        " consumed) or closed",
        queue=queue.name,
        txn_id=receipt.txn_id,
        stage="receipt",
        offsets=receipt.offsets,
    )


def outcome(queue: Queue, txn_id: str, within: float | None) -> Outcome:
    """See :meth:`large_queue.Queue.outcome`."""
    queue.counters.bump("commands")
    try:
        # In a group: on the embedded store it waits for another process's group in flight (a call
        # between its lock and its commit, which no reader sees yet), so "not committed" stays true.
        with queue.backend.grouped():
            found = queue.backend.operate(
                queue.keys.metadata,
                [Read(rec.RECEIPTS), Read(rec.LOCK_OWNER), Read(rec.INCARNATION), READ_STORE_CLOCK],
            )
    except errors.RecordNotFoundError:
        raise queue.lock.replaced_error(created_again=False) from None
    if found.get(rec.INCARNATION) != queue.incarnation:
        raise queue.lock.replaced_error(created_again=True)
    log = found.get(rec.RECEIPTS)
    log = log if type(log) is dict else {}
    if txn_id in log:
        receipt = parse(queue.name, txn_id, log[txn_id])
        return _with_receipt(queue, receipt)
    if found.get(rec.LOCK_OWNER) == txn_id:
        return Outcome(
            txn_id=txn_id,
            state=PENDING_STATE,
            receipt=None,
            detail="the txn holds the queue's lock: its commit may still be applied; call again with the same"
            " txn_id to finish it",
        )
    now_ms: int = found[STORE_CLOCK]
    covered_ms = _covered_ms(log, now_ms, queue.receipts)
    # rounded up: a call made 1,003.4 ms ago may carry the oldest kept receipt's millisecond
    asked_ms = queue.receipts.age_ms if within is None else math.ceil(round(within * 1000, 6))  # (16.1 s)
    if covered_ms >= asked_ms:
        return Outcome(
            txn_id=txn_id,
            state=NOT_COMMITTED,
            receipt=None,
            detail=f"no receipt, and the log holds every receipt of the last {covered_ms / 1000:.1f} s",
        )
    return Outcome(
        txn_id=txn_id,
        state=UNKNOWN,
        receipt=None,
        detail=f"no receipt, but the log covers only the last {covered_ms / 1000:.1f} s (of"
        f" {asked_ms / 1000:.1f} s asked): a receipt may have been dropped to keep it at"
        f" {queue.receipts.keep}",
    )


def _with_receipt(queue: Queue, receipt: Receipt) -> Outcome:
    if receipt.closed:
        detail = "its reservation was closed before it was published: nothing of it is in the queue"
        return Outcome(txn_id=receipt.txn_id, state=NOT_COMMITTED, receipt=receipt, detail=detail)
    if not queue.reserved or receipt.operation == "dequeue":
        return Outcome(
            txn_id=receipt.txn_id, state=COMMITTED, receipt=receipt, detail="its commit left this receipt"
        )
    state = _reservation_state(queue, receipt)
    if state == ENTRY:
        return Outcome(txn_id=receipt.txn_id, state=COMMITTED, receipt=receipt, detail="published")
    if state == PENDING:
        detail = "reserved, not yet published nor closed: call again with the same txn_id to publish it"
        return Outcome(txn_id=receipt.txn_id, state=PENDING_STATE, receipt=receipt, detail=detail)
    if state == CLOSED:
        detail = "reserved, then closed by a reader before it was published: nothing of it is in the queue"
        return Outcome(txn_id=receipt.txn_id, state=NOT_COMMITTED, receipt=receipt, detail=detail)
    settled = _after_reuse(queue, receipt)
    if settled == CLOSED:
        detail = (
            "reserved, then closed before it was published (the closed runs say so; its slots have been"
            " reused since): nothing of it is in the queue"
        )
        return Outcome(txn_id=receipt.txn_id, state=NOT_COMMITTED, receipt=receipt, detail=detail)
    if settled == ENTRY:
        detail = (
            "published: its slots have been reused since, which follows only a published or closed"
            " reservation, and no reader marked it closing"
        )
        return Outcome(txn_id=receipt.txn_id, state=COMMITTED, receipt=receipt, detail=detail)
    return Outcome(
        txn_id=receipt.txn_id,
        state=UNKNOWN,
        receipt=receipt,
        detail="its slots were reused by a later lap: it may have been published (and consumed) or closed",
    )


def _covered_ms(log: dict[Any, Any], now_ms: int, receipts: Receipts) -> int:
    """How far back (ms) the log certainly holds every receipt written.

    Receipts leave the log by age (older than its TTL) or by count (the
    oldest first). A receipt younger than the TTL can only have been dropped
    by count, and then the log still holds at least ``keep - 1`` receipts,
    all no older than it: so a log holding fewer covers the whole TTL, and a
    fuller one covers back to just after its oldest receipt (one dropped may
    carry the same millisecond).
    """
    if len(log) < receipts.keep - 1:
        return receipts.age_ms
    oldest = min((value[0] for value in log.values() if type(value) is list and value), default=now_ms)
    return max(0, min(receipts.age_ms, now_ms - oldest - 1))


__all__ = ["Outcome", "Receipt", "Receipts", "append_once", "outcome", "repeated_dequeue"]
