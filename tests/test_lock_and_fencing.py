"""Lock breaking, stale holders and fencing, on every backend.

Each test plays a timeline: A holds the lock, A pauses past the TTL (the
store's clock moves, or the test waits on Aerospike), B breaks the lock, and
A comes back.
"""

from __future__ import annotations

import time

import pytest

from large_queue import LockLostError, LockNotAcquiredError, LockPolicy, Queue, _locked
from large_queue import _records as rec
from large_queue.backends import ListSetRange
from large_queue.fencing import FencingToken
from tests.fix_backends import Store

TTL = 0.3
SHORT_WAIT = LockPolicy(acquire_timeout=0.05, initial_wait=0.001, max_wait=0.01)


def test_held_lock_blocks_until_it_expires(store: Store) -> None:
    queue = store.new_queue(appends="lock", lock_ttl=TTL, lock_policy=SHORT_WAIT)
    holder = queue.lock.try_acquire("A")
    assert queue.info().lock_owner == "A"
    with pytest.raises(LockNotAcquiredError, match="another holder"):
        queue.enqueue("blocked")
    store.advance(TTL * 2)
    assert queue.enqueue("after expiry") == 0  # B broke A's expired lock
    with pytest.raises(LockLostError, match="nothing was committed"):
        queue.lock.commit(holder, tail=holder.tail + 1)
    assert queue.info().tail_offset == 1


def test_renewal_keeps_the_lock(store: Store) -> None:
    queue = store.new_queue(appends="lock", lock_ttl=TTL, lock_policy=SHORT_WAIT)
    holder = queue.lock.try_acquire("A")
    store.advance(TTL * 0.7)
    holder = queue.lock.renew(holder)
    store.advance(TTL * 0.7)  # 1.4 TTL since acquire, 0.7 since renewal
    with pytest.raises(LockNotAcquiredError):
        queue.enqueue("still blocked")
    queue.lock.release(holder)
    assert queue.enqueue("now") == 0


def test_stale_writer_is_fenced_and_cannot_commit(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=6, slots_per_record=3, lock_ttl=TTL)
    # t=0: A locks and reads tail=0, then pauses.
    stale = queue.lock.try_acquire("A")
    store.advance(TTL * 2)
    # t=2 TTL: B breaks the lock and enqueues at offset 0 (buffer record 0).
    assert queue.enqueue("B's entry", txn_id="B") == 0
    # A resumes (it had decided its lock needed no renewal before it paused):
    # its write to record 0 carries an older token and is refused.
    with pytest.raises(LockLostError, match="later holder"):
        _locked.fenced_command(
            queue, stale, 0, [ListSetRange(rec.SLOTS, 0, [[0, "A's entry", 0]])], read=None
        )
    with pytest.raises(LockLostError):
        queue.lock.commit(stale, tail=1)
    assert queue.get(0).value == "B's entry"  # type: ignore[union-attr]
    assert queue.dequeue().value == "B's entry"  # type: ignore[union-attr]
    assert queue.dequeue() is None


def test_stale_dequeuer_cannot_deliver_twice_or_erase_live_entries(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, lock_ttl=TTL)
    queue.enqueue_batch(["e0", "e1", "e2"])
    stale = queue.lock.try_acquire("A")  # A would dequeue e0, then pauses
    store.advance(TTL * 2)
    assert queue.dequeue(txn_id="B").value == "e0"  # type: ignore[union-attr]
    with pytest.raises(LockLostError):
        queue.lock.commit(stale, head=stale.head + 1)  # A's dequeue of e0 never commits
    assert [e.value for e in queue.dequeue_batch(5)] == ["e1", "e2"]


def test_stale_writer_on_an_untouched_record_stays_invisible(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=6, slots_per_record=3, lock_ttl=TTL)
    stale = queue.lock.try_acquire("A")
    store.advance(TTL * 2)
    queue.enqueue("B", txn_id="B")  # record 0
    # A writes record 1 (nobody newer touched it): allowed, but beyond the tail.
    _locked.fenced_command(queue, stale, 1, [ListSetRange(rec.SLOTS, 0, [[3, "ghost", 0]])], read=None)
    assert queue.get(3) is None
    queue.enqueue_batch(["c", "d", "e"])  # offsets 1..3: record 1 slot 0 is rewritten
    assert [e.value for e in queue.dequeue_batch(10)] == ["B", "c", "d", "e"]


