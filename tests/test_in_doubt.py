"""Writes that time out in doubt: never repeated blindly, always reported honestly.

Each test makes one kind of command time out, either after applying it (a
lost reply) or before (a lost request), and checks what the caller is told
and that the queue still holds exactly what was committed.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from large_queue import OutcomeUnknownError, Queue, errors
from large_queue._guarded import ATTEMPTS
from large_queue.backends import Backend, Increment, Read, RecordKey, connect
from large_queue.backends.faults import Call, FaultInjectingBackend
from large_queue.cluster import ownership_info
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


@pytest.mark.parametrize("appends", ["lock", "reserve"])
def test_a_lock_release_or_hint_in_doubt_changes_no_answer(store: Store, appends: str) -> None:
    name = store.new_queue(capacity=6, slots_per_record=3, appends=appends).name
    backend = FaultInjectingBackend(store.backend)
    queue = Queue.open(backend, name)
    backend.inject(lambda call: call.is_commit, applied=True)
    assert queue.dequeue() is None  # an empty queue: only the lock (and hints) were in doubt
    queue.enqueue("a")
    assert [e.value for e in queue.dequeue_batch(1, txn_id="t1")] == ["a"]
    backend.inject(lambda call: call.is_commit, applied=True)
    assert [e.value for e in queue.dequeue_batch(1, txn_id="t1")] == ["a"]  # from its receipt
    backend.inject(lambda call: call.is_commit, applied=True)
    assert queue.dequeue(txn_id="t2") is None
    assert backend.injected == 3
    assert queue.stats().outcomes_unknown == 0 and queue.info().lock_owner is None


def test_timeouts_that_persist_surface_and_release_the_lock(
    faulty: tuple[FaultInjectingBackend, Queue],
) -> None:
    backend, queue = faulty
    backend.inject(lambda call: call.is_buffer, applied=False, times=3)
    with pytest.raises(BackendTimeoutError, match="none of its entries is visible") as caught:
        queue.enqueue("never")
    assert not caught.value.in_doubt  # the commit that would have shown it was never sent
    assert _contents(queue) == []
    assert queue.enqueue("later") == 0


def test_call_classification() -> None:
    from large_queue.backends import Increment, RecordKey, Write

    metadata = RecordKey("test", "q", "queue-metadata")
    assert Call("operate", metadata, (Write("lock_owner", "t"), Increment("fence_ctr", 1))).is_acquire
    assert Call("operate", metadata, (Write("lock_owner", ""),)).is_commit
    assert Call("operate", RecordKey("test", "q", "queue-buffer-3")).is_buffer


def _eight_entries_through_faults(store: Store) -> tuple[FaultInjectingBackend, Queue]:
    """A queue holding 0..7, and a handle on it whose commands faults can be injected into."""
    queue = store.new_queue(capacity=20, slots_per_record=5)
    queue.enqueue_batch(range(8))
    backend = FaultInjectingBackend(store.backend)
    return backend, Queue.open(backend, queue.name)


def _owner_write(call: Call) -> bool:
    """A write of the cluster shim's owner record."""
    return call.key.user_key == "queue-owner" and call.method == "operate"


@pytest.mark.parametrize("applied", [True, False])
def test_owner_writes_of_the_cluster_shim_survive_timeouts(store: Store, applied: bool) -> None:
    backend, shared = _eight_entries_through_faults(store)
    with shared.consumer("node", time_slice=60, timeout=60, poll_interval=30) as consumer:
        backend.inject(_owner_write, applied=applied)
        messages = consumer.receive(5)
        assert [m.value for m in messages] == [0, 1, 2, 3, 4]
        backend.inject(_owner_write, applied=applied)
        consumer.ack(messages)
        assert [e.value for e in consumer.dequeue(5)] == [5, 6, 7]
        assert backend.injected == 2


