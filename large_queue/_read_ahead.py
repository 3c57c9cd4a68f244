"""Reading ahead: slots read for later deliveries, taken then with no command.

A reader that takes entries one at a time (a lone consumer's dequeues, a
shared queue's owner) reads up to :data:`READ_AHEAD` slots of the buffer
record it reads anyway, and keeps the leading run of *plain entries*: slots
that each hold their own offset's published entry. Such a slot keeps that
entry until a later lap reuses it, and a lap reuses it only once the queue's
head has passed it (an overwriting producer moves the head past an offset,
in its reservation, before it writes that offset's slot). So a kept slot of
an offset that the head has not passed, checked by whoever takes it (under
the lock, the head the acquire read; an owner, the cursor it owns), holds
what a read now would find. The timeline of a lone consumer C and an
overwriting producer P::

    t=0  C holds the lock at head 40, reads slots 40..55 (all entries),
         keeps them, takes 40 and commits head 41.
    t=1  P overwrites: its reservation moves the head to 43 and it writes
         its entries of a later lap into slots 41 and 42.
    t=2  C's acquire reads head 43: 41 and 42 are below it, so the kept
         slots of 41 and 42 are never taken; C takes 43 from what it kept,
         with no read (P did not pass 43, so its slot is as it was at t=0).

Holes (reserved, unpublished slots), tombstones, later laps' slots and parts
of batches that span records whose last slot was not read with them end the
run: those are always judged on a fresh read. Whoever takes a kept slot
still checks it against the offset it takes it for. A kept run is never past
the tail the reader knows, so a slot a stale writer filled beyond it (in a
queue whose producers take the lock) is never kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from large_queue.appends._prefix import ENTRY

#: slots a reader reads at least from the one it needs, where its buffer record and the tail allow
READ_AHEAD = 16
#: ... at most, after it took every entry of runs that only the read's size ended: each such run
#: doubles the next read (a lone consumer's single dequeues: 16 to 64 slots a read took 1.14 to 1.04
#: commands a dequeue on the embedded store, 1.07 to 1.02 on Aerospike, 10-30% more dequeues a second)
READ_AHEAD_MOST = 128


class _Run(NamedTuple):
    """Entries kept from one read: replaced whole, so that threads sharing a reader see one run."""

    start: int  # the first one's offset
    slots: list[Any]
    cut: bool  # every slot the read found past what was taken was an entry: there may be more


class ReadAhead:
    """The run of entries one reader read ahead (see the module's timeline).

    A reader that took every entry of a run that only the read's size ended
    (it is behind the producers) reads further ahead the next time, up to
    :data:`READ_AHEAD_MOST`; one whose run ended at a slot that was no entry
    (it caught up with the producers, or met a hole) reads :data:`READ_AHEAD`
    again, so that it does not read empty slots for nothing.
    """

    def __init__(self) -> None:
        self._run = _Run(0, [], False)
        self._span = READ_AHEAD  # slots the next read takes at least, where the record and tail allow
        self._used_up = False  # every entry of a cut run was asked for: the next read may go further

    def next_read(self, start: int, needed: int, slot: int, slots_per_record: int, tail: int) -> int:
        """How many slots the read about to be sent takes from offset ``start`` (slot index ``slot``
        of its record): the ``needed`` ones, and up to the reader's span in all where the record and
        ``tail`` allow."""
        return max(needed, min(self._next_span(), slots_per_record - slot, tail - start))

    def further(self, needed: int, room: int) -> int:
        """How many slots a read across records takes: the ``needed`` ones and the reader's span
        past them, at most ``room``."""
        return min(room, needed + self._next_span())

    def _next_span(self) -> int:
        self._span = min(2 * self._span, READ_AHEAD_MOST) if self._used_up else READ_AHEAD
        self._used_up = False
        return self._span

    def covering(self, start: int, stop: int) -> list[Any] | None:
        """The kept slots of offsets ``[start, stop)``, or None where the run does not hold them all."""
        run = self._run
        first, last = start - run.start, stop - run.start
        if first < 0 or stop <= start or first > len(run.slots):
            return None
        if last >= len(run.slots) and run.cut:  # all of it asked for: the next read goes further
            self._used_up = True
        return run.slots[first:last] if last <= len(run.slots) else None

    def keep(self, start: int, slots: list[Any], verdicts: Mapping[int, str]) -> None:
        """Keep the leading run of ``slots`` (read from offset ``start`` on) that are entries.

        A part of a batch that spans records is an entry once the batch's
        last slot is published: it is kept (as a plain entry) where that slot
        is among ``slots``, or where the reader's ``verdicts``
        (:func:`large_queue.appends._prefix.settle`'s, final) say so. The
        ``slots`` of several records need not be read at one moment: a batch's
        last slot is published only after all its other parts, so a last slot
        seen published shows them published, whichever record was read first.
        """
        kept: list[Any] = []
        for offset, slot in enumerate(slots, start):
            if type(slot) is not list or not slot or slot[0] != offset:
                break
            if len(slot) == 3:
                kept.append(slot)
            elif len(slot) == 4 and (verdicts.get(slot[3]) == ENTRY or _published(slots, start, slot[3])):
                kept.append(slot[:3])
            else:
                break
        self._run = _Run(start, kept, cut=len(kept) == len(slots))

    def clear(self) -> None:
        """Forget the run."""
        self._run = _Run(0, [], False)


def _published(slots: list[Any], start: int, last: Any) -> bool:
    """Whether ``slots`` (from offset ``start``) show offset ``last`` published: a batch's last slot."""
    index = last - start if type(last) is int else -1
    if not 0 <= index < len(slots):
        return False
    slot = slots[index]
    return type(slot) is list and len(slot) in (3, 4) and slot[0] == last


__all__ = ["READ_AHEAD", "READ_AHEAD_MOST", "ReadAhead"]
