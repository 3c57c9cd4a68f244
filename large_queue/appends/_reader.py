"""Reading a queue with lock-free appends: slots in bulk, settled into the published prefix.

Used where a reader reads without the lock (offset reads, ``info()``, the
Spark connector, ``check``) and, for closing holes, by every reader that
waits on one (dequeuers, owners in the cluster shim, streaming reads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from large_queue import _records as rec
from large_queue import errors
from large_queue._stats import Counters
from large_queue.appends import Appender
from large_queue.appends._prefix import HoleWatch, Settled, settle
from large_queue.backends import Backend, Compute, ListGetRange, Operation, RecordKey
from large_queue.backends.conditions import IntBin, Param, max_of
from large_queue.fencing import same_queue

#: buffer records read in one batch while looking for the prefix end
RECORDS_PER_READ = 64
_PUBLISHED_AT_LEAST = max_of(IntBin(rec.PUBLISHED), Param("published"))


class PrefixReader:
    """Reads slot ranges of one queue, settles them, and closes holes found overdue."""

    def __init__(
        self,
        backend: Backend,
        keys: rec.QueueKeys,
        shape: rec.QueueShape,
        appender: Appender,
        watch: HoleWatch,
        counters: Counters,
    ) -> None:
        self.backend = backend
        self.keys = keys
        self.shape = shape
        self.appender = appender
        self.watch = watch
        self.counters = counters
        #: how the spanning batches met so far settled, by last offset (final, so kept)
        self.verdicts: dict[int, str] = {}
        #: how far this handle has found the published prefix to reach: it never moves back (a
        #: published slot stays so until a later lap's entry takes it, a tombstone for good), so
        #: offset reads below it need no settling from the stored hint on
        self.settled_end = 0

    def corrupt(self, offset: int, problem: str) -> errors.CorruptQueueError:
        """The error for a malformed slot."""
        return errors.CorruptQueueError(
            f"buffer record {self.shape.record_of(offset)} of queue {self.keys.name!r}: {problem}",
            queue=self.keys.name,
            record=self.shape.record_of(offset),
        )

    def fetch(self, offset: int) -> Any:
        """The slot of ``offset``, read alone (one command)."""
        record = self.shape.record_of(offset)
        self.counters.bump("commands")
        try:
            found = self.backend.operate(
                self.keys.buffer(record), [ListGetRange(rec.SLOTS, self.shape.slot_of(offset), 1)]
            )
        except errors.RecordNotFoundError:
            raise self.corrupt(offset, "the record is missing") from None
        slots = found.get(rec.SLOTS)
        return slots[0] if isinstance(slots, list) and slots else None

    def settle(
        self, start: int, stop: int, slot_at: Callable[[int], Any], after: Settled | None = None
    ) -> Settled:
        """Settle ``[start, stop)`` from slots already read (``slot_at``), going on from ``after``.

        A malformed slot is ``CorruptQueueError``.
        """
        if len(self.verdicts) > 10_000:
            self.verdicts.clear()
        try:
            return settle(start, stop, slot_at, self.fetch, self.verdicts, after)
        except ValueError as exc:  # a MalformedSlot names its offset
            raise self.corrupt(getattr(exc, "offset", start), str(exc)) from None

    def read(self, start: int, stop: int, after: Settled | None = None) -> Settled:
        """Read ``[start, stop)`` (one batch read per :data:`RECORDS_PER_READ` records) and settle it."""
        return self.settle(start, stop, self.slots(start, stop).__getitem__, after)

    def slots(self, start: int, stop: int) -> dict[int, Any]:
        """The slots of offsets ``[start, stop)`` as stored (batch reads of up to 64 records)."""
        slots: dict[int, Any] = {}
        runs = [run for record_runs in self.shape.runs(start, stop).values() for run in record_runs]
        runs.sort(key=lambda run: run.start)
        for first in range(0, len(runs), RECORDS_PER_READ):
            part = runs[first : first + RECORDS_PER_READ]
            reads: list[tuple[RecordKey, list[Operation] | None]] = [
                (
                    self.keys.buffer(self.shape.record_of(run.start)),
                    [ListGetRange(rec.SLOTS, self.shape.slot_of(run.start), len(run))],
                )
                for run in part
            ]
            self.counters.bump("commands")
            try:
                answers = self.backend.batch_read(reads)
            except errors.CorruptRecordError:
                answers = [self._read_alone(key, operations) for key, operations in reads]
            for run, found in zip(part, answers, strict=True):
                got = found.get(rec.SLOTS) if found is not None else None
                if not isinstance(got, list) or len(got) != len(run):
                    raise self.corrupt(run.start, "the record or its slots are missing")
                slots.update(zip(run, got, strict=True))
        return slots

    def _read_alone(self, key: RecordKey, operations: list[Operation] | None) -> dict[str, Any] | None:
        """One record of a batch that could not be read, read alone: ``CorruptQueueError`` names it."""
        self.counters.bump("commands")
        try:
            return self.backend.operate(key, operations or [])
        except errors.RecordNotFoundError:
            return None
        except errors.CorruptRecordError as exc:
            record = int(key.user_key.removeprefix(rec.BUFFER_KEY_PREFIX))
            raise errors.CorruptQueueError(
                f"buffer record {record} of queue {self.keys.name!r} cannot be read ({exc}); readers"
                " cannot see past it (large-queue check names what is damaged)",
                queue=self.keys.name,
                record=record,
            ) from exc

    def close_overdue(self, settled: Settled) -> bool:
        """Close the hole ``settled`` ends at if it has been open past the hole timeout; True if closed.

        A pending part of a spanning batch is closed by a tombstone on the
        batch's last slot; other pending offsets by tombstones on the overdue
        ones from the hole on, in its buffer record.
        """
        if not settled.pending:
            return False
        due = self.watch.overdue(settled.pending)
        if not due:
            return False
        if settled.waiting_on is not None:
            self._close_batch(settled.end, settled.waiting_on)
            return True
        start = due[0]
        record_end = (start // self.shape.slots_per_record + 1) * self.shape.slots_per_record
        stop = min(due[-1] + 1, record_end)
        try:
            self.appender.close(start, stop)
        except errors.ConditionNotMetError:
            return True  # published (or closed by another reader) meanwhile: read again
        return True

    def _close_batch(self, first_pending: int, last: int) -> None:
        """Close a spanning batch: a tombstone on its last offset, then on each of its parts never written.

        The last offset decides (nothing of the batch shows once it is a
        tombstone); the parts its producer never wrote would still look like
        ordinary holes to a reader that starts among them, so they are closed
        too, record by record. A part written meanwhile refuses its record's
        tombstones, and is closed by the last offset's anyway.
        """
        try:
            self.appender.close(last, last + 1)
        except errors.ConditionNotMetError:
            return  # published (or closed) meanwhile: readers read it again
        unwritten = {
            offset
            for offset, slot in self.slots(first_pending, last).items()
            if isinstance(slot, list) and slot and type(slot[0]) is int and slot[0] < offset
        }
        for record_runs in self.shape.runs(first_pending, last).values():
            for run in record_runs:
                for start, stop in _consecutive([o for o in run if o in unwritten]):
                    with contextlib.suppress(errors.ConditionNotMetError):
                        self.appender.close(start, stop)

    def prefix_end(self, head: int, published: int, tail: int) -> tuple[int, Settled | None]:
        """The published prefix end, settled from ``max(head, published)`` on, read in bulk.

        Also returns the settled part that ends at a hole (None if none does).
        When the end lies a record or more past the stored hint, the hint is
        moved (one more command), so that the next reader starts there.
        """
        last = self.walk(max(head, published, self.settled_end), tail, published)
        if last is None:
            return max(head, published, self.settled_end), None
        return last.end, last if last.pending else None

    def walk(self, start: int, stop: int, published: int) -> Settled | None:
        """Settle ``[start, stop)`` part by part, ``start`` in the published prefix; the last part.

        A part is a batch read of :data:`RECORDS_PER_READ` records, so that
        memory stays bounded however far ``stop`` lies; the walk ends at
        ``stop`` or at the first hole (the last part then ``pending``). It
        moves the stored hint when it settled a record or more past it (one
        more command), and this handle's :attr:`settled_end`. None if
        ``start >= stop``.
        """
        step = RECORDS_PER_READ * self.shape.slots_per_record
        end = start
        last: Settled | None = None
        while end < stop:
            part_stop = min(stop, end + step)
            last = self.read(end, part_stop, last)
            end = last.end
            if last.pending or end < part_stop:
                break
        self.settled_end = max(self.settled_end, end)
        if end - published >= self.shape.slots_per_record:
            self.counters.bump("commands")
            # a hint: the next reader settles a little more. Not waited for: a reader (info(), say)
            # must not wait out a writer stopped inside a command for a hint
            with contextlib.suppress(errors.LargeQueueError), self.backend.waiting_at_most(0.0):
                self.backend.operate(
                    self.keys.metadata,
                    [Compute(rec.PUBLISHED, _PUBLISHED_AT_LEAST, {"published": end})],
                    condition=same_queue(self.appender.incarnation),
                )
        return last


def _consecutive(offsets: list[int]) -> list[tuple[int, int]]:
    """``[start, stop)`` of each run of consecutive offsets, in order."""
    runs: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if runs and runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], offset + 1)
        else:
            runs.append((offset, offset + 1))
    return runs


__all__ = ["PrefixReader"]
