"""Fault injection: in-doubt timeouts at every write command of every operation, then the documented recovery.

Each example runs random enqueues, batch enqueues, dequeues and batch
dequeues, each with its own txn id, on a small queue (both append modes).
Before a call, a fault may be armed on its k-th write command (the acquire,
a reservation, a buffer command, a publish, the commit...): that command and
the next ``times - 1`` time out in doubt, applied (a lost reply) or not (a
lost request). When the call fails, the caller does what the errors say:
calls again with the same txn id, until it succeeds. Invariant: every entry
enqueued is delivered exactly once, in order (by the calls' final answers,
then a drain), and no call is left in doubt.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from large_queue import Queue
from large_queue.backends.faults import FaultInjectingBackend
from large_queue.errors import BackendTimeoutError, OutcomeUnknownError
from tests.fix_backends import Store


@dataclass(frozen=True)
class Fault:
    command: int  #: which write command of the call times out first
    times: int  #: how many in a row
    applied: bool


@dataclass(frozen=True)
class Call:
    enqueue: bool
    size: int
    fault: Fault | None


calls = st.lists(
    st.builds(
        Call,
        enqueue=st.booleans(),
        size=st.integers(1, 4),
        fault=st.none()
        | st.builds(Fault, command=st.integers(0, 5), times=st.integers(1, 3), applied=st.booleans()),
    ),
    min_size=1,
    max_size=10,
)


def _run(store: Store, appends: str, script: list[Call]) -> None:
    queue = store.new_queue(appends=appends, capacity=12, slots_per_record=3, hole_timeout=60)
    backend = FaultInjectingBackend(store.backend)
    faulty = Queue.open(backend, queue.name)
    values = itertools.count()
    enqueued: list[int] = []
    delivered: list[int] = []
    size = 0
    for number, call in enumerate(script):
        txn = f"c{number}"
        if call.fault is not None:
            seen = itertools.count()
            backend.inject(
                lambda _, k=call.fault.command, n=seen: next(n) >= k,
                applied=call.fault.applied,
                times=call.fault.times,
            )
        if call.enqueue:
            if size + call.size > queue.capacity:
                continue
            batch = [next(values) for _ in range(call.size)]
            offsets = _until_done(backend, lambda b=batch, t=txn: faulty.enqueue_batch(b, txn_id=t))
            assert len(offsets) == len(batch)
            enqueued += batch
            size += len(batch)
        else:
            taken = _until_done(backend, lambda m=call.size, t=txn: faulty.dequeue_batch(m, txn_id=t))
            delivered += [entry.value for entry in taken]
            size -= len(taken)
        backend._faults.clear()  # a fault armed past the call's last command is not carried over
        state = faulty.outcome(txn).state
        if state == "pending":  # only a release lost at every try: the call's lock, left to expire
            assert faulty.info().lock_owner == txn
            store.advance(2.5)  # past the lock's TTL: the next call breaks it
        else:
            assert state in ("committed", "not committed")
    backend._faults.clear()
    while taken := faulty.dequeue_batch(
        12
    ):  # no waiting: a retry publishes its own reservation, no hole is left
        delivered += [entry.value for entry in taken]
    assert delivered == enqueued  # each exactly once, in order
    assert faulty.info().lock_owner is None


#: what the calls of a test met: failures recovered from, answers at once or by the retry
MET: Counter[str] = Counter()


def _until_done(backend: FaultInjectingBackend, call):  # type: ignore[no-untyped-def]
    """Make the call; when it fails in doubt, make it again with the same txn id (the documented recovery)."""
    for attempt in range(1, 4):
        injected = backend.injected
        try:
            result = call()
        except (OutcomeUnknownError, BackendTimeoutError) as failure:
            MET[f"recovered from {type(failure).__name__}"] += 1
            backend._faults.clear()  # the next attempt goes through
            continue
        MET["answered at once" if attempt == 1 else "answered by the retry"] += 1
        MET["timeouts absorbed within a call"] += int(backend.injected > injected)
        return result
    raise AssertionError("the retry with the same txn id did not settle the call")


def _examples(store: Store) -> int:
    return 60 if store.remote else 400


@pytest.mark.parametrize("appends", ["reserve", "lock"])
def test_every_entry_exactly_once_through_in_doubt_faults(store: Store, appends: str) -> None:
    MET.clear()
    settings(max_examples=_examples(store), deadline=None, suppress_health_check=list(HealthCheck))(
        given(script=calls)(lambda script: _run(store, appends, script))
    )()
    print(f"{store.kind} {appends}: {dict(MET)}")
    # the faults did fire, and both recoveries were needed: an error answered by the retry,
    # and timeouts the call itself absorbed (repeated idempotent commands, receipts read back)
    assert MET["answered by the retry"] >= _examples(store) // 20
    assert MET["timeouts absorbed within a call"] >= _examples(store) // 20