@pytest.mark.parametrize("applied", [True, False])
def test_in_doubt_acquire_sent_beside_a_read_is_resolved(store: Store, applied: bool) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)  # appends="reserve": its dequeues guess the head
    backend = FaultInjectingBackend(store.backend)
    handle = Queue.open(backend, queue.name)
    handle.enqueue("a")
    # fewer than it asked for: the queue is empty now, so the next dequeue holds the lock
    assert [entry.value for entry in handle.dequeue_batch(2)] == ["a"]
    handle.enqueue_batch(["b", "c"])  # not read ahead: the next acquire carries a read (Aerospike)
    backend.inject(lambda call: call.is_acquire, applied=applied)
    sent = len(backend.calls)
    assert handle.dequeue().value == "b"  # type: ignore[union-attr]
    assert backend.injected == 1
    timed_out = next(call for call in backend.calls[sent:] if call.is_acquire)
    assert timed_out.method == ("operate_and_read" if backend.reads_beside else "operate")
    assert [entry.value for entry in handle.dequeue_batch(5)] == ["c"]
    assert handle.info().lock_owner is None


def _local_server_process(address: str) -> int | None:
    """The process id of the Aerospike server at ``address``, if it is one this test may pause."""
    if address.rsplit(":", 1)[0] not in ("127.0.0.1", "localhost"):
        return None
    try:
        listed = subprocess.run(["pgrep", "-x", "asd"], capture_output=True, text=True, check=False)
        found = listed.stdout.split()
    except OSError:
        return None
    if len(found) != 1:
        return None
    try:
        os.kill(int(found[0]), 0)
    except OSError:  # another user's
        return None
    return int(found[0])


