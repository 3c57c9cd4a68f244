"""Offset reads: entries read by offset, without the lock and without taking them.

``queue.get`` reads one entry: the metadata record, then its slot. A peek
(``queue.peek``) is an offset read of many entries at once: it reads the
metadata record, then the slots from the first offset asked for on, a batch
read of up to 64 buffer records at a time, and hands out the entries found
there in offset order. It writes nothing: no lock, no head move, no hole
closed. What it sees is what ``get`` would see of each offset:

- only the published prefix (``appends="reserve"``): it stops at the first
  reserved offset not yet published, since what lies past it is not visible
  yet; closed reservations (tombstones) are no entries and are passed over;
- only entries still in their slots: an offset whose slot a later lap took
  (an overwriting producer) is passed over, and so is anything below the
  head it read, where consumers have taken the entries already.

A peek is not a snapshot: a consumer may take, or an overwriting producer
drop, entries while it reads. Each entry it gives was in the queue when it
read the metadata record (as ``get`` does, it may give an entry a consumer
took since), and a later peek from the offset after the last entry goes on
where this one stopped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from large_queue import _records as rec
from large_queue import errors
from large_queue._entries import Entry
from large_queue.appends._reader import RECORDS_PER_READ
from large_queue.backends import ListGetRange

if TYPE_CHECKING:
    from large_queue.queue import Queue


def get(queue: Queue, offset: int) -> Entry | None:
    """The entry at ``offset`` if it is in the queue now, else None (see :meth:`Queue.get`)."""
    metadata = queue.current_metadata()
    if not metadata.head <= offset < metadata.tail:
        return None
    if queue.reserved:
        known = max(metadata.published, queue.prefix.settled_end)
        if offset < known:  # settled: only its own slot (and its batch's last) matter
            settled = queue.prefix.settle(offset, offset + 1, queue.prefix.fetch)
        else:  # settled on to it a part at a time, the hint moved: the next get is cheap
            walked = queue.prefix.walk(max(metadata.head, known), offset + 1, metadata.published)
            assert walked is not None  # (it starts at or below offset)
            settled = walked
        found = [queue._entry(*item) for item in settled.entries if item[0] == offset]
        return found[0] if found and settled.end > offset else None
    record = queue.shape.record_of(offset)
    slot_index = queue.shape.slot_of(offset)
    queue.counters.bump("commands")
    result = queue.backend.operate(queue.keys.buffer(record), [ListGetRange(rec.SLOTS, slot_index, 1)])
    slots = result.get(rec.SLOTS)
    if not isinstance(slots, list) or len(slots) != 1:
        raise errors.CorruptQueueError(
            f"buffer record {record} of queue {queue.name!r} has no slot {slot_index}", queue=queue.name
        )
    found_slot = rec.slot_entry(queue.name, record, slots[0], offset, queue.encoding)
    if found_slot is None:
        return None
    return Entry(offset=offset, value=found_slot[0], enqueued_at_ms=found_slot[1])


def peek(queue: Queue, start: int | None, max_entries: int) -> list[Entry]:
    """Up to ``max_entries`` entries at offsets from ``start`` (None: the head) on, in offset order.

    Fewer only where the published prefix (or the tail) ends first.
    """
    metadata = queue.current_metadata()
    low = metadata.head if start is None else max(start, metadata.head)
    if not queue.reserved:
        return _written(queue, low, metadata.tail, max_entries)
    # Offsets from the settled mark on are in the prefix only if none before them is pending,
    # so the read begins at the mark where the first offset asked for lies past it.
    position = max(metadata.head, min(low, max(metadata.published, queue.prefix.settled_end)))
    entries: list[Entry] = []
    while position < metadata.tail and len(entries) < max_entries:
        if position < low:  # settling the offsets before it, a batch read's worth at a time
            stop = min(low, position + RECORDS_PER_READ * queue.shape.slots_per_record)
        else:
            stop = position + max_entries - len(entries)
        stop = min(stop, metadata.tail)
        settled = queue.prefix.read(position, stop)
        queue.prefix.settled_end = max(queue.prefix.settled_end, settled.end)  # in the prefix: read from it
        entries += queue._entries([found for found in settled.entries if found[0] >= low])
        if settled.end < stop:  # a reservation not yet published: the prefix ends there
            break
        position = stop
    return entries[:max_entries]


def _written(queue: Queue, low: int, tail: int, max_entries: int) -> list[Entry]:
    """A queue whose producers append under the lock: every offset below the tail is written."""
    entries: list[Entry] = []
    position = low
    while position < tail and len(entries) < max_entries:
        stop = min(tail, position + max_entries - len(entries))
        slots = queue.prefix.slots(position, stop)
        for offset in range(position, stop):
            record = queue.shape.record_of(offset)
            found = rec.slot_entry(queue.name, record, slots[offset], offset, queue.encoding)
            if found is not None:  # else a later lap's slot: that entry is gone
                entries.append(queue._entry_of(offset, found))
        position = stop
    return entries
