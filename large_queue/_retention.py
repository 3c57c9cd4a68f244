"""Retention: entries that leave from the head without being dequeued, by age or all at once.

:func:`purge` drops every entry at once (SQS's PurgeQueue, Redis's
``XTRIM MAXLEN 0``): the head moves to the tail in one commit under the
lock. The rest of this module is retention by age: entries older than the
queue's ``max_age`` leave from the head.

A queue created with ``max_age`` keeps an entry at most that long after it
was enqueued, judged by one clock, the store's, at both ends: an entry's
``enqueued_at_ms`` is the store's clock when its offsets were taken (read by
the lock's acquire, or by the reservation, in the same command), and "now"
is the store's clock when an operation took the lock. Times of entries grow
with their offsets, so the expired entries are a prefix from the head.

Nothing runs in the background. The next operation that passes expired
entries drops them:

- a dequeue (under the lock) drops the expired entries it reads instead of
  returning them, and its commit moves the head past them as past those it
  returns; a dequeue that finds only expired entries drops the whole expired
  prefix (:func:`drop_expired`) before it reads again;
- an enqueue that finds the queue full drops the expired prefix, then tries
  again once (``QueueFullError`` only if the room is still not there);
- ``queue.expire()`` (and ``large-queue expire``) drops it now;
- a consumer (a group's, or the cluster shim's) counts the expired entries it
  reads as lost, as it counts overwritten ones, and goes on after them;
  ``on_data_loss="fail"`` raises ``DataLossError`` with the lost range.

Dropped entries are counted (``entries_expired`` in ``queue.stats()``) and
logged, as overwritten ones are. Offset reads (``queue.get``, Spark) still
return an expired entry until an operation has dropped it.

The failure story, as a timeline (``max_age`` 60 s, lock TTL 2 s)::

    t=0    P enqueues offsets 0..9; the acquire reads the store's clock,
           1,000 ms: every slot is stamped 1,000.
    t=30   P enqueues 10..19, stamped 31,000.
    t=65   D dequeues: its acquire reads the store's clock, 66,000 ms.
           0..9 are older than 60 s (1,000 < 66,000 - 60,000): they are
           dropped and counted; 10 is returned; the commit writes head 11.
    t=65.1 Had D paused before its commit until its lock was broken, the
           commit would have been refused (fencing): nothing is dropped and
           nothing is returned, as for any dequeue whose lock is lost.
    t=70   A full queue: P's enqueue is refused for room. P takes the lock
           (store clock 71,000), finds by bisection the first entry at or
           after 11,000 and commits the head there: the room is made, and
           its enqueue is tried again.

A consumer judges age without the lock: it reads the store's clock once and
extends it with its own monotonic clock (:class:`StoreClock`), reading it
again every ``refresh`` seconds. The estimate is never ahead of the store's
clock by more than this machine's drift over that time: it may drop an entry
a little late, never early. No two machines' clocks are compared.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from large_queue import _seek, errors
from large_queue._txn import internal
from large_queue.appends._prefix import ENTRY, PENDING, kind_of

if TYPE_CHECKING:
    from large_queue.queue import Entry, Queue

log = logging.getLogger("large_queue")

#: what names the lock holder of an operation that only drops expired entries (with a unique id)
EXPIRE_TXN = "expire"
#: ... and of a purge
PURGE_TXN = "purge"
#: longest ``max_age`` (seconds): ten years
MAX_AGE_LIMIT = 10 * 365 * 86400


def check_max_age(max_age: object) -> int | None:
    """``max_age`` (seconds, or None: keep entries however old) in ms, or ``InvalidArgumentError``."""
    if max_age is None:
        return None
    if type(max_age) not in (int, float) or not 0.001 <= max_age <= MAX_AGE_LIMIT:  # type: ignore[operator]
        raise errors.InvalidArgumentError(
            f"max_age must be None or 0.001 to {MAX_AGE_LIMIT} seconds (ten years), got {max_age!r}"
        )
    return max(1, round(max_age * 1000))  # type: ignore[operator]


def split_expired(entries: list[Entry], now_ms: int, max_age_ms: int | None) -> tuple[int, list[Entry]]:
    """``(how many leading entries are older than max_age at now_ms, the entries after them)``."""
    if max_age_ms is None or not entries:
        return 0, entries
    cutoff = now_ms - max_age_ms
    count = 0
    for entry in entries:
        if entry.enqueued_at_ms >= cutoff:
            break
        count += 1
    return count, entries[count:] if count else entries


def report(queue: Queue, count: int) -> None:
    """Count and log ``count`` entries dropped for their age (if any)."""
    if count:
        queue.counters.add(entries_expired=count)
        log.warning("queue %r: %d entries older than max_age were dropped", queue.name, count)


def drop_expired(queue: Queue) -> range:
    """Move the head past the entries older than ``max_age``; return the offsets dropped.

    Those below where every consumer (groups, or the cluster shim's) had acked
    were consumed, not dropped: passed, and not returned (see :func:`expire_passing`).
    """
    return expire_passing(queue)[1]


def made_room(queue: Queue) -> bool:
    """Drop the expired entries (:func:`drop_expired`); True if the head moved, consumed ones or not."""
    return bool(expire_passing(queue)[0])


def expire_passing(queue: Queue) -> tuple[range, range]:
    """Move the head past the entries older than ``max_age``: the offsets passed, and those dropped.

    The lock's acquire, about ``log2(records)`` reads (a bisection,
    :mod:`large_queue._seek`), where producers append without the lock one
    more read for each record of unpublished or closed offsets just below
    where it stops, a read of where the consumers have acked to, and the
    commit. A long run of slots with no time (a big batch whose producer
    died, closed by readers) is read a record at a time; the lock is renewed
    on the way whenever half its TTL has passed. Stops at the first entry
    young enough. Empty ranges if the queue keeps entries however old, or
    none has expired.
    """
    if queue.max_age_ms is None:
        return range(0), range(0)
    with queue.lock.holding(internal(EXPIRE_TXN)) as grant:
        held = [grant]

        def renewing() -> None:  # a search over a long run of slots with no time outlasts the TTL
            if time.monotonic() - held[0].acquired_at > queue.lock_ttl / 2:
                held[0] = queue.lock.renew(held[0])

        new_head = _seek.search(queue, grant.now_ms - queue.max_age_ms, grant.head, grant.tail, renewing)
        if queue.reserved:
            new_head = _short_of_pending(queue, grant.head, new_head, renewing)
        grant = held[0]
        if new_head <= grant.head:
            queue.lock.release(grant)
            return range(grant.head, grant.head), range(grant.head, grant.head)
        consumed = min(new_head, _consumed_to(queue, grant.groups, grant.head))
        # A head that passes offsets with no time (closed, or reserved and not published below an
        # expired entry) may skip a reservation whose receipt is pending: said, as every such move does
        queue.lock.commit(
            grant,
            head=new_head,
            published=new_head if queue.reserved else None,
            skipped_to=new_head if queue.marked else None,
        )
    report(queue, new_head - consumed)
    return range(grant.head, new_head), range(consumed, new_head)


def _consumed_to(queue: Queue, groups: tuple[str, ...], head: int) -> int:
    """Where the consumers (groups, or the cluster shim's) have acked up to: not dropped below it."""
    from large_queue.cluster._groups import consumed_floor

    return consumed_floor(queue, groups, head)


def purge(queue: Queue) -> range:
    """Move the head to the tail: every entry leaves at once; return the offsets dropped.

    The lock's acquire, a read of where the consumers have acked to (what
    they acked is not counted as dropped), and the commit, whatever the
    queue holds, then one write for the cluster shim and one for each
    consumer group (their owners are fenced). Where producers append without the lock, the tail is where they
    have reserved to when the purge takes the lock, so an enqueue in flight
    then (its offsets reserved, not yet published) is dropped with the rest: its
    producer is told it succeeded, as it would be had it published a moment
    before the purge. The timeline::

        t=0  P reserves offset 10 (the tail becomes 11) and pauses.
        t=1  The purge takes the lock, reads head 3 and tail 11, and
             commits head 11: offsets 3..10 are dropped.
        t=2  P publishes offset 10: its slot held an older lap's offset, so
             the guard accepts it, and P's enqueue returns 10. No reader
             ever sees it: it is below the head, purged with the rest.

    Consumer groups and the cluster shim see the offsets dropped below their
    cursors as lost (``on_data_loss``), as for expired entries: their owners
    are fenced after the commit (:func:`_unseat_consumers`), so an owner may
    deliver a purged entry only while the purge runs. Offset reads of them
    return None from then on. An enqueue that reserves after the purge took the lock is kept.
    """
    with queue.lock.holding(internal(PURGE_TXN)) as grant:
        if grant.tail <= grant.head:
            queue.lock.release(grant)
            return range(grant.head, grant.head)
        consumed = min(grant.tail, _consumed_to(queue, grant.groups, grant.head))
        queue.lock.commit(
            grant,
            head=grant.tail,
            published=grant.tail if queue.reserved else None,
            skipped_to=grant.tail if queue.marked else None,
        )
    _unseat_consumers(queue, grant.groups)
    queue.counters.add(entries_purged=grant.tail - consumed)
    log.info("queue %r: %d entries purged", queue.name, grant.tail - consumed)
    return range(consumed, grant.tail)


def _unseat_consumers(queue: Queue, groups: tuple[str, ...]) -> None:
    """After a purge's commit, take the queue (and each group) from its owner, as if it had died.

    An owner reads the queue's head only when it needs to look past the tail
    it has seen (its own acks are what move the head): left in place, it
    would go on delivering the purged entries from their slots. Fenced, its
    next write is refused, and the next owner reads the head first: what it
    had not taken is lost, as said. The timeline::

        t=0  A owns the queue, has read offsets 10..19 ahead, delivered 10.
        t=1  The purge commits head 20.
        t=2  A delivers 11 (its write is still accepted: a delivery that
             races the purge, as a message received while SQS purges).
        t=3  The purge writes A's owner record: no owner, a new epoch.
        t=4  A's next delivery is refused; it rejoins. The next owner reads
             head 20 and counts 11..19 as lost (12..19 never delivered).
    """
    from large_queue.cluster._ownership import unseat

    for group in (None, *groups):
        unseat(queue, group)


def _short_of_pending(queue: Queue, head: int, end: int, probed: Callable[[], None]) -> int:
    """``end``, or the first of the unpublished offsets just below it (a read a buffer record).

    The bisection passes over offsets with no time: closed, overwritten, and
    reserved but not yet published. An unpublished offset with an expired
    entry above it was reserved before that entry, so it is older still and
    goes too; one with none above it (up to ``end``) may be younger, and stays.
    So the offsets below ``end`` are read back, a record at a time, down to
    the first entry: a run of reservations longer than a record (a batch in
    flight) stays whole. A published part of a batch spanning records is no
    such entry while the batch's last offset is unpublished (readers show
    none of the batch until then): it stays with the rest of its batch, or
    the batch would show without it once published. ``probed`` is called
    before each read (the lock holder renews its lock there).
    """
    kinds: dict[int, str] = {}  # what the offsets read back hold
    top = end
    while top > head:
        low = max(head, top - queue.shape.slots_per_record)
        probed()
        slots = queue.prefix.slots(low, top)
        for offset in range(top - 1, low - 1, -1):
            try:
                kind, last = kind_of(offset, slots.get(offset))
                if kind == ENTRY and last is not None:  # a part: its batch's last offset decides
                    kind = kinds.get(last) or kind_of(last, queue.prefix.fetch(last))[0]
            except ValueError:  # not a slot this queue writes: left for a reader to report
                return offset
            kinds[offset] = kind
            if kind == PENDING:
                end = offset
            elif kind == ENTRY:
                return end
        top = low
    return end


class StoreClock:
    """The store's clock as this process tells it: one read, then this machine's monotonic clock.

    ``read`` returns the store's clock (ms, one command). It is read again
    when ``refresh`` seconds have passed since; the estimate in between is the
    last reading plus the time passed here, so it is never ahead of the
    store's by more than this machine's drift over ``refresh``.
    """

    def __init__(self, read: Callable[[], int], refresh: float = 1.0) -> None:
        self.read = read
        self.refresh = refresh
        self._lock = threading.Lock()
        self._anchor: tuple[int, float] | None = None  # (store ms, monotonic seconds when received)

    def now_ms(self) -> int:
        """The store's clock now (ms since the epoch), as estimated here."""
        with self._lock:
            here = time.monotonic()
            if self._anchor is None or here - self._anchor[1] >= self.refresh:
                store_ms = self.read()
                here = time.monotonic()
                self._anchor = (store_ms, here)
            store_ms, at = self._anchor
            return store_ms + int((here - at) * 1000)


def expired_before(queue: Queue, clock: StoreClock) -> int | None:
    """The enqueue time (store ms) below which an entry has expired now, or None (no ``max_age``)."""
    if queue.max_age_ms is None:
        return None
    return clock.now_ms() - queue.max_age_ms


__all__ = [
    "EXPIRE_TXN",
    "StoreClock",
    "check_max_age",
    "drop_expired",
    "expire_passing",
    "expired_before",
    "made_room",
    "report",
    "split_expired",
]
