"""A buffer record's slots as appends write them: runs of slots, their guard, their operations.

No I/O here: what :class:`large_queue.appends.Appender` sends, built and taken
apart. A slot holds ``[offset, entry, store ms]`` (``+ [last offset]`` in a
batch spanning records), ``[offset]`` once closed (a tombstone), or ``-1``
never written.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

from large_queue import _records as rec
from large_queue._msgpack import pack
from large_queue.backends import ListSet, ListSetRange, Operation, Write
from large_queue.backends.conditions import And, Bound, Condition, ListRangeMax, Param, StrBin, all_of, eq, lt

#: the record is the queue the handle opened
SAME_QUEUE = eq(StrBin(rec.INCARNATION), Param("incarnation"))


@functools.lru_cache(maxsize=16)
def _runs_below(count: int) -> And:
    """Template: the queue is the one opened, and for each run k of slots (from ``i<k>``, ``n<k>``
    of them) every slot holds an offset below ``o<k>``, the run's first offset.

    One comparison a run, whatever its length: the greatest slot of the run
    (slots compare by their leading offset) must hold an offset below the
    run's first. In every state a slot can be in, that is the same as each
    slot holding an offset below its own: an older lap's entry or tombstone
    lies a whole capacity below, an empty slot holds -1, and a tombstone or
    entry of this lap (or a later one) holds at least the run's first offset.
    """
    return all_of(
        SAME_QUEUE,
        *(lt(ListRangeMax(rec.SLOTS, Param(f"i{k}"), Param(f"n{k}")), Param(f"o{k}")) for k in range(count)),
    )


class SlotRun(NamedTuple):
    """``length`` consecutive slots of one buffer record from ``slot``, for offsets from ``offset``."""

    slot: int
    length: int
    offset: int


class SlotPut(NamedTuple):
    """A write of one buffer record's slots: its operations, and the runs of slots its guard covers."""

    record: int
    writes: list[Operation]
    slots: list[SlotRun]


#: the most bytes of entries sent in one command on several records: Aerospike's client refuses a
#: batch command of more than about 128 MiB before sending it (a batch of 2,000 entries of 75 KB)
MOST_BYTES_TOGETHER = 64 * 1024 * 1024


def by_size(puts: list[SlotPut]) -> list[list[SlotPut]]:
    """``puts`` in order, cut into runs whose entries come to at most :data:`MOST_BYTES_TOGETHER`.

    A stored entry (msgpack or JSON) is its bytes; a native one is sized by
    its msgpack encoding. A record's writes are never cut: a record holds at
    most 8 MiB.
    """
    runs: list[list[SlotPut]] = [[]]
    size = 0
    for put in puts:
        bytes_of_put = sum(_bytes_of(write) for write in put.writes)
        if runs[-1] and size + bytes_of_put > MOST_BYTES_TOGETHER:
            runs.append([])
            size = 0
        runs[-1].append(put)
        size += bytes_of_put
    return runs


def _slots_of(write: Operation) -> list[Any]:
    """The slots one slot write sets."""
    if isinstance(write, ListSetRange):
        return write.values
    if isinstance(write, ListSet):
        return [write.value]
    return (
        write.value if isinstance(write, Write) and isinstance(write.value, list) else []
    )  # a whole record's


def _bytes_of(write: Operation) -> int:
    """About how many bytes the entries of one slot write hold."""
    total = 0
    for slot in _slots_of(write):
        value = slot[1] if isinstance(slot, list) and len(slot) > 1 else slot
        total += len(value) if type(value) is bytes else len(pack(value))
    return total


def pairs(runs: Sequence[SlotRun]) -> list[tuple[int, int]]:
    """The ``(slot index, offset)`` of every slot of ``runs``, in order."""
    return [(run.slot + k, run.offset + k) for run in runs for k in range(run.length)]


def slots_below(incarnation: str, runs: Sequence[SlotRun]) -> Condition:
    """Guard: each slot of ``runs`` holds an offset below its own (another lap's, or none).

    Each run is one comparison.
    """
    values: dict[str, int | str] = {"incarnation": incarnation}
    for k, (index, count, offset) in enumerate(runs):
        values[f"i{k}"] = index
        values[f"n{k}"] = count
        values[f"o{k}"] = offset
    return Bound(_runs_below(len(runs)), values)


def slot_writes(first_slot: int, slots: list[Any], slots_per_record: int) -> Operation:
    """The operation that sets a run of slots: the whole bin when the run is the whole record.

    A single slot is one list operation (a range is two on Aerospike: remove
    and insert); a whole record spares Aerospike a list edit.
    """
    if first_slot == 0 and len(slots) == slots_per_record:
        return Write(rec.SLOTS, slots)
    if len(slots) == 1:
        return ListSet(rec.SLOTS, first_slot, slots[0])
    return ListSetRange(rec.SLOTS, first_slot, slots)


def entries_of(put: SlotPut) -> dict[int, Any]:
    """The entries ``put`` writes, by offset."""
    return {slot[0]: slot[1] for write in put.writes for slot in _slots_of(write)}


def tombstone(offset: int) -> list[int]:
    """The slot of a closed reservation: nothing of ``offset`` may be published there."""
    return [offset]
