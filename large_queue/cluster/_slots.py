"""What one delivery reads: the slots of the offsets it may deliver (one round trip or none), decoded.

An owner delivers entries due again (any offsets) and fresh ones (a run from
its cursor). From each buffer record it reads one run of slots, from the
first wanted to the last, all in one batch read; with the metadata record
only when it must look past the tail it has already seen (offsets below a
tail once seen are committed for good: the tail only grows).

The common delivery (fresh offsets in one buffer record, below a tail seen)
reads ahead (:mod:`large_queue._read_ahead`): the next deliveries take the
entries it found there with no command. The owner's cursor is the check
that the head has not passed them: only this owner moves the head (an
overwriting producer aside, whose drop of an entry read ahead then shows as
a delivery, as if the read had come just before the drop, which it did).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from large_queue import _records as rec
from large_queue import errors
from large_queue._entries import MSGPACK, NATIVE, decode_entry
from large_queue._msgpack import unpack
from large_queue._read_ahead import ReadAhead
from large_queue.backends import ListGetRange, Operation, RecordKey
from large_queue.queue import Queue


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

    def run(self, start: int, stop: int) -> list[Any] | None:
        """The slots of offsets ``[start, stop)`` as read, where one read of one record holds them all."""
        shape = self.shape
        record = shape.record_of(start)
        slot_list = self._slots.get(record)
        first = shape.slot_of(start)
        if type(slot_list) is not list or shape.slot_of(stop - 1) - first != stop - 1 - start:
            return None  # not read, or the offsets wrap around into another record
        index = first - self._wanted[record][0]
        part = slot_list[index : index + stop - start]
        return part if index >= 0 and len(part) == stop - start else None

    def slot_at(self, offset: int) -> Any:
        """The slot of ``offset`` as read (None if its record was missing or it was not read)."""
        record = self.shape.record_of(offset)
        slot_list = self._slots.get(record)
        index = self.shape.slot_of(offset) - self._wanted[record][0]
        return slot_list[index] if isinstance(slot_list, list) and index < len(slot_list) else None


def read_slots(
    queue: Queue, again: Sequence[int], fresh: range, seen_tail: int, ahead: ReadAhead
) -> SlotsRead:
    """Read the slots of offsets ``again`` and ``fresh`` (and the metadata past ``seen_tail``): 1 command.

    Fresh offsets of one buffer record below ``seen_tail`` come from what an
    earlier read kept in ``ahead``, with no command, where it holds them all;
    otherwise that read goes further (:meth:`large_queue._read_ahead.ReadAhead.next_read`) and keeps them.
    """
    shape = queue.shape
    if not again and fresh and fresh[-1] < seen_tail:
        first, last = fresh.start, fresh[-1]
        record = shape.record_of(first)
        if shape.record_of(last) == record and shape.slot_of(last) >= shape.slot_of(first):
            first_slot, last_slot = shape.slot_of(first), shape.slot_of(last)
            kept = ahead.covering(first, last + 1)
            if kept is not None:
                return SlotsRead(shape, {record: (first_slot, last_slot)}, {record: kept}, None)
            count = ahead.next_read(first, last - first + 1, first_slot, shape.slots_per_record, seen_tail)
            read = _read_one_record(queue, record, first_slot, first_slot + count - 1)
            got = read.slots_of(record)  # a list, or None where the record is missing
            past = got[last - first + 1 :] if type(got) is list else []  # past the offsets wanted now
            ahead.keep(last + 1, past, queue.prefix.verdicts)
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
    if metadata is None and None in found:
        _queue_still_there(queue)
    return SlotsRead(shape, wanted, slots, metadata)


def _read_one_record(queue: Queue, record: int, first: int, last: int) -> SlotsRead:
    """The common delivery: fresh offsets within one buffer record, below a tail already seen."""
    found = _read_or_none(
        queue, queue.keys.buffer(record), [ListGetRange(rec.SLOTS, first, last - first + 1)]
    )
    if found is None:
        _queue_still_there(queue)
    slots = found.get(rec.SLOTS) if found is not None else None
    return SlotsRead(queue.shape, {record: (first, last)}, {record: slots}, None)


def _queue_still_there(queue: Queue) -> None:
    """A buffer record read without the metadata was missing: ``QueueNotFoundError`` if the queue is gone.

    The queue deleted (or created again) under its consumer is said as such;
    a queue still there with a record missing is damage, which the slots'
    settling names (``CorruptQueueError``).
    """
    queue.current_metadata()


def _read_or_none(queue: Queue, key: RecordKey, operations: list[Operation]) -> dict[str, Any] | None:
    """One record's reads; None if it is missing, as a batch read reports it (its entries are gone)."""
    try:
        return queue.backend.operate(key, operations)
    except errors.RecordNotFoundError:
        return None


def decoded(encoding: str, entries: list[tuple[int, Any, int]]) -> dict[int, tuple[Any, int]]:
    """Settled ``(offset, stored value, enqueued_at_ms)`` rows as ``{offset: (entry, enqueued_at_ms)}``.

    A stored value that does not decode is left out: the delivery then takes
    that offset from its slot, which names the damage (``CorruptQueueError``).
    """
    if encoding == NATIVE:
        return {offset: (value, at) for offset, value, at in entries}
    if encoding == MSGPACK:  # the default: one loop, no call per entry but msgspec's
        try:
            return {offset: (unpack(value), at) for offset, value, at in entries}
        except (ValueError, TypeError):  # not bytes, or not msgpack: the loop below leaves it out
            pass
    known: dict[int, tuple[Any, int]] = {}
    for offset, value, at in entries:
        try:
            known[offset] = (decode_entry(encoding, value), at)
        except ValueError:
            continue
    return known


__all__ = ["SlotsRead", "decoded", "read_slots"]
