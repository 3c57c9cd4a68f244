"""A lock holder paused between its acquire and its commit, in another process, on both stores.

On the embedded store such a holder's operation is one SQLite transaction
that no other process sees until it ends (it holds the store's writer lock):
a waiting dequeue must still return at its own deadline, and ``outcome()``
must not call the holder's txn "not committed" while it may still commit.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from large_queue import Queue, connect
from tests.fix_backends import Place

PAUSE = 4.0


def _paused_dequeue(url: str, name: str, txn_id: str, started: Any) -> None:
    from large_queue import _dequeue

    read = _dequeue.read_settled

    def paused(*args: Any, **kwargs: Any) -> Any:
        started.set()
        time.sleep(PAUSE)  # holding the queue lock (and, on the embedded store, the writer lock)
        return read(*args, **kwargs)

    _dequeue.read_settled = paused
    Queue.open(connect(url), name).dequeue_batch(2, txn_id=txn_id)


def _while_paused(place: Place, lock_ttl: float) -> tuple[Queue, Any]:
    name = place.name("paused")
    queue = Queue.create(place.connect(), name, capacity=20, lock_ttl=lock_ttl)
    queue.enqueue_batch(["a", "b", "c"])
    context = multiprocessing.get_context("spawn")
    started = context.Event()
    holder = context.Process(target=_paused_dequeue, args=(place.url, name, "T9", started))
    holder.start()
    assert started.wait(30)
    time.sleep(0.3)
    return queue, holder


def test_a_waiting_dequeue_returns_at_its_deadline_while_a_holder_is_paused(place: Place) -> None:
    queue, holder = _while_paused(place, lock_ttl=30.0)
    try:
        started = time.monotonic()
        assert queue.dequeue(timeout=1.0) is None
        assert time.monotonic() - started < PAUSE - 1  # not until the holder goes on
    finally:
        holder.join(30)
    assert holder.exitcode == 0
    assert [e.value for e in queue.dequeue_batch(5)] == ["c"]  # the holder took a and b, once


def test_outcome_never_says_not_committed_of_a_call_that_may_still_commit(place: Place) -> None:
    queue, holder = _while_paused(place, lock_ttl=30.0)
    try:
        state = queue.outcome("T9").state  # on the embedded store: asked once the holder's call ended
        assert state in ("pending", "committed")
    finally:
        holder.join(30)
    assert holder.exitcode == 0
    assert queue.outcome("T9").state == "committed"
