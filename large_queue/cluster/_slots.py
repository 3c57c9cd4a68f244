"""Reading what one delivery needs: the slots of the offsets it may deliver, in one round trip or none.

An owner delivers entries due again (any offsets) and fresh ones (a run from
its cursor). From each buffer record it reads one run of slots, from the
first wanted to the last, all in one batch read; with the metadata record
only when it must look past the tail it has already seen (offsets below a
tail once seen are committed for good: the tail only grows).

The common delivery (fresh offsets in one buffer record, below a tail seen)
reads ahead: up to :data:`READ_AHEAD` slots of that record, of which it
keeps the leading run of plain entries, each holding its own offset
(:class:`ReadAhead`). Such a slot keeps its entry until a later lap reuses
it, which only happens once the queue's head has passed it, so the next
deliveries take their slots from the run with no command. The timeline of
the one case where that shows, an overwriting producer P and an owner O::

    t=0  O reads slots 40..55 ahead, all entries, and delivers 40.
    t=1  P, overwriting a full queue, moves the head past 41 and writes
         its entry of a later lap into slot 41.
    t=2  O delivers 41 from what it read at t=0, not as lost: as if its
         read of 41 had come just before P's overwrite, which it did.

Holes (reserved, unpublished slots), tombstones, parts of batches that span
records and later laps' entries end the run: those are always judged on a
fresh read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from large_queue import _records as rec
from large_queue import errors
from large_queue.backends import ListGetRange, Operation, RecordKey
from large_queue.queue import Queue

#: slots a delivery of fresh offsets reads from its buffer record at least, to deliver the rest later
READ_AHEAD = 16


class SlotsRead:
    """The slots one delivery read, by offset; and the metadata record, if it was read too."""

    def __init__(
        self, shape: rec.QueueShape, wanted: dict[int, tuple[int, int]], slots: dict[int, Any], metadata: Any
    ) -> None:
        self.shape = shape
        self._wanted = wanted
        self._slots = slots
        self.metadata: rec.Metadata | None = metadata

    def slots_of(self, record: int) -> Any:
        """The slots read from buffer ``record`` (None if it was missing)."""
        return self._slots.get(record)

    def slot_at(self, offset: int) -> Any:
        """The slot of ``offset`` as read (None if its record was missing or it was not read)."""
        record = self.shape.record_of(offset)
        slot_list = self._slots.get(record)
        index = self.shape.slot_of(offset) - self._wanted[record][0]
        return slot_list[index] if isinstance(slot_list, list) and index < len(slot_list) else None


class ReadAhead:
    """The run of plain entries an owner read ahead in one buffer record (see the module's timeline)."""

    def __init__(self) -> None:
        self._start = 0  # the run's first offset
        self._record = 0
        self._first_slot = 0
        self._slots: list[Any] = []

    def covering(self, shape: rec.QueueShape, fresh: range) -> SlotsRead | None:
        """The slots of ``fresh`` from the run, or None where it does not hold them all."""
        if not self._slots or fresh.start < self._start or fresh[-1] >= self._start + len(self._slots):
            return None
        last_slot = self._first_slot + len(self._slots) - 1
        return SlotsRead(
            shape, {self._record: (self._first_slot, last_slot)}, {self._record: self._slots}, None
        )

    def keep(self, start: int, record: int, first_slot: int, slots: Any) -> None:
        """Keep the leading run of ``slots`` (read from ``start`` on) that are plain entries of their own."""
        run = 0
        if isinstance(slots, list):
            for offset, slot in enumerate(slots, start):
                if type(slot) is not list or len(slot) != 3 or slot[0] != offset:
                    break
                run += 1
        self._start, self._record, self._first_slot = start, record, first_slot
        self._slots = slots[:run] if run else []

    def clear(self) -> None:
        """Forget the run (ownership changed hands: read afresh)."""
        self._slots = []


def read_slots(
    queue: Queue, again: Sequence[int], fresh: range, seen_tail: int, ahead: ReadAhead
) -> SlotsRead:
    """Read the slots of offsets ``again`` and ``fresh`` (and the metadata past ``seen_tail``): 1 command.

    Fresh offsets of one buffer record below ``seen_tail`` come from what an
    earlier read kept in ``ahead``, with no command, where it holds them all;
    otherwise that read goes :data:`READ_AHEAD` slots further and keeps them.
    """
    shape = queue.shape
    if not again and fresh and fresh[-1] < seen_tail:
        first, last = fresh.start, fresh[-1]
        record = shape.record_of(first)
        if shape.record_of(last) == record and shape.slot_of(last) >= shape.slot_of(first):
            kept = ahead.covering(shape, fresh)
            if kept is not None:
                return kept
            first_slot = shape.slot_of(first)
            last_slot = shape.slot_of(last)
            # as far as the record and the read-ahead go, below the tail seen: past it no slot is
            # deliverable yet (in a locked queue one may hold a stale writer's uncommitted entry)
            last_slot = max(
                last_slot,
                min(
                    shape.slots_per_record - 1,
                    first_slot + READ_AHEAD - 1,
                    seen_tail - 1 - first + first_slot,
                ),
            )
            read = _read_one_record(queue, record, first_slot, last_slot)
            ahead.keep(first, record, first_slot, read.slots_of(record))
            return read
    wanted: dict[int, tuple[int, int]] = {}
    runs = [range(o, o + 1) for o in again]
    for record_runs in shape.runs(fresh.start, fresh.stop).values():
        runs += record_runs
    for run in runs:
        record, first, last = shape.record_of(run.start), shape.slot_of(run.start), shape.slot_of(run[-1])
        if record in wanted:
            first, last = min(first, wanted[record][0]), max(last, wanted[record][1])
        wanted[record] = (first, last)
    records = sorted(wanted)
    reads: list[tuple[RecordKey, list[Operation] | None]] = [
        (queue.keys.buffer(r), [ListGetRange(rec.SLOTS, wanted[r][0], wanted[r][1] - wanted[r][0] + 1)])
        for r in records
    ]
    found: list[dict[str, Any] | None]
    metadata = None
    if (fresh and fresh[-1] >= seen_tail) or not seen_tail:
        found = queue.backend.batch_read([(queue.keys.metadata, None), *reads])
        if found[0] is None:
            raise errors.QueueNotFoundError(f"queue {queue.name!r} does not exist", queue=queue.name)
        metadata = rec.parse_metadata(queue.name, found[0])
        if metadata.incarnation != queue.incarnation:
            raise queue.lock.replaced_error(created_again=True)
        found = found[1:]
    elif len(reads) == 1:
        key, operations = reads[0]
        found = [_read_or_none(queue, key, operations or [])]
    else:
        found = queue.backend.batch_read(reads) if reads else []
    slots = {
        record: buffer.get(rec.SLOTS) if buffer is not None else None
        for record, buffer in zip(records, found, strict=True)
    }
    return SlotsRead(shape, wanted, slots, metadata)


def _read_one_record(queue: Queue, record: int, first: int, last: int) -> SlotsRead:
    """The common delivery: fresh offsets within one buffer record, below a tail already seen."""
    found = _read_or_none(
        queue, queue.keys.buffer(record), [ListGetRange(rec.SLOTS, first, last - first + 1)]
    )
    slots = found.get(rec.SLOTS) if found is not None else None
    return SlotsRead(queue.shape, {record: (first, last)}, {record: slots}, None)


def _read_or_none(queue: Queue, key: RecordKey, operations: list[Operation]) -> dict[str, Any] | None:
    """One record's reads; None if it is missing, as a batch read reports it (its entries are gone)."""
    try:
        return queue.backend.operate(key, operations)
    except errors.RecordNotFoundError:
        return None


__all__ = ["READ_AHEAD", "ReadAhead", "SlotsRead", "read_slots"]
