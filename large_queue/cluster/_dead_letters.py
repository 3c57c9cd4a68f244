"""Moving a message that keeps failing to a dead-letter queue, exactly once.

After ``max_deliveries`` deliveries without an ack, the owner moves the entry
to the dead-letter queue the user named (an ordinary queue of this library
that appends without the lock) and acks it in the source. The move is three
commands, and the owner record remembers the dead-letter offset it reserved
before anything is published there, so that a crash anywhere neither loses
the entry nor puts it twice. The failure story, as a timeline::

    t=0  Owner A finds offset 57 delivered 5 times (max_deliveries 5).
         It reserves offset 12 in the dead-letter queue (one command).
    t=0  A writes dead = {57: 12} into the group's owner record (guarded
         by its epoch): from now on 12 is where 57's dead letter goes.
    t=0  A dies before publishing 12. Nothing is visible in the
         dead-letter queue; 57 is still in flight in the source.
    t=6  A reader of the dead-letter queue finds 12 unpublished past the
         hole timeout and closes it (a tombstone: 12 can never be published).
    t=11 B owns the group. It finds dead = {57: 12}, tries to publish 12,
         is refused, reads the tombstone: the dead letter was never visible.
         It reserves 13, writes dead = {57: 13}, publishes 13 and acks 57
         (dead = {}, dead_lettered + 1) in one owner write.

Had A died after publishing 12, B's publish would have been refused by the
slot holding 12's entry already, and B would only have acked 57. A late
publish of a closed reservation fails, and never shows. The one case this
cannot tell apart: the dead-letter queue has since wrapped past 12 (a whole
lap of it consumed while the group had no owner); the entry is then counted
as moved.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from large_queue import _retention, errors
from large_queue._entries import check_entry
from large_queue.queue import Queue

if TYPE_CHECKING:
    from large_queue.cluster._consumer import Consumer

log = logging.getLogger("large_queue.cluster")

#: pauses (seconds) before a failed move to the dead-letter queue is tried again: doubling, up to the most
_MOVE_PAUSE_FIRST = 0.5
_MOVE_PAUSE_MOST = 60.0


class DeadLetters:
    """The dead-letter queue of one consumer, and how an entry is put there."""

    def __init__(self, source: Queue, group: str | None, target: Queue, max_deliveries: int) -> None:
        if not target.reserved:
            raise errors.InvalidArgumentError(
                f"dead-letter queue {target.name!r} must append without the lock (appends='reserve'):"
                " a move is exactly once only where a reservation can be published later"
            )
        if target.name == source.name and target.keys.metadata == source.keys.metadata:
            raise errors.InvalidArgumentError(f"queue {source.name!r} cannot be its own dead-letter queue")
        self.source = source
        self.group = group
        self.target = target
        self.max_deliveries = max_deliveries
        #: the store's clock when this handle reserved each dead-letter offset not yet published
        self._reserved_at: dict[int, int] = {}

    def letter(self, offset: int, value: Any, enqueued_at_ms: int, deliveries: int, error: str | None) -> Any:
        """The dead-letter entry of ``offset``: the entry and where it came from."""
        letter = {
            "queue": self.source.name,
            "group": self.group,
            "offset": offset,
            "delivery_count": deliveries,
            "last_error": error,
            "enqueued_at_ms": enqueued_at_ms,
            "value": value,
        }
        return check_entry(letter, self.target.max_entry_bytes, self.target.encoding)

    def reserve(self) -> int:
        """Take one offset in the dead-letter queue (``QueueFullError`` if it is full).

        A full one with ``max_age`` first drops its expired letters and tries again once, as an
        enqueue does.
        """
        try:
            at, now_ms = self.target.appender.reserve_stamped(1, overwrite=False)
        except errors.QueueFullError:
            if not _retention.made_room(self.target):  # no letter old enough to leave: full it is
                raise
            at, now_ms = self.target.appender.reserve_stamped(1, overwrite=False)
        self._reserved_at[at] = now_ms
        return at

    def publish(self, at: int, letter: Any) -> bool:
        """Publish ``letter`` at reserved offset ``at``; False if that reservation was closed.

        True also when an earlier attempt (of this or a dead owner) already
        published it: the slot then holds it, and the store refuses a second.
        """
        now_ms = self._reserved_at.pop(at, None)
        if now_ms is None:  # reserved by an owner before this one: stamped with the store's clock now
            now_ms = self.target.appender.store_now()
        try:
            self.target.appender.publish(at, [letter], now_ms)
        except errors.ReservationClosedError:
            return self.target.appender.holds(at)
        return True


def move_dying(consumer: Consumer) -> None:
    """Move the entries a consumer found past ``max_deliveries`` to its dead-letter queue (see the module)."""
    assert consumer.dead_letters is not None
    dying, consumer._dying = consumer._dying, []
    for offset, value, enqueued_at_ms, deliveries in dying:
        try:
            letter = consumer.dead_letters.letter(
                offset, value, enqueued_at_ms, deliveries, consumer.deliveries.last_error.get(offset)
            )
            while True:
                at = consumer._dead.get(offset)
                if at is None:
                    at = consumer.dead_letters.reserve()
                    consumer._commit(
                        consumer._cursor, consumer._inflight, dead={**consumer._dead, offset: at}
                    )
                if consumer.dead_letters.publish(at, letter):
                    break
                consumer._commit(
                    consumer._cursor,
                    consumer._inflight,
                    dead={o: a for o, a in consumer._dead.items() if o != offset},
                )
        except errors.OwnershipLostError:
            return  # the new owner finishes the move from the owner record
        except errors.LargeQueueError as exc:
            # Tried again after a pause that doubles (up to a minute): not at every receive, which
            # would spin on a full dead-letter queue and spend each receive's budget on this entry.
            failures = consumer._move_failures[offset] = consumer._move_failures.get(offset, 0) + 1
            pause = min(_MOVE_PAUSE_MOST, _MOVE_PAUSE_FIRST * 2 ** (failures - 1))
            consumer.deliveries.nacked(offset, pause, None)
            log.warning(
                "queue %r: offset %d could not be moved to dead-letter queue %r yet (%s); it stays"
                " in flight and is tried again in %.1f s",
                consumer.queue.name,
                offset,
                consumer.dead_letters.target.name,
                exc,
                pause,
            )
            continue
        consumer._move_failures.pop(offset, None)
        inflight = {o: c for o, c in consumer._inflight.items() if o != offset}
        try:
            consumer._commit(
                consumer._cursor,
                inflight,
                dead={o: a for o, a in consumer._dead.items() if o != offset},
                dead_lettered=consumer._dead_lettered + 1,
            )
        except errors.OwnershipLostError:
            return  # the letter is written: the new owner finds it there and acks the entry
        consumer.deliveries.acked({offset})


__all__ = ["DeadLetters", "move_dying"]
