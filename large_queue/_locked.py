"""Buffer commands under the queue lock: every one fenced, repeated when it times out.

A locked enqueue writes its slots, and a locked dequeue reads its slots and
erases those below the head, in one command per buffer record. Each such
command carries the holder's fencing token in the record and is guarded on
the server by "no later token has written here" (see
:mod:`large_queue.fencing`); a read alone is guarded only by the queue's
incarnation. What a paused holder meets, as a timeline::

    t=0   A holds the lock (token 7) and writes slots of record R; the
          command times out in doubt.
    t=0   A repeats it: it sets the same slots and mark to the same values,
          so applying it twice is applying it once.
    t=1   A pauses; its lock expires; B takes the lock (token 8) and writes R.
    t=5   A resumes and writes R again: refused (8 > 7). A gets
          LockLostError (or QueueNotFoundError if the queue was deleted or
          created again meanwhile); nothing of A's became visible, since
          only the lock's commit publishes a head or tail.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from large_queue import _records as rec
from large_queue import errors
from large_queue.appends._slots import slot_writes
from large_queue.backends import ListGetRange, Operation, RecordKey
from large_queue.backends.conditions import Condition
from large_queue.fencing import mark, no_newer_writer, same_queue
from large_queue.lock import LockGrant

if TYPE_CHECKING:
    from large_queue.queue import Queue

#: tries of an (idempotent) buffer command that times out
BUFFER_ATTEMPTS = 3


def write_entries(
    queue: Queue, grant: LockGrant, values: list[Any], *, overwrite_if_full: bool
) -> tuple[LockGrant, int, int]:
    """The middle step of a locked enqueue: write the slots, one command per record.

    Returns the (possibly renewed) grant and the head and tail to commit.
    """
    head, tail = grant.head, grant.tail
    count = len(values)
    if tail + count - head > queue.capacity and not overwrite_if_full:
        raise errors.QueueFullError(
            f"queue {queue.name!r} has {queue.capacity - (tail - head)} free slots,"
            f" {count} requested (capacity {queue.capacity})",
            queue=queue.name,
        )
    new_tail = tail + count
    now_ms = grant.now_ms  # the store's clock, not this machine's
    shape = queue.shape
    for record, runs in shape.runs(tail, new_tail).items():
        writes = [
            slot_writes(
                shape.slot_of(run.start), [[o, values[o - tail], now_ms] for o in run], shape.slots_per_record
            )
            for run in runs
        ]
        grant, _ = buffer_command(queue, grant, record, writes, read=None)
    return grant, max(head, new_tail - queue.capacity), new_tail


def erasures(queue: Queue, runs: list[range]) -> list[Operation]:
    """The operations that empty ``runs`` of offsets of one buffer record."""
    shape = queue.shape
    return [slot_writes(shape.slot_of(run.start), [None] * len(run), shape.slots_per_record) for run in runs]


def buffer_command(
    queue: Queue, grant: LockGrant, record: int, writes: list[Operation], *, read: ListGetRange | None
) -> tuple[LockGrant, list[Any]]:
    """One command on a buffer record under the lock, renewing the lock first when due.

    Renews when half the lock TTL has passed (long batches). Returns the
    (possibly renewed) grant and the slots read.
    """
    if time.monotonic() - grant.acquired_at > queue.lock_ttl / 2:
        grant = queue.lock.renew(grant)
    return grant, fenced_command(queue, grant, record, writes, read=read)


def fenced_command(
    queue: Queue, grant: LockGrant, record: int, writes: list[Operation], *, read: ListGetRange | None
) -> list[Any]:
    """Fenced writes, then a read, on one buffer record; returns the slots read.

    ``LockLostError`` if a later holder's token has written the record.
    """
    operations: list[Operation] = [*writes, *mark(grant.token)] if writes else []
    if read is not None:
        operations.append(read)
    if writes:
        guard: Condition | None = no_newer_writer(grant.token, queue.incarnation)
    else:
        guard = None if queue.incarnation is None else same_queue(queue.incarnation)
    try:
        result = _retrying_timeouts(queue, queue.keys.buffer(record), operations, guard)
    except errors.ConditionNotMetError:
        why = queue.lock.why_lost(grant, f"writing buffer record {record}")
        if isinstance(why, errors.QueueNotFoundError):
            raise why from None
        queue.counters.bump("fencing_refusals")
        if why is not None:  # counted as a lost lock there
            raise why from None
        queue.counters.bump("locks_lost")
        raise errors.LockLostError(
            f"txn {grant.txn_id!r} lost the lock of queue {queue.name!r}: a later holder"
            f" (token > {grant.token}) has written buffer record {record}; nothing was committed",
            queue=queue.name,
            txn_id=grant.txn_id,
        ) from None
    except errors.RecordNotFoundError:
        raise queue.lock.replaced() or errors.CorruptQueueError(
            f"buffer record {record} of queue {queue.name!r} is missing", queue=queue.name
        ) from None
    except errors.CorruptRecordError as exc:
        raise errors.CorruptQueueError(
            f"buffer record {record} of queue {queue.name!r} cannot be read ({exc}); its other records"
            " can (large-queue check names what is damaged)",
            queue=queue.name,
            record=record,
        ) from exc
    slots: list[Any] = result.get(rec.SLOTS, [])
    if read is not None and not isinstance(slots, list):
        raise errors.CorruptQueueError(
            f"buffer record {record} of queue {queue.name!r} has no slot list", queue=queue.name
        )
    return slots


def _retrying_timeouts(
    queue: Queue, key: RecordKey, operations: list[Operation], guard: Condition | None
) -> dict[str, Any]:
    """Run an idempotent buffer command, repeating it if it times out.

    A buffer command sets slots and fencing marks to absolute values, so
    applying it twice is the same as once; nothing it does is visible
    before the commit. Other errors are not retried.
    """
    for attempt in range(1, BUFFER_ATTEMPTS + 1):
        queue.counters.bump("commands")
        try:
            return queue.backend.operate(key, operations, condition=guard)
        except errors.BackendTimeoutError as exc:
            if attempt == BUFFER_ATTEMPTS:
                raise errors.BackendTimeoutError(
                    f"a buffer command of queue {queue.name!r} timed out {BUFFER_ATTEMPTS} times ({exc}):"
                    " the operation stopped before its commit, so none of its entries is visible and it"
                    " can be made again (an enqueue with overwrite_if_full may have written over the"
                    " oldest entries already)",
                    code=exc.code,
                    in_doubt=False,
                ) from exc
            queue.counters.bump("timeouts_repeated")
    raise AssertionError("BUFFER_ATTEMPTS must be positive")