def _stopped(pid: int) -> None:
    """Wait until every thread of process ``pid`` is stopped: ``kill`` returns before a thread running
    on another core has been, and such a thread could still answer a command sent at once."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.001)


@contextlib.contextmanager
def _paused_server(address: str, timeout_ms: int) -> Iterator[tuple[Backend, list[RecordKey]]]:
    """A store on the server at ``address``, and two keys (the first holding ``n=0``), the server
    paused (SIGSTOP) inside; skipped where the server is no process this test may pause."""
    server = _local_server_process(address)
    if server is None:
        pytest.skip("needs the Aerospike server as a process of this machine and user, to pause it")
    backend = connect(f"aerospike://{address}/test?timeout_ms={timeout_ms}")
    keys = [RecordKey("test", "no-answer", uuid.uuid4().hex) for _ in range(2)]
    backend.put(keys[0], {"n": 0})
    os.kill(server, signal.SIGSTOP)
    try:
        _stopped(server)
        yield backend, keys
    finally:
        os.kill(server, signal.SIGCONT)


def test_a_batch_write_the_server_does_not_answer_is_a_timeout_in_doubt(aerospike_address: str) -> None:
    # paused longer than the client's timeout: the batch gets no answer
    with (
        _paused_server(aerospike_address, 200) as (backend, (written, beside)),
        pytest.raises(BackendTimeoutError) as caught,
    ):
        backend.operate_and_read(written, [Increment("n", 1)], (beside, [Read("n")], None))
    assert caught.value.in_doubt
    deadline = time.monotonic() + 5
    record = backend.get(written)
    while record is not None and record.bins["n"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        record = backend.get(written)
    # Either outcome is the server's to choose, which is why the timeout is in doubt: it applies
    # the write once it runs again if it had read the request, or drops it as past its deadline.
    # Never twice: nothing was sent again.
    assert record is not None and record.bins["n"] in (0, 1)
    backend.remove(written)
    backend.close()


def test_a_batch_read_the_server_does_not_answer_is_a_timeout_not_damage(aerospike_address: str) -> None:
    with _paused_server(aerospike_address, 200) as (backend, keys):
        with pytest.raises(BackendTimeoutError):
            backend.batch_get(keys)
        with pytest.raises(BackendTimeoutError):
            backend.batch_read([(key, [Read("n")]) for key in keys])
    assert [record is not None for record in backend.batch_get(keys)] == [True, False]
    backend.remove(keys[0])
    backend.close()


def test_batches_sent_once_the_client_dropped_a_paused_servers_node_are_no_successes(
    aerospike_address: str,
) -> None:
    # Paused long enough, the client drops the node; a batch command then comes back failed as a
    # whole (code 1) with a result of 0 for each record, and no bins: it had read as applied writes
    # (a batch enqueue said committed and lost its entries) and as empty reads.
    with _paused_server(aerospike_address, 300) as (backend, keys):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # about 14 s: the client gives the node up
            try:
                backend.get(keys[0])
            except errors.BackendUnavailableError:
                break
            except errors.BackendTimeoutError:
                time.sleep(0.2)
        else:
            pytest.fail("the client kept the paused server's node for 60 s")
        outcomes = backend.operate_each([(key, [Increment("n", 1)], None) for key in keys])
        assert all(isinstance(o, BackendTimeoutError) and o.in_doubt for o in outcomes), outcomes
        with pytest.raises(BackendTimeoutError) as caught:
            backend.operate_and_read(keys[0], [Increment("n", 1)], (keys[1], [Read("n")], None))
        assert caught.value.in_doubt
        with pytest.raises(errors.BackendError):
            backend.batch_get(keys)
        with pytest.raises(errors.BackendError):
            backend.batch_read([(key, [Read("n")]) for key in keys])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the client finds the node again
        try:
            found = backend.batch_get(keys)
            break
        except errors.BackendError:
            time.sleep(0.2)
    assert found[0] is not None and found[0].bins["n"] == 0 and found[1] is None  # nothing was written
    backend.remove(keys[0])
    backend.close()


@pytest.mark.parametrize("applied", [True, False])
def test_a_delivery_whose_owner_write_stays_in_doubt_delivers_nothing_and_loses_nothing(
    store: Store, applied: bool
) -> None:
    backend, shared = _eight_entries_through_faults(store)
    with shared.consumer("node", time_slice=60, timeout=60, poll_interval=0.05) as consumer:
        backend.inject(_owner_write, applied=applied, times=ATTEMPTS)  # every try of the write: unknown
        assert consumer.receive(5) == []  # nothing handed out: applied or not, it comes again
        assert backend.injected == ATTEMPTS
        received = consumer.receive(8, timeout=10)  # once the node has read its owner record again
        assert [m.value for m in received] == list(range(8))
        assert [m.redelivered for m in received] == [applied] * 5 + [False] * 3
        consumer.ack(received)
        assert consumer.receive(8, timeout=0.2) == []


def test_an_ack_is_not_reported_failed_when_only_the_head_sync_after_it_fails(store: Store) -> None:
    queue = store.new_queue(capacity=400, slots_per_record=100)
    queue.enqueue_batch(range(120))
    backend = FaultInjectingBackend(store.backend)
    shared = Queue.open(backend, queue.name)
    with shared.consumer("node", time_slice=60, timeout=60, poll_interval=30) as consumer:
        messages = consumer.receive(110)
        # The ack's owner write applies; the head sync after it (a quarter of the queue acked) then
        # finds its lock commit in doubt, as when the process is paused past the store's timeout.
        backend.inject(lambda call: call.is_commit, applied=True)
        consumer.ack(messages)
        assert backend.injected == 1
        assert ownership_info(shared).acked_offset == 110
        assert queue.info().head_offset == 110  # the commit in doubt had applied
        rest = consumer.receive(10)
        assert [m.value for m in rest] == list(range(110, 120))
        consumer.ack(rest)
        assert ownership_info(shared).acked_offset == 120


def test_a_watcher_whose_ticks_keep_failing_says_so_once_and_once_more_when_they_work(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    backend, shared = _eight_entries_through_faults(store)
    with shared.consumer("node", time_slice=60, timeout=60, poll_interval=0.02) as consumer:
        node = consumer.ownership.node_key("node")
        backend.inject(lambda call: call.key == node, applied=False, times=10)  # ten heartbeats: a store down
        deadline = time.monotonic() + 10
        while backend.injected < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # ticks that work
        assert [m.value for m in consumer.receive(8, timeout=5)] == list(range(8))
    said = [r.getMessage() for r in caplog.records if "ownership check" in r.getMessage()]
    assert backend.injected == 10 and len(said) == 2, said  # not a warning (and a traceback) per poll
    assert "failed (tried again every poll)" in said[0] and "work again" in said[1]
