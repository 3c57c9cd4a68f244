"""Seek by time: the first offset enqueued at or after a moment, by binary search over buffer records.

Each slot holds its entry's ``enqueued_at_ms``: the store's clock when its
offsets were taken (read by the lock's acquire or by the reservation), so
times grow with offsets whichever machines the producers run on. (Should
the store's clock step back, the answer is some offset at which the times
cross the moment.) A probe reads the rest of
one buffer record from an offset (one command) and either finds where the
times cross the moment, or halves the range: ``O(log records)`` round trips,
plus one to read the head and the end of the published prefix.

A slot with no time (closed, or not yet published) is passed over; one whose
entry was consumed and reused since (below the moving head) counts as older.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from large_queue import errors

if TYPE_CHECKING:
    from large_queue.queue import Queue


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def as_ms(moment: object) -> int:
    """``moment`` (a timezone-aware ``datetime``, or ms since the epoch as an int) in ms since the epoch."""
    if isinstance(moment, datetime.datetime):
        if moment.tzinfo is None:
            raise errors.InvalidArgumentError(
                f"{moment!r} has no time zone: give an aware datetime (tzinfo=datetime.timezone.utc, say)"
            )
        # whole microseconds, without a float: a moment inside a millisecond is after that millisecond's
        # entries (an entry's time is whole milliseconds), so it rounds up
        micros = (moment - _EPOCH) // datetime.timedelta(microseconds=1)
        return -(-micros // 1000)
    if type(moment) is not int or moment < 0:
        raise errors.InvalidArgumentError(
            f"a moment must be an aware datetime or milliseconds since the epoch (a non-negative int),"
            f" got {moment!r}"
        )
    return moment


def _time_of(offset: int, slot: Any) -> int | None:
    """The enqueue time a slot holds for ``offset``; -1 if it holds a later lap's; None if none."""
    if type(slot) is not list or not slot or type(slot[0]) is not int:
        return None
    if slot[0] > offset:
        return -1  # consumed and reused since: older than anything still queued
    if slot[0] == offset and len(slot) >= 3 and type(slot[2]) is int:
        return slot[2]
    return None


def offset_at(queue: Queue, moment_ms: int) -> int:
    """See :meth:`large_queue.Queue.offset_at`."""
    head, end = queue.published_tail()
    return search(queue, moment_ms, head, end)


def search(
    queue: Queue, moment_ms: int, low: int, high: int, probed: Callable[[], None] | None = None
) -> int:
    """The first timed offset of ``[low, high)`` enqueued at or after the moment, else ``high``.

    Invariant: every timed offset below ``low`` is older than the moment,
    and ``high`` is the end or an offset at or after it. ``probed`` is
    called before each probe (a lock holder renews its lock there: a long
    run of slots with no time is probed a record at a time).
    """
    per_record = queue.shape.slots_per_record
    while low < high:
        middle = max(low, (low + (high - low) // 2) // per_record * per_record)
        stop = min(high, (middle // per_record + 1) * per_record)
        if probed is not None:
            probed()
        slots = queue.prefix.slots(middle, stop)  # one command: the rest of one record
        older_seen = False
        for offset in range(middle, stop):
            found = _time_of(offset, slots.get(offset))
            if found is None:
                continue
            if found >= moment_ms:
                if older_seen:
                    return offset  # the times cross the moment inside the probe
                high = offset  # the probe begins at or after the moment: look lower
                break
            older_seen = True
        else:
            if older_seen or middle == low:
                low = stop  # older throughout (or nothing in it to find): look higher
            else:  # nothing timed in the probe: look on both sides of it
                below = search(queue, moment_ms, low, middle, probed)
                return below if below < middle else search(queue, moment_ms, stop, high, probed)
    return low


__all__ = ["as_ms", "offset_at", "search"]
