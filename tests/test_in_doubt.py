"""Writes that time out in doubt: never repeated blindly, always reported honestly.

Each test makes one kind of command time out, either after applying it (a
lost reply) or before (a lost request), and checks what the caller is told
and that the queue still holds exactly what was committed.
"""

from __future__ import annotations

import pickle

import pytest

from large_queue import OutcomeUnknownError, Queue
from large_queue.backends.faults import Call, FaultInjectingBackend
from large_queue.errors import BackendTimeoutError
from tests.fix_backends import Store


@pytest.fixture
def faulty(store: Store) -> tuple[FaultInjectingBackend, Queue]:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends="lock")  # the locked protocol's steps
    backend = FaultInjectingBackend(store.backend)
    return backend, Queue.open(backend, queue.name)


def _contents(queue: Queue) -> list[object]:
    info = queue.info()
    assert info.lock_owner is None
    return [e.value for e in map(queue.get, range(info.head_offset, info.tail_offset)) if e]


@pytest.mark.parametrize("applied", [True, False])
def test_in_doubt_acquire_is_resolved_not_repeated(
    faulty: tuple[FaultInjectingBackend, Queue], applied: bool
) -> None:
    backend, queue = faulty
    backend.inject(lambda call: call.is_acquire, applied=applied)
    assert queue.enqueue("x") == 0
    assert backend.injected == 1
    assert _contents(queue) == ["x"]
    # One acquire took effect either way: an applied one was reused, a dropped
    # one tried again. (Repeating an applied one would have met its own lock.)
    assert queue.lock.try_acquire("probe").token.counter == 2


@pytest.mark.parametrize("applied", [True, False])
def test_buffer_command_timeouts_are_repeated_safely(
    faulty: tuple[FaultInjectingBackend, Queue], applied: bool
) -> None:
    backend, queue = faulty
    backend.inject(lambda call: call.is_buffer, applied=applied, times=2)
    assert queue.enqueue_batch(["a", "b", "c", "d"]) == range(0, 4)
    backend.inject(lambda call: call.is_buffer, applied=applied, times=2)
    assert [e.value for e in queue.dequeue_batch(2)] == ["a", "b"]
    assert backend.injected == 4
    assert _contents(queue) == ["c", "d"]


def test_commit_lost_request_is_repeated_and_succeeds(faulty: tuple[FaultInjectingBackend, Queue]) -> None:
    backend, queue = faulty
    backend.inject(lambda call: call.is_commit, applied=False)
    assert queue.enqueue("once") == 0
    assert _contents(queue) == ["once"]


def test_commit_lost_reply_reports_an_unknown_outcome(faulty: tuple[FaultInjectingBackend, Queue]) -> None:
    backend, queue = faulty
    backend.inject(lambda call: call.is_commit, applied=True)
    with pytest.raises(OutcomeUnknownError) as raised:
        queue.enqueue("maybe")  # no txn id of the caller's: no receipt to read back
    error = raised.value
    assert (error.stage, error.offsets) == ("the commit", range(0, 1)) and error.txn_id
    assert "not repeated blindly" in str(error)
    assert pickle.loads(pickle.dumps(error)).offsets == range(0, 1)
    assert _contents(queue) == ["maybe"]  # it was applied, exactly once
    assert queue.enqueue("next") == 1


def test_commit_lost_reply_with_a_txn_id_is_settled_by_its_receipt(
    faulty: tuple[FaultInjectingBackend, Queue],
) -> None:
    backend, queue = faulty
    backend.inject(lambda call: call.is_commit, applied=True)
    assert queue.enqueue("surely", txn_id="txn-7") == 0  # the receipt was read back: applied
    assert _contents(queue) == ["surely"]
    assert queue.stats().outcomes_unknown == 0


def test_dequeue_with_lost_commit_reply_names_the_entries(
    faulty: tuple[FaultInjectingBackend, Queue],
) -> None:
    backend, queue = faulty
    queue.enqueue_batch(["a", "b", "c"])
    backend.inject(lambda call: call.is_commit, applied=True)
    with pytest.raises(OutcomeUnknownError) as raised:
        queue.dequeue_batch(2)
    assert [e.value for e in raised.value.entries] == ["a", "b"]
    assert _contents(queue) == ["c"]  # removed once; never delivered twice
    assert queue.dequeue().value == "c"  # type: ignore[union-attr]


def test_timeouts_that_persist_surface_and_release_the_lock(
    faulty: tuple[FaultInjectingBackend, Queue],
) -> None:
    backend, queue = faulty
    backend.inject(lambda call: call.is_buffer, applied=False, times=3)
    with pytest.raises(BackendTimeoutError):
        queue.enqueue("never")
    assert _contents(queue) == []
    assert queue.enqueue("later") == 0


def test_call_classification() -> None:
    from large_queue.backends import Increment, RecordKey, Write

    metadata = RecordKey("test", "q", "queue-metadata")
    assert Call("operate", metadata, (Write("lock_owner", "t"), Increment("fence_ctr", 1))).is_acquire
    assert Call("operate", metadata, (Write("lock_owner", ""),)).is_commit
    assert Call("operate", RecordKey("test", "q", "queue-buffer-3")).is_buffer


@pytest.mark.parametrize("applied", [True, False])
def test_owner_writes_of_the_cluster_shim_survive_timeouts(store: Store, applied: bool) -> None:
    queue = store.new_queue(capacity=20, slots_per_record=5)
    queue.enqueue_batch(range(8))
    backend = FaultInjectingBackend(store.backend)
    shared = Queue.open(backend, queue.name)
    with shared.consumer("node", time_slice=60, timeout=60, poll_interval=60) as consumer:
        owner_write = lambda call: call.key.user_key == "queue-owner" and call.method == "operate"  # noqa: E731
        backend.inject(owner_write, applied=applied)
        messages = consumer.receive(5)
        assert [m.value for m in messages] == [0, 1, 2, 3, 4]
        backend.inject(owner_write, applied=applied)
        consumer.ack(messages)
        assert [e.value for e in consumer.dequeue(5)] == [5, 6, 7]
        assert backend.injected == 2
