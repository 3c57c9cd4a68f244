"""What readers of a queue with lock-free appends see: the published prefix.

A reader takes the slots of offsets ``[start, stop)`` and settles them in
order. Each offset is an entry (published), closed (a tombstone, or a part of
a spanning batch whose last slot is a tombstone), overwritten (a later lap's
entry holds the slot) or pending (reserved, not yet published). The prefix
ends at the first pending offset; nothing after it is delivered, even where
published, so order holds.

A part of a spanning batch (a slot carrying the batch's last offset ``e``)
settles as ``e``'s slot does: entry once ``e`` is published, closed once it
is a tombstone, pending until then. Its slot is ahead of every other part, so
it is never reused while any part is still to be read. Once ``e`` is a
tombstone, the batch's unpublished parts are closed too: they can never show.
Once a later lap holds ``e``'s slot, the batch has left the queue and its
parts settle as overwritten: whether it was published or closed can no longer
be told, so a reader that far behind counts them as lost rather than drop
entries it may have owed.

:class:`HoleWatch` is how a waiting reader decides that a hole is abandoned:
it notes, on this process's monotonic clock, when it first saw each pending
offset, and reports the ones pending for longer than the queue's hole
timeout. Clocks of different machines are never compared.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ENTRY = "entry"
CLOSED = "closed"
OVERWRITTEN = "overwritten"
PENDING = "pending"


@dataclass(kw_only=True)
class Settled:
    """What a reader made of ``[start, stop)``: the entries up to the first pending offset."""

    start: int
    #: the first offset not settled: the prefix end within the range (``stop`` if none is pending)
    end: int
    #: (offset, stored value, enqueued_at_ms) of every entry in ``[start, end)``, in order
    entries: list[tuple[int, Any, int]] = field(default_factory=list)
    closed: int = 0
    #: the offsets whose slot a later lap holds (or whose spanning batch's last slot it holds)
    overwritten: list[int] = field(default_factory=list)
    #: for a pending part of a spanning batch: the batch's last offset, whose slot decides it
    waiting_on: int | None = None
    #: the pending offsets seen from ``end`` on, in order (what a hole closer may close)
    pending: list[int] = field(default_factory=list)
    #: the last offsets of the spanning batches seen closed and gone so far (-1: none), which
    #: settle their unpublished parts: a settling that goes on from ``end`` takes them on
    closed_through: int = -1
    gone_through: int = -1


class MalformedSlot(ValueError):
    """A slot that is none of the kinds the format writes; ``offset`` is the offset it was read for."""

    def __init__(self, offset: int, slot: Any) -> None:
        super().__init__(f"malformed slot for offset {offset}: {slot!r:.200}")
        self.offset = offset


def kind_of(offset: int, slot: Any) -> tuple[str, int | None]:
    """``(kind, last offset of its batch or None)`` of the slot read for ``offset``.

    :class:`MalformedSlot` (a ``ValueError``) if the slot is malformed.
    """
    if type(slot) is not list or not slot or type(slot[0]) is not int:
        raise MalformedSlot(offset, slot)
    held = slot[0]
    if held < offset:
        return PENDING, None
    if held > offset:
        return OVERWRITTEN, None
    size = len(slot)
    if size == 3:
        return ENTRY, None
    if size == 1:
        return CLOSED, None
    if size == 4 and type(slot[3]) is int and slot[3] >= offset:
        return ENTRY, (None if slot[3] == offset else slot[3])
    raise MalformedSlot(offset, slot)


def settle_plain(start: int, slots: list[Any]) -> Settled | None:
    """``[start, start + len(slots))`` settled at once where every slot holds a plain entry of its own offset.

    That is the common read (no hole, no later lap, no batch spanning
    records), so it goes without :func:`settle`'s call per slot; anything
    else is None, for :func:`settle`.
    """
    entries: list[tuple[int, Any, int]] = []
    append = entries.append
    offset = start
    for slot in slots:
        if type(slot) is not list or len(slot) != 3 or slot[0] != offset or type(slot[0]) is not int:
            return None
        append((offset, slot[1], slot[2]))
        offset += 1
    return Settled(start=start, end=offset, entries=entries)


def settle(
    start: int,
    stop: int,
    slot_at: Callable[[int], Any],
    fetch: Callable[[int], Any],
    verdicts: dict[int, str] | None = None,
    after: Settled | None = None,
) -> Settled:
    """Settle offsets ``[start, stop)`` in order.

    ``slot_at(o)`` gives the slot read for ``o`` in the range; ``fetch(e)``
    reads the slot of a batch's last offset ``e`` beyond the range (one
    command; only spanning batches need it). ``verdicts`` keeps what such
    slots said across calls (published and closed are final; pending is not
    kept). ``after`` is the settling of the part just before ``start``, for
    a range settled part by part: a batch it saw closed closes its parts in
    this one too. ``ValueError`` for a malformed slot.
    """
    settled = Settled(start=start, end=stop)
    if verdicts is None:
        verdicts = {}
    # The last offset of a spanning batch seen closed (or gone with a later lap), so that its
    # unpublished parts settle the same way: they can never show.
    closed_through, gone_through = (after.closed_through, after.gone_through) if after else (-1, -1)
    entries = settled.entries
    for offset in range(start, stop):
        slot = slot_at(offset)
        if type(slot) is list and len(slot) == 3 and slot[0] == offset and type(slot[0]) is int:
            entries.append((offset, slot[1], slot[2]))  # the common slot: an entry, not part of a batch
            continue
        kind, last = kind_of(offset, slot)
        if kind == ENTRY and last is not None:
            kind = verdicts.get(last) or _verdict(last, start, stop, slot_at, fetch)
            if kind != PENDING:
                verdicts[last] = kind
            if kind == PENDING:
                settled.waiting_on = last
            elif kind == CLOSED:
                closed_through = max(closed_through, last)
            elif kind == OVERWRITTEN:
                gone_through = max(gone_through, last)
        elif kind == PENDING and offset <= closed_through:
            kind = CLOSED
        elif kind == PENDING and offset <= gone_through:
            kind = OVERWRITTEN
        if kind == PENDING:
            settled.end = offset
            settled.pending = [
                o for o in range(offset, stop) if kind_of(o, slot_at(o))[0] == PENDING or o == offset
            ]
            break
        if kind == ENTRY:
            settled.entries.append((offset, slot[1], slot[2]))
        elif kind == CLOSED:
            settled.closed += 1
        else:
            settled.overwritten.append(offset)
    settled.closed_through, settled.gone_through = closed_through, gone_through
    return settled


def _verdict(
    last: int, start: int, stop: int, slot_at: Callable[[int], Any], fetch: Callable[[int], Any]
) -> str:
    """How the slot of a spanning batch's last offset settles its batch."""
    slot = slot_at(last) if start <= last < stop else fetch(last)
    kind, _ = kind_of(last, slot)
    return kind


