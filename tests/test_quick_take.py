"""Quick takes: entries read ahead leave in one command, and only where nobody took the lock since."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from large_queue import OutcomeUnknownError, Queue, _quick_take, errors
from large_queue._read_ahead import READ_AHEAD
from large_queue.backends._delegating import Delegating
from large_queue.backends.conditions import IntBin, Param, eq
from large_queue.backends.faults import Call, FaultInjectingBackend
from large_queue.errors import GroupsInUseError
from tests.fix_backends import Store


def _values(entries: list) -> list:  # type: ignore[type-arg]
    return [entry.value for entry in entries]


def _read_ahead(store: Store, count: int = 10) -> Queue:
    """A reserve queue of ``count`` entries whose first was dequeued: the rest are read ahead."""
    queue = store.new_queue(appends="reserve", capacity=64, slots_per_record=32)
    queue.enqueue_batch(list(range(count)))
    assert _values(queue.dequeue_batch(1)) == [0]
    return queue


def _a_holder_dequeues_while_the_lock_is_held(store: Store) -> list[int]:
    """Another handle takes the lock while this one's next entry is read ahead; both dequeue.

    Returns every offset delivered, in the order delivered.
    """
    queue = _read_ahead(store)
    other = Queue.open(store.backend, queue.name)
    grant = other.lock.try_acquire("other")  # and pauses, holding it
    delivered = [entry.offset for entry in queue.quick_takes.take(queue, 1, "mine") or []]
    other.lock.commit(grant, head=grant.head + 1, published=grant.head + 1)  # delivered its head's entry
    delivered.append(grant.head)
    delivered += [entry.offset for entry in queue.dequeue_batch(1)]
    return delivered


def test_a_lone_consumer_takes_what_it_read_ahead_in_one_command_each(store: Store) -> None:
    queue = _read_ahead(store, count=READ_AHEAD)
    sent = store.backend.commands
    assert _values(queue.dequeue_batch(2)) == [1, 2]
    assert _values([queue.dequeue() for _ in range(READ_AHEAD - 3)]) == list(range(3, READ_AHEAD))
    assert store.backend.commands - sent == READ_AHEAD - 2
    assert queue.dequeue() is None
    info = queue.info()
    assert (info.head_offset, info.lock_owner) == (READ_AHEAD, None)
    assert queue.stats().entries_dequeued == READ_AHEAD


def test_a_lock_taken_since_refuses_the_quick_take(store: Store) -> None:
    assert _a_holder_dequeues_while_the_lock_is_held(store) == [1, 2]


def test_without_the_token_in_its_guard_a_quick_take_would_deliver_an_entry_twice(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above fails where the guard is weakened to the head alone."""
    head_only = eq(IntBin("head"), Param("head"))
    monkeypatch.setattr(_quick_take, "_UNTOUCHED", head_only)
    monkeypatch.setattr(_quick_take, "_UNTOUCHED_IN", head_only)
    assert _a_holder_dequeues_while_the_lock_is_held(store)[:2] == [1, 1]


def test_a_quick_take_leaves_entries_another_consumer_took_meanwhile(store: Store) -> None:
    queue = _read_ahead(store, count=20)
    other = Queue.open(store.backend, queue.name)
    assert _values(other.dequeue_batch(3)) == [1, 2, 3]
    assert _values(queue.dequeue_batch(2)) == [4, 5]  # refused quick, then under the lock, from what it kept
    # another acquire came between its own two: it takes turns with another consumer, whose
    # acquires would refuse its quick takes, so the next dequeue holds the lock too
    sent = store.backend.commands
    assert _values(queue.dequeue_batch(1)) == [6]
    assert store.backend.commands - sent == 2
    assert _values(queue.dequeue_batch(1)) == [7]  # its acquire followed its own: quick again
    assert store.backend.commands - sent == 2 + 1


def test_a_quick_take_stops_at_groups_created_since(store: Store) -> None:
    queue = _read_ahead(store)
    Queue.open(store.backend, queue.name).create_group("billing")
    with pytest.raises(GroupsInUseError):
        queue.dequeue()


