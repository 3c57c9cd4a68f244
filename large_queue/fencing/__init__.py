"""Fencing tokens: a writer whose lock was broken cannot overwrite newer data.

Every lock grant carries a token larger than every earlier grant's. Each
buffer-record write carries its writer's token in the record (``fence_epoch``,
``fence_ctr``) and is guarded on the server by "no larger token has written
this record". The failure story, as a timeline::

    t=0   A acquires the lock with token 7 and reads tail = 40.
    t=1   A pauses (GC, SIGSTOP, a slow network).
    t=3   A's lock expires on the server's clock; B breaks it, gets token 8,
          writes offset 40 into buffer record R (R's mark becomes 8) and
          commits tail = 41.
    t=9   A resumes and writes its entry for offset 40 into R with token 7.
          The server refuses it (8 > 7): B's committed entry survives.
          A's commit is refused too (the lock is no longer A's), so A gets
          LockLostError and nothing A did is visible.

If B never touched R, A's write to R lands, but only where it harms nothing
visible: a slot at or past the committed tail (readers ignore it and the next
writer of that offset replaces it) or a slot already dequeued (a dequeuer only
ever erases slots below the head it read). The one exception is a queue
written with ``overwrite_if_full``: there A's slot may be the oldest entry's,
which that mode gives up anyway; readers see the slot no longer holds the
head's offset and report the entry as overwritten.

Tokens are pairs ``(epoch, counter)`` compared in order. When the counter
reaches its limit the holder starts a new epoch with counter 0, in one
guarded write on the metadata record. Nothing has to be reset in the buffer
records, so no window opens in which an old token could pass for a new one.
"""

from __future__ import annotations

from dataclasses import dataclass

from large_queue._records import FENCE_COUNTER, FENCE_EPOCH, INCARNATION
from large_queue.backends import Write
from large_queue.backends.conditions import (
    Bound,
    Condition,
    IntBin,
    Param,
    StrBin,
    all_of,
    any_of,
    eq,
    le,
    lt,
)

#: the counter value at which a new epoch starts (Aerospike integers are signed 64-bit)
DEFAULT_COUNTER_LIMIT = 2**62


@dataclass(frozen=True, order=True)
class FencingToken:
    """A lock grant's token; a larger token is a later grant."""

    epoch: int
    counter: int

    def __str__(self) -> str:
        return f"{self.epoch}:{self.counter}"


_NO_NEWER_WRITER = any_of(
    lt(IntBin(FENCE_EPOCH), Param("epoch")),
    all_of(eq(IntBin(FENCE_EPOCH), Param("epoch")), le(IntBin(FENCE_COUNTER), Param("counter"))),
)


_NO_NEWER_WRITER_IN = all_of(_NO_NEWER_WRITER, eq(StrBin(INCARNATION), Param("incarnation")))
_SAME_QUEUE = eq(StrBin(INCARNATION), Param("incarnation"))


def no_newer_writer(token: FencingToken, incarnation: str | None = None) -> Condition:
    """Guard for a buffer write: every token that wrote the record is <= ``token``.

    With ``incarnation``, the record must also belong to that creation of the
    queue: a handle opened before the queue was deleted and created again
    carries tokens of the old queue, which say nothing about the new one.
    """
    values: dict[str, int | str] = {"epoch": token.epoch, "counter": token.counter}
    if incarnation is None:
        return Bound(_NO_NEWER_WRITER, values)
    return Bound(_NO_NEWER_WRITER_IN, {**values, "incarnation": incarnation})


def same_queue(incarnation: str) -> Condition:
    """Guard for a buffer read: the record belongs to that creation of the queue."""
    return Bound(_SAME_QUEUE, {"incarnation": incarnation})


def mark(token: FencingToken) -> list[Write]:
    """Operations that record ``token`` as the record's latest writer."""
    return [Write(FENCE_EPOCH, token.epoch), Write(FENCE_COUNTER, token.counter)]


__all__ = ["DEFAULT_COUNTER_LIMIT", "FencingToken", "mark", "no_newer_writer", "same_queue"]
