"""Appends without the queue lock: reserve offsets in one command, publish them in another.

In a queue created with ``appends="reserve"`` (format 3) a producer never
takes the lock. An append of ``n`` entries is:

1. **Reserve**: one command on the metadata record adds ``n`` to the tail,
   refused (nothing reserved) unless ``n`` slots are free. With
   ``overwrite_if_full`` it moves the head past the oldest entries instead, in
   the same command, computed by the store.
2. **Publish**: one command per buffer record writes the entries into their
   slots, each guarded on the store by the slot itself: slot ``i`` accepts
   offset ``o`` only while it holds an older offset (another lap's entry, or
   the empty slot ``[-1]``). The offset is the fencing token: no lock, no
   counter. A batch spanning records marks each slot with the batch's last
   offset ``e`` and publishes the record holding ``e`` last; its entries are
   visible only once ``e`` is published, so a reader sees all of it or none.
   Where the store sends several records' commands in one round trip
   (Aerospike's batch write), the records before the last go together: a
   batch of any size then costs 3 round trips, not 1 + records. They may be
   applied in any order, and some only: none of them is visible before ``e``.

Readers see only the published prefix (:mod:`large_queue.appends._prefix`):
up to the first reserved offset that is neither published nor closed. A
reservation left unpublished past the queue's hole timeout (measured by the
waiting reader on its own clock, from when it first saw the hole) is
*closed*: a guarded write puts a tombstone ``[o]`` in the slot, which no
publish of ``o`` can pass; for a spanning batch the tombstone goes on ``e``.

The failure story, as a timeline (hole timeout 5 s)::

    t=0.0  P reserves 1 entry: tail 40 -> 41; its offset is 40.
    t=0.0  Q reserves 1 entry: offset 41, publishes it at once.
    t=0.1  P pauses (GC, SIGSTOP) before publishing 40.
    t=0.2  A dequeuer reads 40 (still [-1] from an older lap: a hole) and 41
           (published). The prefix ends at 40: it delivers nothing, notes the
           hole, and later calls find it still open.
    t=5.2  The hole has been open 5 s on the dequeuer's clock: it writes the
           tombstone [40], guarded by "slot holds an offset below 40". The
           prefix moves on: 41 is delivered.
    t=9.0  P resumes and publishes 40: the slot holds [40], not below 40,
           so the store refuses it. P reads the slot, finds the tombstone
           and raises ReservationClosedError: nothing of it is visible,
           and retrying the append is safe (it takes a new offset).

In a format-4 queue the dequeuer first records in the metadata record that
it is closing 40 (a "closing" mark), then writes the tombstone, then marks
the run closed. A receipt of P's reservation, read after a later lap has
reused slot 40, is then settled without the slot: a "closed" mark says it
was closed; a "closing" mark alone says the closer may have died in between
(unknown); no mark at all says no reader ever closed it, so, as slots are
reused only past published or closed offsets, it was published (unless an
overwriting reservation or a consumer group's head may have skipped it:
``skipped_to`` records how far those went).

If P had published at t=5.1, the tombstone's guard would have failed
instead, and the dequeuer would have delivered 40 then 41. A publish that
times out is sent again: once applied, the repeat is refused by its own
slot, and reading the slot tells the two apart. A reservation that timed
out in doubt is simply reserved again: if the first one was applied, it is a
hole that readers close, and nothing of it is ever visible. An overwriting
reservation repeated so moves the head once more as well: where the queue
was full, the first one's ``n`` offsets drop ``n`` more of the oldest
entries, as its own append would have (counted as overwritten).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from large_queue import _records as rec
from large_queue import errors
from large_queue._msgpack import pack
from large_queue._stats import Counters
from large_queue.appends._slots import (
    SAME_QUEUE,
    SlotPut,
    SlotRun,
    by_size,
    entries_of,
    pairs,
    slot_writes,
    slots_below,
    tombstone,
)
from large_queue.backends import (
    Backend,
    Compute,
    Evaluate,
    Increment,
    ListGetRange,
    LogPut,
    Operation,
    Read,
    Record,
)
from large_queue.backends.conditions import (
    And,
    Bound,
    Condition,
    IntBin,
    Param,
    all_of,
    le,
    max_of,
    sub,
)
from large_queue.fencing import same_queue
from large_queue.lock import READ_STORE_CLOCK, STORE_CLOCK, gone_error, replaced_error

log = logging.getLogger("large_queue")

#: tries of a reserve or publish that times out
ATTEMPTS = 3


class ReceiptWrite(NamedTuple):
    """What a reservation with a caller's txn id writes and requires (see :mod:`large_queue._receipts`)."""

    put: LogPut  #: the receipt's write, in the reservation's command
    guard: Bound  #: what the receipt log must hold for the reservation to go ahead
    txn_id: str


