"""Model-based tests: the queue against a ``collections.deque``, and interleaved clients.

``SequentialMachine`` runs random operations (single and batch, overwrite
mode, offset reads) on tiny queues so that wrap-around, full and empty happen
all the time, and compares every result with a deque.

``InterleavingMachine`` splits enqueue and dequeue into their real steps
(lock, buffer command, commit) for three clients and lets the store's clock
jump past the lock TTL between any two steps. Its oracle: a commit succeeds
exactly when the committer holds the newest token and nobody has released
it since; the committed contents always equal the model. On Aerospike the
clock cannot jump: time passes for real, on a shorter lock TTL, and a lock
whose silence is within a few milliseconds of the TTL may go either way.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from large_queue import InvalidArgumentError, LockLostError, Queue, QueueFullError, _dequeue, _locked
from large_queue.lock import LockGrant, _Busy
from tests.fix_backends import Store


class _Model:
    """The committed queue as a deque of (offset, value)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: deque[tuple[int, Any]] = deque()
        self.head = 0
        self.tail = 0

    def append(self, values: list[Any], overwrite: bool) -> None:
        for value in values:
            self.entries.append((self.tail, value))
            self.tail += 1
        while overwrite and self.tail - self.head > self.capacity:
            self.entries.popleft()
            self.head += 1

    def take(self, count: int) -> list[tuple[int, Any]]:
        taken = [self.entries.popleft() for _ in range(min(count, len(self.entries)))]
        self.head += len(taken)
        return taken

    def check(self, queue: Queue) -> None:
        info = queue.info()
        assert (info.head_offset, info.tail_offset) == (self.head, self.tail)
        assert [(e.offset, e.value) for e in map(queue.get, range(self.head, self.tail)) if e] == list(
            self.entries
        )


class SequentialMachine(RuleBasedStateMachine):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.counter = 0

    @initialize(record_count=st.integers(1, 4), slots=st.integers(1, 4))
    def create(self, record_count: int, slots: int) -> None:
        self.queue = self.store.new_queue(capacity=record_count * slots, slots_per_record=slots)
        self.model = _Model(self.queue.capacity)

    def _values(self, count: int) -> list[Any]:
        self.counter += count
        return [{"v": n, "pad": "x" * (n % 3)} for n in range(self.counter - count, self.counter)]

    @rule(count=st.integers(1, 6), overwrite=st.booleans(), batch=st.booleans())
    def enqueue(self, count: int, overwrite: bool, batch: bool) -> None:
        values = self._values(count if batch else 1)
        free = self.model.capacity - (self.model.tail - self.model.head)
        if len(values) > self.model.capacity:
            with pytest.raises(InvalidArgumentError):
                self.queue.enqueue_batch(values, overwrite_if_full=overwrite)
        elif len(values) > free and not overwrite:
            with pytest.raises(QueueFullError):
                self.queue.enqueue_batch(values, overwrite_if_full=overwrite)
        else:
            offsets = (
                self.queue.enqueue_batch(values, overwrite_if_full=overwrite)
                if batch
                else range(self.queue.enqueue(values[0], overwrite_if_full=overwrite), self.model.tail + 1)
            )
            assert offsets == range(self.model.tail, self.model.tail + len(values))
            self.model.append(values, overwrite)

    @rule(count=st.integers(1, 8), batch=st.booleans())
    def dequeue(self, count: int, batch: bool) -> None:
        if batch:
            got = [(e.offset, e.value) for e in self.queue.dequeue_batch(count)]
            assert got == self.model.take(count)
        else:
            entry = self.queue.dequeue()
            expected = self.model.take(1)
            assert ([(entry.offset, entry.value)] if entry else []) == expected

    @rule(delta=st.integers(-3, 15))
    def read_offset(self, delta: int) -> None:
        offset = max(0, self.model.head + delta)
        entry = self.queue.get(offset)
        expected = dict(self.model.entries).get(offset)
        assert (entry.value if entry else None) == expected

    @invariant()
    def matches_model(self) -> None:
        if hasattr(self, "model"):
            self.model.check(self.queue)
            assert self.queue.info().lock_owner is None


def test_queue_matches_a_deque(store: Store) -> None:
    scale = {"max_examples": 30, "stateful_step_count": 40} if store.remote else {}
    run_state_machine_as_test(lambda: SequentialMachine(store), settings=settings(**scale))


@dataclass
class _Pending:
    kind: str
    grant: LockGrant
    values: list[Any] = field(default_factory=list)
    count: int = 0
    written: bool = False
    new_head: int = 0
    new_tail: int = 0
    taken: list[tuple[int, Any]] = field(default_factory=list)


CLIENTS = 3
TTL_SECONDS = 1.0
# on a real clock: time runs at this fraction of the embedded runs' lock TTL and waits,
# and a silence this close to the TTL (client and server disagree by a round trip) may go either way
REAL_CLOCK_SCALE = 0.25
REAL_CLOCK_MARGIN_NS = 40_000_000