class HoleWatch:
    """When this process first saw each pending offset, and which have been pending too long."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.clock = clock
        self._first_seen: dict[int, float] = {}
        self._lock = threading.Lock()

    def overdue(self, pending: list[int]) -> list[int]:
        """Note ``pending`` as seen now; return its leading offsets seen pending longer than the timeout."""
        now = self.clock()
        with self._lock:
            if len(self._first_seen) > 100_000:  # offsets long settled by others
                self._first_seen.clear()
            due: list[int] = []
            for position, offset in enumerate(pending):
                seen = self._first_seen.setdefault(offset, now)  # noted even past the due run
                overdue = now - seen >= self.timeout
                if overdue and len(due) == position and (not due or offset == due[-1] + 1):
                    due.append(offset)
            return due

    def note(self, offsets: range) -> None:
        """Note ``offsets`` as seen possibly pending now (those noted before keep their time).

        For offsets below a tail read before now, not read themselves: each
        was reserved by then, so it is published or pending, and a pending
        one has been open at least since now. Their clocks then run together:
        a dead producer's reservation of many offsets is closed after one
        hole timeout, not one timeout per offset as the head reaches each.
        """
        now = self.clock()
        with self._lock:
            for offset in offsets:
                self._first_seen.setdefault(offset, now)

    def forget(self, below: int) -> None:
        """Drop what was noted for offsets below ``below`` (settled)."""
        with self._lock:
            for offset in [o for o in self._first_seen if o < below]:
                del self._first_seen[offset]


__all__ = [
    "CLOSED",
    "ENTRY",
    "OVERWRITTEN",
    "PENDING",
    "HoleWatch",
    "MalformedSlot",
    "Settled",
    "kind_of",
    "settle",
    "settle_plain",
]
