"""Quick takes: a lone consumer's dequeue of entries it read ahead, in one command and without the lock.

A dequeue of a reserve queue under the lock is two commands, the acquire
and the commit, where its slots were read ahead (:mod:`large_queue._read_ahead`)
or beside the acquire. When nobody else took the lock between one handle's
dequeues, the acquire would only read back what that handle's own commit
wrote: the head it left, the lock free. A quick take sends the acquire and the
commit as one command on the metadata record, which moves the head from
``h`` to ``h + n`` only if

- the fencing token (epoch, counter) is the one the handle's last commit
  held. Every acquire increments the counter, so no acquire came since: the
  lock is free (that commit released it), no holder moved the head, no
  consumer group was added, no other maintenance ran;
- the head is still ``h``: an overwriting producer (which moves the head in
  its reservation, without the lock) has not passed an offset it takes;
- the record is the queue the handle opened (its incarnation).

It takes the kept slots of ``h .. h + n - 1``: each held its own offset's
published entry when it was read, and keeps it until the head passes it,
which the condition rules out. A handle whose last dequeue took all it asked
for (it is behind the producers, so entries are likely there) and that kept
too few reads first, without the lock: the slots from ``h`` on, and up to two
buffer records past what it asks for, in one command (a batch read), which
it keeps; then it takes. Read before the take, such a slot still holds its
entry at the take, for the same reason. Anything else (the condition not met,
too few entries found, a caller's txn whose receipt must be written,
retention by age, which judges entries by the store's clock that the acquire
reads) is a dequeue under the lock as before, which judges holes and leaves
the state for the next quick take: only where its acquire was the first
since the handle's last one, since consumers that take turns with the lock
would have every quick take refused (a command for nothing).

The failure story, as a timeline (consumers C and D, an overwriting producer P)::

    t=0  C's locked dequeue holds token (1, 7), takes 40, reads 41..55 ahead
         and commits head 41, releasing the lock.
    t=1  C's quick take: token (1, 7) and head 41 hold, so the head moves to
         42 in one command. C returns 41.
    t=2  D acquires the lock (the counter becomes 8) and pauses holding it.
    t=3  C's quick take is refused (counter 8): C dequeues under the lock. It
         waits out D's TTL, breaks the lock (counter 9), reads head 42 itself
         and goes on from its new token.
    t=4  D resumes and commits: refused, its token is stale (fencing, as ever).
    t=5  P's overwriting reservation moves the head from 43 to 46. C's quick
         take at 43 is refused (head 46); its locked dequeue reads head 46 and
         never takes 43..45 from what it kept (their slots are P's now).
    t=6  C's quick take of 46 times out with no reply: it may have moved the
         head. C sends it again (:mod:`large_queue._guarded`). Its guard
         holds only if the head is still 46, so if it applies the first had
         not, and C returns 46. If the guard fails, the first attempt or
         another consumer moved the head, which nobody can tell apart: C
         raises ``OutcomeUnknownError`` naming entry 46, as an in-doubt
         commit does, and its next dequeue reads the head under the lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from large_queue import _records as rec
from large_queue import errors
from large_queue._entries import Entry
from large_queue._guarded import guarded_write
from large_queue.appends._prefix import settle_plain
from large_queue.backends import Compute, ListGetRange, Operation, Read, RecordKey, Write
from large_queue.backends.conditions import Bound, IntBin, Param, StrBin, all_of, eq, max_of
from large_queue.fencing import FencingToken

if TYPE_CHECKING:
    from large_queue.queue import Queue

#: no acquire since the token's commit, and the head where that commit (or a quick take) left it
_UNTOUCHED = all_of(
    eq(StrBin(rec.LOCK_OWNER), rec.NO_OWNER),  # implied by the token, and checked all the same
    eq(IntBin(rec.FENCE_EPOCH), Param("epoch")),
    eq(IntBin(rec.FENCE_COUNTER), Param("counter")),
    eq(IntBin(rec.HEAD), Param("head")),
)
#: ... in the queue as it was opened (queues created before incarnations were kept have none)
_UNTOUCHED_IN = all_of(*_UNTOUCHED.parts, eq(StrBin(rec.INCARNATION), Param("incarnation")))
_PUBLISHED_AT_LEAST = max_of(IntBin(rec.PUBLISHED), Param("published"))


class _Refused(errors.LargeQueueError):
    """The guard did not hold: dequeue under the lock (never reaches the caller)."""


class QuickTakes:
    """Where one handle's last dequeue left the head, and under which token (see the module)."""

    def __init__(self) -> None:
        # one attribute, replaced whole: threads sharing the handle read a consistent state
        self._left: tuple[FencingToken, int, bool] | None = None
        self._last_token: FencingToken | None = None  # of this handle's last locked dequeue

    def alone(self, token: FencingToken) -> bool:
        """Whether the acquire that got ``token`` was the first since this handle's last one.

        Consumers that take turns with the lock would have their quick takes
        refused (one wasted command each): a handle quick-takes only after an
        acquire that nobody else's came between (or its first).
        """
        last = self._last_token
        return last is None or (last.epoch == token.epoch and last.counter + 1 == token.counter)

    def left(self, token: FencingToken, head: int, *, full: bool, alone: bool) -> None:
        """A dequeue holding ``token`` committed ``head`` and released the lock.

        ``full``: it took all the entries it was asked for (more are likely
        there). ``alone``: see :meth:`alone`; if not, no quick take follows.
        """
        self._last_token = token
        self._left = (token, head, full) if alone else None

    def take(self, queue: Queue, max_entries: int, txn_id: str) -> list[Entry] | None:
        """``max_entries`` entries read ahead, taken in one command; None: dequeue under the lock."""
        left = self._left
        if left is None or queue.max_age_ms is not None:
            return None
        token, head, full = left
        stop = head + max_entries
        slots = queue.read_ahead.covering(head, stop)
        if slots is None and full and stop - head <= _room(queue, head):  # behind: read ahead, then take
            slots = _read_ahead_from(queue, head, stop)
        # all of them, or none: another thread of this handle may have replaced the run meanwhile
        settled = settle_plain(head, slots) if slots is not None and len(slots) == max_entries else None
        if settled is None:
            return None
        taken = queue._entries(settled.entries)
        values: dict[str, int | str] = {"epoch": token.epoch, "counter": token.counter, "head": head}
        if queue.incarnation is not None:
            values["incarnation"] = queue.incarnation
        condition = Bound(_UNTOUCHED if queue.incarnation is None else _UNTOUCHED_IN, values)
        moves: list[Operation] = [
            Write(rec.HEAD, stop),
            Compute(rec.PUBLISHED, _PUBLISHED_AT_LEAST, {"published": stop}),
            Read(rec.TAIL),
        ]

        def unknown(cause: errors.BackendTimeoutError) -> errors.OutcomeUnknownError:
            queue.counters.bump("outcomes_unknown")
            return errors.OutcomeUnknownError(
                f"a dequeue from queue {queue.name!r} timed out and may or may not have been applied:"
                " tried again, it found the head moved, by that attempt or by another consumer. Its"
                " entries may have left the queue, or may be dequeued again.",
                queue=queue.name,
                txn_id=txn_id,
                stage="the quick take",
                detail=f"token {token}; head {head} -> {stop} ({cause})",
                entries=taken,
            )

        self._left = None  # until the head is known again
        try:
            state = guarded_write(
                queue.backend,
                queue.keys.metadata,
                moves,
                condition,
                lost=lambda: _Refused("the quick take's guard did not hold"),
                unknown=unknown,
                sent=lambda: queue.counters.bump("commands"),
            )
        except (_Refused, errors.RecordNotFoundError, errors.BackendTimeoutError):
            # someone took the lock or moved the head (or the store did not answer, and did not
            # apply it): the locked dequeue reads the head
            return None
        self._left = (token, stop, True)
        queue.counters.add(size=state[rec.TAIL] - head)  # the backlog it saw, as an acquire sees it
        return taken