class Duplicate(Exception):
    """A reservation with a txn id was refused: the txn already has a receipt (``receipt``, as stored)."""

    def __init__(self, receipt: Any) -> None:
        super().__init__("the txn id has a receipt")
        self.receipt = receipt


#: at least ``count`` slots are free: tail - head <= capacity - count
_ROOM = all_of(SAME_QUEUE, le(sub(IntBin(rec.TAIL), IntBin(rec.HEAD)), Param("room")))
#: after the tail moved: the head, moved past what the new tail pushes out of the buffer
_PAST_OLDEST = max_of(IntBin(rec.HEAD), sub(IntBin(rec.TAIL), Param("capacity")))
#: format 4: how far an overwriting reservation may have skipped unpublished offsets
_SKIPPED_PAST_OLDEST = max_of(IntBin(rec.SKIPPED_TO), sub(IntBin(rec.TAIL), Param("capacity")))


#: the result under which an overwriting reservation reads the head it found, and the operation
_HEAD_BEFORE = "head_before"
_READ_HEAD_BEFORE = Evaluate(_HEAD_BEFORE, IntBin(rec.HEAD))


def dropped(counters: Counters, queue_name: str, old_head: int, new_head: int) -> None:
    """Count and log the entries an overwriting append dropped: offsets ``old_head..new_head-1``.

    They were not dequeued when the append moved the head past them to make
    room (``overwrite_if_full``). Consumers that meet the loss count it
    again as theirs (a group's ``lost``); a plain queue's only record of it
    is this count (``entries_overwritten``) and the log line (INFO). A
    dequeue under way at that moment, which had read some of them before
    their slots were written again, still delivers those (its commit never
    moves the head back): they are then both delivered and counted here,
    never delivered twice.
    """
    if new_head <= old_head:
        return
    counters.add(entries_overwritten=new_head - old_head)
    log.info(  # not a warning: the caller asked for it, and a ring buffer does it at every append
        "queue %r: an append with overwrite_if_full dropped %d entries (offsets %d..%d) before they were"
        " dequeued",
        queue_name,
        new_head - old_head,
        old_head,
        new_head - 1,
    )


@functools.lru_cache(maxsize=256)
def _reserving(count: int, overwriting_capacity: int | None, marked: bool = False) -> tuple[Operation, ...]:
    """A reservation's operations: the tail grows by ``count`` (and, overwriting, the head follows).

    It also reads the store's clock: the time its entries are stamped with.
    ``marked`` (format 4): an overwriting reservation records how far it may
    have skipped unpublished offsets.
    """
    operations: list[Operation] = [Increment(rec.TAIL, count)]
    if overwriting_capacity is not None:
        operations.append(_READ_HEAD_BEFORE)  # what the head passes is counted and logged (see dropped)
        operations.append(Compute(rec.HEAD, _PAST_OLDEST, {"capacity": overwriting_capacity}))
        if marked:
            operations.append(
                Compute(rec.SKIPPED_TO, _SKIPPED_PAST_OLDEST, {"capacity": overwriting_capacity})
            )
    operations.append(Read(rec.TAIL))
    operations.append(READ_STORE_CLOCK)
    return tuple(operations)