def test_fencing_counter_wraps_into_a_new_epoch(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=6, slots_per_record=3, lock_ttl=TTL)
    wrapping = Queue.open(store.backend, queue.name, fence_counter_limit=3)
    tokens = []
    for value in range(5):
        grant = wrapping.lock.try_acquire("W")
        tokens.append(grant.token)
        wrapping.lock.release(grant)
        wrapping.enqueue(value)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert tokens[0] == FencingToken(0, 1) and tokens[-1].epoch >= 1
    # A holder from the old epoch with a huge counter is older than every new token.
    stale = queue.lock.try_acquire("A")
    store.advance(TTL * 2)
    old_epoch = type(stale)(
        txn_id="A", token=FencingToken(0, 2), head=stale.head, tail=stale.tail, acquired_at=stale.acquired_at
    )
    with pytest.raises(LockLostError):
        _locked.fenced_command(queue, old_epoch, 0, [ListSetRange(rec.SLOTS, 0, [[0, "old", 0]])], read=None)
    assert [e.value for e in wrapping.dequeue_batch(10)] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("appends", ["lock", "reserve"])
def test_a_waiting_dequeue_waits_on_a_held_lock_until_its_own_timeout_not_longer(
    store: Store, appends: str
) -> None:
    # a consumer died holding the lock, which lasts longer than the waiting dequeue's timeout
    queue = store.new_queue(appends=appends, lock_ttl=30.0, lock_policy=LockPolicy(acquire_timeout=20.0))
    queue.enqueue("waiting")
    queue.lock.try_acquire("dead consumer")
    began = time.monotonic()
    assert queue.dequeue(timeout=0.3) is None
    assert time.monotonic() - began < 10  # the acquire timeout (20 s) did not hold it up
    assert queue.dequeue_batch(5, timeout=0.1) == []
    assert queue.stats().dequeue_calls == 2


def test_a_txns_earlier_attempt_is_fenced_off_by_its_retakes_token(store: Store) -> None:
    """A retry of a txn takes its lock back and its earlier attempt is
    fenced off by the new token. A paused first attempt (T, token 1) comes back after B dequeued
    the head and T's retry took the lock back: its commit (head 1, receipt "dequeued 0") must be
    refused, or entry 0 is delivered twice (to B, and to T through its receipt)."""
    queue = store.new_queue(appends="lock", lock_ttl=TTL, lock_policy=SHORT_WAIT)
    queue.enqueue_batch(["a", "b"])
    first = queue.lock.try_acquire("T", receipt=True)  # the first attempt: head 0, then it pauses
    store.advance(TTL * 2)
    assert queue.dequeue().value == "a"  # B breaks the expired lock and takes offset 0
    retry = queue.lock.try_acquire("T", receipt=True)  # the retry: lock free, taken, head 1
    assert retry.head == 1 and retry.token > first.token
    put = queue.receipts.committed("T", "d", range(0, 1))
    with pytest.raises(LockLostError):
        queue.lock.commit(first, head=first.head + 1, receipt=put)  # the paused attempt resumes
    queue.lock.commit(retry, head=retry.head + 1, receipt=queue.receipts.committed("T", "d", range(1, 2)))
    assert queue.outcome("T").receipt.offsets == range(1, 2)


def test_a_txn_retaking_its_own_held_lock_fences_the_first_attempt(store: Store) -> None:
    """T holds the lock (token k); T's retry takes it back (token k+1);
    a commit with the first grant is refused."""
    queue = store.new_queue(appends="lock", lock_ttl=TTL, lock_policy=SHORT_WAIT)
    queue.enqueue("a")
    first = queue.lock.try_acquire("T", receipt=True)
    retry = queue.lock.try_acquire("T", receipt=True)
    assert retry.token > first.token
    with pytest.raises(LockLostError):
        queue.lock.commit(first, head=first.head + 1)
    assert queue.info().head_offset == 0
    queue.lock.release(retry)


def test_an_interrupt_just_after_the_acquire_ends_its_group_and_the_lock_expires(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import large_queue.lock

    queue = store.new_queue(appends="lock", lock_ttl=TTL)
    queue.enqueue_batch(["a", "b"])
    real = large_queue.lock.ReleasingOnError

    def interrupted(*args: object) -> object:
        monkeypatch.setattr(large_queue.lock, "ReleasingOnError", real)
        raise KeyboardInterrupt  # as a Ctrl-C landing between the acquire and its guard

    monkeypatch.setattr(large_queue.lock, "ReleasingOnError", interrupted)
    with pytest.raises(KeyboardInterrupt):
        queue.dequeue()
    assert getattr(store.backend, "_group", None) is None  # no group of commands left open
    store.advance(TTL * 2)  # the lock it took expires
    assert [e.value for e in Queue.open(store.backend, queue.name).dequeue_batch(5)] == ["a", "b"]