@pytest.mark.parametrize("how", ["txn_id", "max_age"])
def test_what_needs_the_lock_dequeues_under_it(store: Store, how: str) -> None:
    retention = {"max_age": 3600.0} if how == "max_age" else {}
    queue = store.new_queue(appends="reserve", capacity=64, slots_per_record=32, **retention)
    queue.enqueue_batch(list(range(5)))
    options = {"txn_id": "t-0"} if how == "txn_id" else {}
    assert _values(queue.dequeue_batch(1, **options)) == [0]  # type: ignore[arg-type]
    sent = store.backend.commands
    options = {"txn_id": "t-1"} if how == "txn_id" else {}
    assert _values(queue.dequeue_batch(1, **options)) == [1]  # type: ignore[arg-type]
    assert store.backend.commands - sent == 2  # an acquire and a commit


def test_a_quick_take_in_doubt_is_tried_again_and_an_applied_one_names_its_entries(store: Store) -> None:
    queue = _read_ahead(store)
    backend = FaultInjectingBackend(store.backend)
    faulty = Queue.open(backend, queue.name)
    assert _values(faulty.dequeue_batch(1)) == [1]  # under the lock: it reads ahead
    backend.inject(lambda call: call.is_quick_take, applied=True)
    with pytest.raises(OutcomeUnknownError) as raised:  # tried again, it found the head moved
        faulty.dequeue_batch(2)
    assert (raised.value.stage, _values(raised.value.entries)) == ("the quick take", [2, 3])
    assert faulty.stats().outcomes_unknown == 1
    assert _values(faulty.dequeue_batch(2)) == [4, 5]  # the head read again under the lock: past them
    backend.inject(lambda call: call.is_quick_take, applied=False)
    assert _values(faulty.dequeue_batch(2)) == [6, 7]  # tried again, it applied: the first had not
    assert backend.injected == 2
    assert [call.is_quick_take for call in backend.calls[-2:]] == [True, True]
    assert faulty.dequeue_batch(2)[0].offset == 8


