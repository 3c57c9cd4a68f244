"""The torture run's calls with txn ids: made again until they succeed, and settled after a kill.

With ``txn_ids`` every worker's call carries its own txn id. A call that
fails, or times out in doubt, is made again with the same id until it
succeeds, which is what the receipts promise is safe: an enqueue lands once,
a dequeue returns what it took. A worker killed in the middle of a call
leaves it open in its history; after the run the coordinator does what an
application restarting would do: asks ``queue.outcome`` whether the receipt
log still covers the call, then makes it again with its txn id (an enqueue
with its values, a dequeue with its size) and records the answer as that
call's completion. So no call is left in doubt while the log covers it; the
run's queue keeps the largest log (:data:`RECEIPTS`).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from large_queue import errors
from large_queue._history import read_calls
from large_queue.lock import LockPolicy
from large_queue.queue import Entry, Queue

T = TypeVar("T")

#: what retrying cannot mend: the call is wrong, or its answer is gone
_FINAL = (
    errors.InvalidArgumentError,
    errors.EntriesGoneError,
    errors.QueueNotFoundError,
    errors.CorruptQueueError,
)
#: receipts the run's queue keeps: thousands of calls a second must not push a killed worker's out
RECEIPTS = 4000
#: how long a call is made again before the run gives up on it
PATIENCE = 60.0


class GaveUp(Exception):
    """A worker's run ended while its call still failed: the call is left open, for the settling."""


def until_done(call: Callable[[], T], give_up_at: float | None = None) -> T:
    """``call()`` made again after every failure but a final one.

    ``give_up_at`` (monotonic): then :class:`GaveUp` (a worker's deadline:
    consumers stop, and a producer would wait on a full queue for ever);
    without it, the last failure is raised after :data:`PATIENCE` seconds.
    """
    patience = time.monotonic() + PATIENCE
    while True:
        try:
            return call()
        except _FINAL:
            raise
        except errors.LargeQueueError:
            if give_up_at is not None and time.monotonic() > give_up_at:
                raise GaveUp() from None
            if time.monotonic() > patience:
                raise
            time.sleep(0.002)


def answer(call: Callable[[], T], deadline: float) -> T | None:
    """A worker's call made again until it succeeds; None at the worker's deadline (the call is left open)."""
    try:
        return until_done(call, deadline)
    except GaveUp:
        return None


def settling_queue(url: str, name: str) -> Queue:
    """The coordinator's handle for settling calls, opened once (a kill is settled within milliseconds)."""
    return Queue.open(url, name, lock_policy=LockPolicy(acquire_timeout=30.0))


def settle_open_calls(queue: Queue, paths: list[Path]) -> int:
    """Make every call left open in ``paths`` (killed workers' histories) again with its txn id.

    Records each answer as the call's completion; returns how many calls were settled.
    """
    settled = 0
    for path in paths:
        for call in read_calls([path]):
            txn = call.request.get("txn")
            if call.outcome is not None or txn is None:
                continue
            # Making it again is safe only while the log still covers the call: a receipt dropped by
            # the log's count bound would make a committed call look new.
            outcome = queue.outcome(txn, within=time.monotonic() - call.invoked + 1.0)
            if outcome.state == "unknown":
                _complete(path, call.request["id"], call.client, "unknown", error=outcome.detail)
                settled += 1
                continue
            if call.op == "enqueue":
                values = call.request["values"]
                try:
                    offsets = until_done(functools.partial(queue.enqueue_batch, values, txn_id=txn))
                except errors.OutcomeUnknownError as exc:  # its slots were reused before it was settled
                    _complete(path, call.request["id"], call.client, "unknown", error=str(exc))
                else:
                    _complete(
                        path, call.request["id"], call.client, "ok", offsets=[offsets.start, offsets.stop]
                    )
            else:
                count = call.request["max_entries"]
                try:
                    taken: list[Entry] = until_done(functools.partial(queue.dequeue_batch, count, txn_id=txn))
                except errors.EntriesGoneError as gone:  # committed, and its slots erased since
                    assert gone.offsets is not None
                    values = _acknowledged(path.parent)  # what the producers were told each offset holds
                    entries = [[offset, values.get(offset)] for offset in gone.offsets]
                    known = all(value is not None for _, value in entries)
                    _complete(
                        path, call.request["id"], call.client, "ok" if known else "unknown", entries=entries
                    )
                else:
                    entries = [[e.offset, e.value] for e in taken]
                    _complete(path, call.request["id"], call.client, "ok", entries=entries)
            settled += 1
    return settled


def _acknowledged(histories: Path) -> dict[int, str]:
    """Offset -> value of every enqueue acknowledged so far, from the histories."""
    values: dict[int, str] = {}
    for call in read_calls(sorted(histories.glob("*.jsonl"))):
        if call.op == "enqueue" and call.outcome == "ok":
            start = call.response["offsets"][0]
            values.update((start + index, value) for index, value in enumerate(call.request["values"]))
    return values


def _complete(path: Path, op_id: int, client: str, outcome: str, **fields: object) -> None:
    """Append call ``op_id``'s completion to its history (after a line a kill may have cut short)."""
    event = {"type": outcome, "id": op_id, "client": client, "t": time.monotonic(), **fields}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, ("\n" + json.dumps(event) + "\n").encode())
    finally:
        os.close(fd)