class InterleavingMachine(RuleBasedStateMachine):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.clock = store.clock or time.monotonic_ns
        self.scale = 1.0 if store.clock is not None else REAL_CLOCK_SCALE
        self.margin_ns = 0 if store.clock is not None else REAL_CLOCK_MARGIN_NS
        self.pending: dict[int, _Pending] = {}
        self.holder: Any = None  # token of the client holding the lock, None when released
        self.metadata_written_ns = 0
        self.counter = 0

    @initialize(record_count=st.integers(2, 3), slots=st.integers(1, 3))
    def create(self, record_count: int, slots: int) -> None:
        self.queue = self.store.new_queue(  # native: the clients write stored values as they are
            capacity=record_count * slots,
            slots_per_record=slots,
            lock_ttl=TTL_SECONDS * self.scale,
            encoding="native",
        )
        self.model = _Model(self.queue.capacity)

    def _lock_is_free(self) -> bool | None:
        """True or False; None when the silence is too close to the TTL to tell on a real clock."""
        if self.holder is None:
            return True
        silent_ns = self.clock() - self.metadata_written_ns
        ttl_ns = TTL_SECONDS * self.scale * 1e9
        if abs(silent_ns - ttl_ns) <= self.margin_ns:
            return None
        return silent_ns // 1_000_000 > ttl_ns // 1_000_000

    def _metadata_written(self) -> None:
        self.metadata_written_ns = self.clock()

    @rule(data=st.data())
    def client_step(self, data: st.DataObject) -> None:
        """One step of one client, drawn among the steps possible now."""
        actions = [("lock", c) for c in range(CLIENTS) if c not in self.pending]
        actions += [("commit" if p.written else "buffer", c) for c, p in self.pending.items()]
        action, client = data.draw(st.sampled_from(actions))
        if action == "lock":
            self.lock(
                client, data.draw(st.sampled_from(["enqueue", "dequeue"])), data.draw(st.integers(1, 3))
            )
        elif action == "buffer":
            self.buffer_step(client)
        else:
            self._finish(client, commit=True)

    def lock(self, client: int, kind: str, count: int) -> None:
        expected_free = self._lock_is_free()
        try:
            grant = self.queue.lock.try_acquire(f"client-{client}")
        except _Busy:
            assert expected_free is not True, "the lock was refused although it was free or expired"
            return
        assert expected_free is not False, "the lock was granted while another holder still held it"
        if self.holder is not None:
            event("expired lock broken")
        assert (grant.head, grant.tail) == (self.model.head, self.model.tail)
        self.holder = grant.token
        self._metadata_written()
        self.counter += count
        values = [f"c{client}-{n}" for n in range(self.counter - count, self.counter)]
        self.pending[client] = _Pending(kind, grant, values=values, count=count)

    def buffer_step(self, client: int) -> None:
        pending = self.pending[client]
        current = pending.grant.token == self.holder
        try:
            if pending.kind == "enqueue":
                grant, pending.new_head, pending.new_tail = _locked.write_entries(
                    self.queue, pending.grant, pending.values, overwrite_if_full=False
                )
            else:
                grant, entries, skipped, pending.new_head = _dequeue.read_entries(
                    self.queue, pending.grant, pending.count
                )
                assert skipped == 0 or not current, "the current holder found a slot that lost its entry"
                pending.taken = [(e.offset, e.value) for e in entries]
                pending.new_tail = pending.grant.tail
        except LockLostError:
            assert not current, "fencing refused the current holder"
            event("stale buffer command refused")
            del self.pending[client]
            return
        except QueueFullError:
            self._finish(client, commit=False)
            return
        if not current:
            event("stale buffer command applied (fenced record untouched)")
        if grant.acquired_at != pending.grant.acquired_at:  # renewed: the lock's clock restarted
            self._metadata_written()
        pending.grant = grant
        pending.written = True

    def _finish(self, client: int, *, commit: bool) -> None:
        pending = self.pending.pop(client)
        current = pending.grant.token == self.holder
        try:
            if commit:
                self.queue.lock.commit(pending.grant, head=pending.new_head, tail=pending.new_tail)
            else:
                self.queue.lock.release(pending.grant)
        except LockLostError:
            assert not current, "the current holder's commit was refused"
            event("stale commit refused")
            return
        assert current, "a holder whose lock was broken committed"
        self.holder = None
        self._metadata_written()
        if commit and pending.kind == "enqueue":
            self.model.append(pending.values, overwrite=False)
        elif commit:
            assert pending.taken == self.model.take(pending.count)

    @rule(seconds=st.sampled_from([0.1, 0.6, 1.5]))
    def time_passes(self, seconds: float) -> None:
        self.store.advance(seconds * self.scale)

    @invariant()
    def committed_contents_match_model(self) -> None:
        if hasattr(self, "model"):
            self.model.check(self.queue)


def test_interleaved_clients_with_broken_locks(store: Store) -> None:
    scale = {"max_examples": 20, "stateful_step_count": 40} if store.remote else {}
    run_state_machine_as_test(lambda: InterleavingMachine(store), settings=settings(**scale))