def test_threads_sharing_a_handle_take_each_entry_once(store: Store) -> None:
    queue = store.new_queue(appends="reserve", capacity=400, slots_per_record=50)
    queue.enqueue_batch(list(range(300)))
    taken: list[list[int]] = [[] for _ in range(4)]

    def consume(mine: list[int]) -> None:
        while (entry := queue.dequeue()) is not None:
            mine.append(entry.value)

    threads = [threading.Thread(target=consume, args=(mine,)) for mine in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(value for mine in taken for value in mine) == list(range(300))
    assert all(mine == sorted(mine) for mine in taken)  # each thread's in queue order


def test_a_consumer_behind_the_producers_reads_ahead_across_records_and_takes_without_the_lock(
    store: Store,
) -> None:
    queue = store.new_queue(appends="reserve", capacity=400, slots_per_record=10)
    queue.enqueue_batch(list(range(300)))
    assert _values(queue.dequeue_batch(20)) == list(range(20))  # under the lock
    sent = store.backend.commands
    taken = [value for _ in range(14) for value in _values(queue.dequeue_batch(20))]
    assert taken == list(range(20, 300))
    # each read takes the 20 asked for and up to two records past them (one command, a batch
    # read), and the takes that follow need no read: well under the two commands a take needs
    # when it reads first, the locked dequeue's two or three
    assert store.backend.commands - sent <= 14 * 1.6
    assert queue.dequeue_batch(20) == []
    assert queue.info().head_offset == 300


def test_a_read_ahead_that_finds_fewer_entries_than_asked_for_leaves_them_to_the_lock(store: Store) -> None:
    """A batch dequeue returns every published entry of its window: the locked one judges the rest."""
    queue = store.new_queue(  # native: the test publishes a stored value as it is
        appends="reserve", capacity=400, slots_per_record=10, hole_timeout=60.0, encoding="native"
    )
    queue.enqueue_batch(list(range(40)))
    assert _values(queue.dequeue_batch(20)) == list(range(20))
    queue.enqueue_batch(list(range(40, 45)))
    hole = queue.appender.reserve(1, overwrite=False)  # offset 45: reserved, not published
    queue.enqueue_batch([46, 47])
    assert _values(queue.dequeue_batch(30)) == list(range(20, 45))  # up to the hole, not fewer
    assert queue.dequeue_batch(30) == []
    queue.appender.publish(hole, [45], 0)
    assert _values(queue.dequeue_batch(30)) == [45, 46, 47]


def test_a_quick_take_takes_all_it_asked_for_or_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread of the handle may replace what it read ahead meanwhile: a shorter run takes nothing.

    (A lock holder of the same handle whose lock was broken while it paused keeps what it read
    after another thread took the lock, committed and left its token for quick takes.)
    """
    queue = _read_ahead(store)
    covering = queue.read_ahead.covering
    monkeypatch.setattr(queue.read_ahead, "covering", lambda start, stop: (covering(start, stop) or [])[:1])
    assert queue.quick_takes.take(queue, 5, "t-1") is None
    assert queue.info().head_offset == 1
    monkeypatch.undo()
    assert _values(queue.dequeue_batch(5)) == [1, 2, 3, 4, 5]


def test_consumers_that_take_turns_send_no_quick_takes_to_be_refused(store: Store) -> None:
    queue = store.new_queue(appends="reserve", capacity=200, slots_per_record=50)
    queue.enqueue_batch(list(range(100)))
    backend = FaultInjectingBackend(store.backend)
    first, second = Queue.open(backend, queue.name), Queue.open(backend, queue.name)
    taken = [
        value for _ in range(10) for handle in (first, second) for value in _values(handle.dequeue_batch(5))
    ]
    assert taken == list(range(100))
    # each handle's first quick take is refused (the other acquired meanwhile); after that each sees
    # that another acquire came between its own, and dequeues under the lock
    assert sum(call.is_quick_take for call in backend.calls) <= 2


class QuickTakesTimeOut(Delegating):
    """Every quick take times out before it is sent (``in_doubt=False``: nothing was applied)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.refused = 0

    def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "operate" and Call(method, args[0], tuple(args[1])).is_quick_take:
            self.refused += 1
            raise errors.BackendTimeoutError("injected: not sent", code=9, in_doubt=False)
        return super().relay(method, *args, **kwargs)


def test_a_quick_take_the_store_did_not_answer_nor_apply_falls_back_to_the_lock(store: Store) -> None:
    """A quick take the store did not answer, and did not apply: the locked dequeue reads the head."""
    queue = store.new_queue(appends="reserve", capacity=64, slots_per_record=32)
    queue.enqueue_batch(list(range(10)))
    backend = QuickTakesTimeOut(store.backend)
    faulty = Queue.open(backend, queue.name)
    assert [e.value for e in faulty.dequeue_batch(1)] == [0]  # under the lock: it reads ahead
    assert [e.value for e in faulty.dequeue_batch(2)] == [1, 2]  # the quick take fails: under the lock
    assert backend.refused >= 1
    assert [e.value for e in faulty.dequeue_batch(10)] == list(range(3, 10))


def test_a_consumer_that_caught_up_sends_no_read_ahead_before_its_locked_dequeue(store: Store) -> None:
    """Only a handle whose last dequeue took all it asked for (behind the producers) reads ahead
    without the lock first; one that caught up costs what any handle's locked dequeue costs."""
    queue = store.new_queue(appends="reserve", capacity=64, slots_per_record=32)
    queue.enqueue("a")
    assert [e.value for e in queue.dequeue_batch(5)] == ["a"]  # fewer than asked: it caught up
    fresh = Queue.open(store.backend, queue.name)
    sent = store.backend.commands
    assert fresh.dequeue_batch(5) == []  # a handle with nothing kept and no quick take: under the lock
    locked = store.backend.commands - sent
    sent = store.backend.commands
    assert queue.dequeue_batch(5) == []
    assert store.backend.commands - sent == locked  # no read ahead sent first, for nothing