def _read_ahead_from(queue: Queue, head: int, stop: int) -> list[Any] | None:
    """Read the slots from ``head`` on, past ``stop``, without the lock; the kept slots of ``[head, stop)``.

    One command (a batch read where they lie in several buffer records). A
    slot that holds its own offset's published entry keeps it until the
    head passes it, and the take that follows moves the head only from
    ``head``: whatever this read keeps holds at that take, read just before
    it. None where the read did not find every offset of ``[head, stop)``
    published (then the dequeue holds the lock, which judges holes).
    """
    shape = queue.shape
    room = min(_room(queue, head), stop - head + 2 * shape.slots_per_record)  # two records past, at most
    end = head + queue.read_ahead.further(stop - head, room)
    reads: list[tuple[RecordKey, Sequence[Operation] | None]] = [
        (queue.keys.buffer(record), [ListGetRange(rec.SLOTS, shape.slot_of(run.start), len(run))])
        for record, (run,) in shape.runs(head, end).items()
    ]
    queue.counters.bump("commands")
    try:
        found = queue.backend.batch_read(reads) if len(reads) > 1 else [_read(queue, *reads[0])]
    except errors.BackendError:  # a read that failed: the dequeue under the lock reads again
        return None
    slots: list[Any] = []
    for bins in found:
        part = None if bins is None else bins.get(rec.SLOTS)
        if type(part) is not list:
            break
        slots += part
    queue.read_ahead.keep(head, slots, queue.prefix.verdicts)
    return queue.read_ahead.covering(head, stop)


def _room(queue: Queue, head: int) -> int:
    """The slots one read from ``head`` may take: never round into its first record again."""
    return queue.capacity - queue.shape.slot_of(head)


def _read(queue: Queue, key: RecordKey, operations: Sequence[Operation] | None) -> dict[str, Any] | None:
    """One record's reads; None where it is missing (as a batch read says)."""
    try:
        return queue.backend.operate(key, operations or [])
    except errors.RecordNotFoundError:
        return None