@functools.lru_cache(maxsize=16)
def _both(first: Condition, second: Condition) -> And:
    """Template: both templates hold (built once per pair, so stores compile it once)."""
    return all_of(first, second)


class Appender:
    """Reserve and publish for one queue handle (see the module's timeline)."""

    def __init__(
        self,
        backend: Backend,
        keys: rec.QueueKeys,
        shape: rec.QueueShape,
        *,
        incarnation: str,
        counters: Counters,
        closed_mark: Callable[[int, int, str | None], Operation] | None = None,
        marked: bool = False,
    ) -> None:
        self.backend = backend
        self.keys = keys
        self.shape = shape
        #: the metadata write that records a closed run ``(first offset, count, state)`` (see :meth:`close`)
        self.closed_mark = closed_mark
        #: format 4: a run is marked as closing before it is closed; overwrites record what they skip
        self.marked = marked
        self.incarnation = incarnation
        self.counters = counters
        self._reserve_one: Callable[[], dict[str, Any]] | None = None  # built at the first single reserve

    # --- reserve ------------------------------------------------------------------------

    def reserve(self, count: int, *, overwrite: bool, receipt: ReceiptWrite | None = None) -> int:
        """Take the next ``count`` offsets; return the first. One command (see :meth:`reserve_stamped`)."""
        return self.reserve_stamped(count, overwrite=overwrite, receipt=receipt)[0]

    def reserve_stamped(
        self, count: int, *, overwrite: bool, receipt: ReceiptWrite | None = None
    ) -> tuple[int, int]:
        """Take the next ``count`` offsets; return the first, and the store's clock (ms) then. One command.

        The entries are published stamped with that time: their
        ``enqueued_at_ms`` is the store's, whatever the producer's clock says.

        ``QueueFullError`` (nothing reserved) when fewer than ``count`` slots
        are free and not ``overwrite``. ``receipt`` (:mod:`large_queue._receipts`) is
        written by the same command; :class:`Duplicate` if the guard refused it.
        """
        capacity = self.shape.capacity
        if receipt is not None:
            values = {"incarnation": self.incarnation, "room": capacity - count, **receipt.guard.values}
            guard_both = Bound(_both(SAME_QUEUE if overwrite else _ROOM, receipt.guard.template), values)
            operations = (*_reserving(count, capacity if overwrite else None, self.marked), receipt.put)
            send: Callable[[], dict[str, Any]] = functools.partial(
                self.backend.operate, self.keys.metadata, operations, condition=guard_both
            )
        elif count == 1 and not overwrite:  # the common single enqueue: its command is built once
            if self._reserve_one is None:
                guard_one = Bound(_ROOM, {"incarnation": self.incarnation, "room": capacity - 1})
                self._reserve_one = self.backend.operation(
                    self.keys.metadata, _reserving(1, None), condition=guard_one
                )
            send = self._reserve_one
        else:
            operations = _reserving(count, capacity if overwrite else None, self.marked)
            if overwrite:
                guard: Condition = Bound(SAME_QUEUE, {"incarnation": self.incarnation})
            else:
                guard = Bound(_ROOM, {"incarnation": self.incarnation, "room": capacity - count})
            send = functools.partial(self.backend.operate, self.keys.metadata, operations, condition=guard)
        refused = 0
        for attempt in range(1, ATTEMPTS + 1):
            self.counters.bump("commands")
            try:
                result = send()
            except errors.BackendTimeoutError as exc:
                # Applied or not, repeating is safe: an applied reservation that
                # nobody publishes is a hole that readers close.
                if attempt == ATTEMPTS:
                    raise errors.BackendTimeoutError(
                        f"reserving {count} offsets in queue {self.keys.name!r} timed out {ATTEMPTS} times"
                        f" ({exc}): nothing of the append is visible, or will be (a reservation applied"
                        " unseen is a hole that readers close), so appending again is safe",
                        code=exc.code,
                        in_doubt=False,
                    ) from exc
                self.counters.bump("timeouts_repeated")
                continue
            except errors.ConditionNotMetError:
                refused += 1
                refusal = self._refusal(count, receipt, overwrite=overwrite)
                if refusal is not None or attempt == ATTEMPTS:
                    raise (refusal or self._full(count, 0, refused=refused)) from None
                continue  # full then, not now (a reader made room in between): nothing was written
            except errors.RecordNotFoundError:
                raise replaced_error(self.keys.name, created_again=False) from None
            self.counters.bump("reservations")
            tail: int = result[rec.TAIL]
            if overwrite:
                head_before: int = result[_HEAD_BEFORE]
                dropped(self.counters, self.keys.name, head_before, max(head_before, tail - capacity))
            return tail - count, result[STORE_CLOCK]
        raise AssertionError("ATTEMPTS must be positive")

    def _refusal(
        self, count: int, receipt: ReceiptWrite | None, *, overwrite: bool = False
    ) -> Exception | None:
        """Why a reservation was refused: the queue is full, it is not the queue opened, or (with
        ``receipt``) the txn's receipt is not what the reservation required (:class:`Duplicate`).
        None: without ``receipt``, the queue has room now (it was full then: asking again is safe).

        With ``receipt``, a refusal that the record read here does not explain
        (the queue has room now, or the reservation overwrites and needs none)
        is ``OutcomeUnknownError``: either the queue was full then, or a
        receipt of an earlier call of the txn was in the log and has been
        pushed out of it since by later calls with txn ids. Nothing of this
        call was written; ``queue.outcome`` tells what became of an earlier one.
        """
        record = self._metadata()
        if isinstance(record, Exception):
            return record
        receipts = record.bins.get(rec.RECEIPTS)
        if receipt is not None and type(receipts) is dict and receipt.txn_id in receipts:
            stored = receipts[receipt.txn_id]
            required = receipt.guard.values.get("first")
            if required is None or not (type(stored) is list and len(stored) > 1 and stored[1] == required):
                return Duplicate(stored)  # not the receipt the guard required: the caller reads it
        used = record.bins.get(rec.TAIL, 0) - record.bins.get(rec.HEAD, 0)
        if receipt is not None and (overwrite or self.shape.capacity - used >= count):
            self.counters.bump("outcomes_unknown")
            return errors.OutcomeUnknownError(
                f"an enqueue with txn id {receipt.txn_id!r} to queue {self.keys.name!r} was refused,"
                " and nothing of it was written: the queue was full then (it has room now), or the"
                " receipt of an earlier call with that txn id was in the receipt log and has been"
                " pushed out of it since; queue.outcome(txn_id) tells what became of such a call"
                " (keep more receipts to keep them longer: Queue.create(..., receipts=N))",
                queue=self.keys.name,
                txn_id=receipt.txn_id,
                stage="reserving",
                detail="refused for lack of room, or for a receipt that has left the log since",
            )
        if self.shape.capacity - used >= count:
            return None
        return self._full(count, self.shape.capacity - used)

    def _full(self, count: int, free: int, *, refused: int = 0) -> errors.QueueFullError:
        """``QueueFullError`` for a reservation of ``count`` that found ``free`` slots (``refused``:
        refused that many times for want of room, readers freeing some in between each time)."""
        found = (
            f"was full each of the {refused} times it was asked for {count} slots (readers freed some in"
            " between)"
            if refused
            else f"has {free} free slots, {count} requested"
        )
        return errors.QueueFullError(
            f"queue {self.keys.name!r} {found} (capacity {self.shape.capacity}; reserved but unpublished"
            " slots count as used)",
            queue=self.keys.name,
        )

    def _metadata(self) -> Record | errors.QueueNotFoundError:
        """The metadata record (one command), or the error if the queue opened is not there any more."""
        self.counters.bump("commands")
        record = self.backend.get(self.keys.metadata)
        if record is None or record.bins.get(rec.INCARNATION) != self.incarnation:
            return gone_error(self.keys.name, record)
        return record

    def store_now(self) -> int:
        """The store's clock (ms), read by one command on the metadata record."""
        self.counters.bump("commands")
        found = self.backend.operate(self.keys.metadata, [READ_STORE_CLOCK])
        now_ms: int = found[STORE_CLOCK]
        return now_ms

    # --- publish ------------------------------------------------------------------------

    def publish(self, first: int, values: Sequence[Any], now_ms: int, *, repeat: bool = False) -> None:
        """Write ``values`` into the slots reserved from ``first``: a command per buffer record, or two.

        ``ReservationClosedError`` if a reader closed the reservation first
        (nothing of it is then visible). ``repeat``: an earlier call of the
        same txn may have published some of these slots; a record whose
        slots already hold their entries counts as published.
        """
        if len(values) == 1:  # the common single enqueue: one slot, one command
            slot = self.shape.slot_of(first)
            single = [slot_writes(slot, [[first, values[0], now_ms]], self.shape.slots_per_record)]
            put = SlotPut(self.shape.record_of(first), single, [SlotRun(slot, 1, first)])
            try:
                self._put_slots(put, published=True, repeat=repeat)
            except errors.OutcomeUnknownError:
                self.counters.bump("outcomes_unknown")
                raise
            return
        last = first + len(values) - 1
        runs = self.shape.runs(first, last + 1)
        spanning = len(runs) > 1
        last_record = self.shape.record_of(last)
        puts: list[SlotPut] = []
        for record in [record for record in runs if record != last_record] + [last_record]:
            put = SlotPut(record, [], [])
            for run in runs[record]:
                if spanning:
                    content = [[o, values[o - first], now_ms, last] for o in run]
                else:
                    content = [[o, values[o - first], now_ms] for o in run]
                start = self.shape.slot_of(run.start)
                put.slots.append(SlotRun(start, len(run), run.start))
                put.writes.append(slot_writes(start, content, self.shape.slots_per_record))
            puts.append(put)
        *before_last, holding_last = puts
        try:
            self._put_records(before_last, repeat=repeat)
        except errors.ReservationClosedError:
            self._abandon(last)  # settle it now: nothing of it may ever be visible
            raise
        except errors.OutcomeUnknownError as exc:
            if repeat:  # a txn's call: made again with its txn id, it publishes these very offsets
                exc.offsets = range(first, last + 1)
                self.counters.bump("outcomes_unknown")
                raise
            # A part before the last in doubt: the batch shows only once its last record is
            # published, which it now never is (no call can make it again).
            self._abandon(last)
            raise errors.BackendTimeoutError(
                f"publishing a batch of {len(values)} entries to queue {self.keys.name!r} timed out before"
                f" its last buffer record ({exc.detail}): nothing of the batch is visible, or will be"
                " (readers show a batch spanning records only once its last record is published, and its"
                " reservation is closed), so appending again is safe",
                code=getattr(exc.__cause__, "code", None),
                in_doubt=False,
            ) from exc
        try:
            self._put_slots(holding_last, published=True, repeat=repeat)
        except errors.OutcomeUnknownError as exc:
            exc.offsets = range(first, last + 1)  # the batch shows whole or not at all
            self.counters.bump("outcomes_unknown")
            raise

    def _put_records(self, puts: list[SlotPut], *, repeat: bool) -> None:
        """Publish the slots of several buffer records: one command where the store sends them together.

        Otherwise one command a record, stopping at the first refused. Sent
        together, each record's refusal or timeout is then settled as
        :meth:`_put_slots` settles it, and the first error is raised (a
        closed reservation before any other: nothing of the batch may show).
        """
        if len(puts) < 2 or not self.backend.operates_together:
            for put in puts:
                self._put_slots(put, published=True, repeat=repeat)
            return
        failures: list[errors.LargeQueueError] = []
        outcomes = [outcome for together in by_size(puts) for outcome in self._send(together)]
        for put, outcome in zip(puts, outcomes, strict=True):
            try:
                self._put_slots(put, published=True, repeat=repeat, outcome=outcome)
            except errors.LargeQueueError as exc:
                failures.append(exc)
        if failures:
            closed = [exc for exc in failures if isinstance(exc, errors.ReservationClosedError)]
            raise (closed or failures)[0]

    def _abandon(self, last: int) -> None:
        """Tombstone a spanning batch's last slot (unless a reader did), so that none of it shows."""
        with contextlib.suppress(errors.LargeQueueError):  # else the reader that waits on it closes it
            self.close(last, last + 1)

    def close(self, start: int, stop: int) -> None:
        """Tombstone the unpublished offsets ``[start, stop)`` (one buffer record): one command.

        ``ReservationClosedError`` is not raised here; a refusal (a publish
        got there first) raises ``ConditionNotMetError`` for the reader to
        read again. In a format-4 queue the run is first marked as closing
        (one more command, before anything is tombstoned; if it fails, nothing
        is closed and its error is raised).
        """
        run = range(start, stop)
        if self.marked:
            self._mark_run(start, len(run), rec.CLOSING, required=True)
        first_slot = self.shape.slot_of(start)
        writes = [slot_writes(first_slot, [tombstone(o) for o in run], self.shape.slots_per_record)]
        put = SlotPut(self.shape.record_of(start), writes, [SlotRun(first_slot, len(run), start)])
        self._put_slots(put, published=False)
        self.counters.bump("holes_closed")
        self._mark_run(start, len(run), rec.CLOSED_RUN if self.marked else None)

    def _mark_run(self, start: int, count: int, state: str | None, *, required: bool = False) -> None:
        """Mark ``count`` offsets from ``start`` as being closed, or closed, in the metadata (one command).

        ``state`` CLOSING is written before the tombstones, CLOSED_RUN (or
        None, in a format-3 queue) after them: a closed mark is always true.
        Once a later lap reuses the slots, the marks are what tell the receipt
        of a reservation closed here from one published and consumed
        (:func:`large_queue._receipts.outcome`). A closed mark that is not
        written (the write failed, the closer died first) leaves the closing
        mark, which makes such a receipt "unknown", which is true too.
        ``required``: a failed write raises (the run must then not be closed).
        """
        if self.closed_mark is None:
            return
        self.counters.bump("commands")
        try:
            self.backend.operate(
                self.keys.metadata,
                [self.closed_mark(start, count, state)],
                condition=same_queue(self.incarnation),
            )
        except errors.LargeQueueError:
            if required:
                raise
            log.debug("could not record the closed run %d+%d of queue %r", start, count, self.keys.name)

    def _send(self, puts: Sequence[SlotPut]) -> list[dict[str, Any] | errors.BackendError]:
        """One command: the guarded slot writes of ``puts`` (of several records where the store can).

        Each record's outcome: what it read, or the error that stopped it.
        """
        self.counters.bump("commands")
        commands = [
            (self.keys.buffer(put.record), put.writes, slots_below(self.incarnation, put.slots))
            for put in puts
        ]
        if len(commands) > 1:
            return self.backend.operate_each(commands)
        key, writes, guard = commands[0]
        try:
            return [self.backend.operate(key, writes, condition=guard)]
        except errors.BackendError as exc:
            return [exc]

    def _put_slots(
        self,
        put: SlotPut,
        *,
        published: bool,
        repeat: bool = False,
        outcome: dict[str, Any] | errors.BackendError | None = None,
    ) -> None:
        """One record's guarded slot write, sent again if it times out; a refusal explained by its slots.

        ``outcome``: what the write gave where it was sent beside others
        (:meth:`_put_records`); it is then not sent again unless that timed out.
        """
        timed_out = False
        for attempt in range(1, ATTEMPTS + 1):
            if outcome is None:
                (outcome,) = self._send([put])
            failure, outcome = outcome, None
            if not isinstance(failure, errors.BackendError):
                return
            if isinstance(failure, errors.BackendTimeoutError):
                if attempt == ATTEMPTS:
                    if published:
                        raise self._unknown(put, f"timed out {ATTEMPTS} times", failure) from failure
                    raise failure
                timed_out = True
                self.counters.bump("timeouts_repeated")
            elif isinstance(failure, errors.ConditionNotMetError):
                if not published:
                    raise failure
                try:
                    mine = entries_of(put) if repeat else None
                    if (timed_out or repeat) and self._holds_entries(put.record, pairs(put.slots), mine):
                        return  # the timed-out attempt (or the txn's earlier call) was applied
                    closed = self._closed(put.record, pairs(put.slots), timed_out=timed_out)
                except errors.BackendError as exc:  # its slots could not be read to tell
                    if not timed_out:
                        raise
                    raise self._unknown(put, "timed out, and its slots could not be read", exc) from exc
                raise closed from None
            elif isinstance(failure, errors.RecordNotFoundError):
                raise self._missing(put) from None
            else:
                raise failure

    def _unknown(self, put: SlotPut, what: str, cause: errors.BackendError) -> errors.OutcomeUnknownError:
        """A publish that timed out, and was not found applied or not: any attempt may have been.

        Counted where it leaves :meth:`publish` (a part of a spanning batch before its last is no
        outcome in doubt: the batch then never shows).
        """
        offsets = [offset for _, offset in pairs(put.slots)]
        return errors.OutcomeUnknownError(
            f"a publish to queue {self.keys.name!r} {what}: it may have been applied"
            " (its entries visible) or not (a reader then closes its offsets after the hole timeout);"
            " with a txn_id, queue.outcome(txn_id) or the same call again settles it",
            queue=self.keys.name,
            stage="publishing",
            detail=f"offsets {offsets[0]}..{offsets[-1]} in buffer record {put.record} ({cause})",
            offsets=range(offsets[0], offsets[-1] + 1),
        )

    def _missing(self, put: SlotPut) -> errors.QueueError:
        """Why a publish found no buffer record: the queue is gone (or another now), or that record is."""
        metadata = self._metadata()
        if isinstance(metadata, Exception):
            return metadata
        offsets = [offset for _, offset in pairs(put.slots)]
        return errors.CorruptQueueError(
            f"buffer record {put.record} of queue {self.keys.name!r} is missing: offsets {offsets[0]}.."
            f"{offsets[-1]} were reserved and not written (readers close them after the hole timeout);"
            " large-queue check --repair makes the record again",
            queue=self.keys.name,
            record=put.record,
        )

    def _read_slots(self, record: int, slots: list[tuple[int, int]]) -> list[Any]:
        """What the slots of ``(slot index, offset)`` pairs hold now, in their order (one command)."""
        low = min(index for index, _ in slots)
        high = max(index for index, _ in slots)
        self.counters.bump("commands")
        found = self.backend.operate(
            self.keys.buffer(record), [Read(rec.INCARNATION), ListGetRange(rec.SLOTS, low, high - low + 1)]
        )
        if found.get(rec.INCARNATION) != self.incarnation:
            raise replaced_error(self.keys.name, created_again=True)
        got: list[Any] = found.get(rec.SLOTS, [])
        return [got[index - low] for index, _ in slots if index - low < len(got)]

    def holds(self, offset: int) -> bool:
        """True if ``offset``'s slot holds its published entry (one command)."""
        return self._holds_entries(self.shape.record_of(offset), [(self.shape.slot_of(offset), offset)])

    def _holds_entries(
        self, record: int, slots: list[tuple[int, int]], mine: dict[int, Any] | None = None
    ) -> bool:
        """Whether the slots hold their offsets' published entries (one command).

        ``mine``: the entries this call publishes, by offset. Slots that hold
        other entries were published by another call with the same txn id
        and other entries: ``InvalidArgumentError``, so that neither call
        publishes the rest of the batch over the other's part of it::

            t=0  A (txn "t", entries a0..a11) reserves 0..11 and publishes
                 buffer record 0 (a0..a9); it pauses before record 1.
            t=1  B (txn "t", entries b0..b11) finds the reservation pending
                 and publishes it: record 0 is refused (published), and its
                 slots hold a0..a9, not b0..b9: B raises, having written
                 nothing. Had it gone on to record 1, readers would see
                 a0..a9 and b10..b11, and both calls would return 0..11.
            t=2  A resumes and publishes record 1: the batch is A's, whole.

        A batch over three records or more sends the records before its last
        together, which Aerospike does not apply as one: A's record 0 and B's
        record 1 may both land. Both calls then raise, neither publishes the
        last record, and nothing of the batch shows: readers close the
        reservation after the hole timeout, and the txn's next call enqueues
        anew.
        """
        got = self._read_slots(record, slots)
        held = all(
            isinstance(slot, list) and len(slot) >= 3 and slot[0] == offset
            for slot, (_, offset) in zip(got, slots, strict=False)
        ) and len(got) == len(slots)
        if held and mine is not None:
            others = [
                offset
                for slot, (_, offset) in zip(got, slots, strict=True)
                if pack(slot[1]) != pack(mine[offset])  # as stored: 1 and 1.0 differ, NaN is NaN
            ]
            if others:
                raise errors.InvalidArgumentError(
                    f"offsets {others[0]}..{others[-1]} of queue {self.keys.name!r} hold the entries of"
                    " another call made with the same txn id, and other entries: a txn id names one call,"
                    " made again only with the same entries. This call publishes nothing more; whatever"
                    " either call published of the batch shows only once its last record is, so none of it"
                    " shows unless the other call finishes it (otherwise readers close the reservation"
                    " after the hole timeout, and a call made again with the txn id then enqueues anew)"
                )
        return held

    def _closed(
        self, record: int, slots: list[tuple[int, int]], *, timed_out: bool
    ) -> errors.LargeQueueError:
        """The error for a refused publish, from what its slots hold now.

        A tombstone is certain: it is written only over a slot our publish
        never reached. A later lap's entry is certain only if no attempt
        timed out; otherwise our publish may have been applied, read and
        consumed, and the slot reused since: the outcome is unknown.
        """
        got = self._read_slots(record, slots)
        newer = any(
            isinstance(slot, list) and slot and type(slot[0]) is int and slot[0] > offset
            for slot, (_, offset) in zip(got, slots, strict=False)
        )
        if newer and timed_out:  # counted where it leaves publish()
            return errors.OutcomeUnknownError(
                f"a publish to queue {self.keys.name!r} timed out, and its slots now hold a later lap's"
                " entries: it may have been applied (and its entries consumed since) or not",
                queue=self.keys.name,
                stage="publishing",
                detail=f"offsets {slots[0][1]}..{slots[-1][1]} in buffer record {record}",
                offsets=range(slots[0][1], slots[-1][1] + 1),
            )
        self.counters.bump("reservations_closed")
        why = (
            "overwriting producers had already reused its slots"
            if newer
            else f"a reader closed it after the hole timeout (offsets {slots[0][1]}..{slots[-1][1]})"
        )
        return errors.ReservationClosedError(
            f"an append to queue {self.keys.name!r} was not published in time: {why}; nothing of it"
            " is visible, and appending again is safe",
            queue=self.keys.name,
        )


__all__ = [
    "ATTEMPTS",
    "Appender",
    "Duplicate",
    "ReceiptWrite",
    "SlotPut",
    "SlotRun",
    "pairs",
    "slots_below",
    "tombstone",
]
