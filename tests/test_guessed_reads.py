"""A dequeue's read of the head's slots sent beside the lock's acquire: two round trips instead of three.

On Aerospike the two go as one batch command. The embedded store has no round
trips to save and sends nothing beside; here it is made to (its two commands
one after the other), so that what the queue does with a guess runs on both stores.
"""

from __future__ import annotations

from typing import Any

import pytest

from large_queue import Queue
from large_queue._dequeue import GUESSES_PAUSED_AFTER_A_MISS
from tests.fix_backends import Store, meanwhile


@pytest.fixture
def guessing(store: Store) -> Store:
    """The store, sending a guessed read beside the acquire (the embedded one made to)."""
    store.backend.reads_beside = True
    return store


def _offsets(entries: list) -> list[int]:  # type: ignore[type-arg]
    return [entry.offset for entry in entries]


def test_a_lone_consumers_locked_dequeues_take_two_round_trips(
    guessing: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = guessing.new_queue(appends="reserve", capacity=30, slots_per_record=5)
    monkeypatch.setattr(queue.quick_takes, "take", lambda *args: None)  # every dequeue holds the lock
    queue.enqueue_batch(list(range(12)))  # a batch spanning records: slots name its last offset
    for n in range(8):
        queue.enqueue(100 + n)
    taken: list[int] = []
    sent = guessing.backend.commands
    while entry := queue.dequeue():
        taken.append(entry.value)
    assert taken == [*range(12), *range(100, 108)]
    if type(guessing.backend).reads_beside:  # one round trip for the acquire and the guessed read
        # 20 dequeues of 2; one read of the batch's last slot, which shows it published; the
        # empty dequeue's acquire and release
        assert guessing.backend.commands - sent == 2 * 20 + 1 + 2


def test_a_guess_another_consumer_made_stale_is_read_again(guessing: Store) -> None:
    queue = guessing.new_queue(appends="reserve", capacity=40, slots_per_record=5)
    other = Queue.open(guessing.backend, queue.name)
    queue.enqueue_batch(list(range(30)))
    taken: list[int] = []
    for turn in range(15):  # two handles take turns: each one's guess is the other's old head
        taken += _offsets((queue if turn % 2 else other).dequeue_batch(2))
    assert taken == list(range(30))


def test_a_slot_the_guess_saw_unpublished_is_read_again_under_the_lock(guessing: Store) -> None:
    """The guessed read sees a reservation not yet published; its publish lands before the lock's read."""
    queue = guessing.new_queue(appends="reserve", capacity=20, slots_per_record=5, encoding="native")  # as is
    queue.enqueue("a")
    assert queue.dequeue().value == "a"  # type: ignore[union-attr]
    first, now_ms = queue.appender.reserve_stamped(1, overwrite=False)  # reserved, not yet published
    backend = guessing.backend
    operate_and_read = backend.operate_and_read

    def published_meanwhile(*args: object, **kwargs: object) -> object:
        backend.operate_and_read = operate_and_read  # type: ignore[method-assign]
        answer = operate_and_read(*args, **kwargs)  # type: ignore[arg-type]
        queue.appender.publish(first, ["b"], now_ms)
        return answer

    backend.operate_and_read = published_meanwhile  # type: ignore[method-assign]
    entry = queue.dequeue()
    assert backend.operate_and_read == operate_and_read, "the guessed read was not sent"
    assert entry is not None and (entry.offset, entry.value) == (first, "b")


def test_a_guessed_batch_running_into_the_next_record_takes_all_it_may(guessing: Store) -> None:
    queue = guessing.new_queue(appends="reserve", capacity=20, slots_per_record=5)
    for n in range(10):
        queue.enqueue(n)
    fresh = Queue.open(guessing.backend, queue.name)  # no read-ahead: the guess covers the head's record
    assert [e.value for e in fresh.dequeue_batch(6)] == list(range(6))
    assert [e.value for e in fresh.dequeue_batch(6)] == list(range(6, 10))


def test_a_guessing_dequeue_waits_out_a_busy_lock(guessing: Store) -> None:
    queue = guessing.new_queue(appends="reserve", capacity=20, slots_per_record=5)
    queue.enqueue("a")
    other = Queue.open(guessing.backend, queue.name)
    grant = other.lock.acquire("holder")
    with meanwhile(0.3, other.lock.release, grant):
        entry = queue.dequeue(timeout=5)
    assert entry is not None and entry.value == "a"


def _guesses_sent(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each guessed read the store is sent."""
    sent: list[int] = []
    operate_and_read = store.backend.operate_and_read

    def counted(*args: Any, **kwargs: Any) -> Any:
        sent.append(1)
        return operate_and_read(*args, **kwargs)

    monkeypatch.setattr(store.backend, "operate_and_read", counted)
    return sent


def test_after_a_wrong_guess_the_next_16_dequeues_send_none(
    guessing: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = guessing.new_queue(appends="reserve", capacity=60, slots_per_record=5)
    monkeypatch.setattr(queue.quick_takes, "take", lambda *args: None)  # every dequeue holds the lock
    other = Queue.open(guessing.backend, queue.name)
    queue.enqueue_batch(list(range(40)))
    assert _offsets([queue.dequeue()]) == [0]  # its next guess: head 1
    assert _offsets(other.dequeue_batch(3)) == [1, 2, 3]  # another consumer moved the head to 4
    sent = _guesses_sent(guessing, monkeypatch)
    assert _offsets([queue.dequeue()]) == [4]  # its guess of head 1 was wrong: read again under the lock
    assert len(sent) == 1
    taken = [queue.dequeue() for _ in range(GUESSES_PAUSED_AFTER_A_MISS)]
    assert _offsets(taken) == list(range(5, 5 + GUESSES_PAUSED_AFTER_A_MISS))
    assert len(sent) == 1  # a consumer that shares the queue guesses wrong often: it stops for a while
    for _ in range(5):  # and guesses again: at the latest past the slots its locked reads read ahead
        queue.dequeue()
    assert len(sent) >= 2


def test_a_dequeue_that_found_nothing_sends_no_guess_next(
    guessing: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = guessing.new_queue(appends="reserve", capacity=60, slots_per_record=5)
    monkeypatch.setattr(queue.quick_takes, "take", lambda *args: None)
    queue.enqueue("a")
    assert queue.dequeue() is not None
    sent = _guesses_sent(guessing, monkeypatch)
    assert queue.dequeue() is None  # guessed the head's slot: empty
    assert len(sent) == 1
    assert queue.dequeue() is None  # an empty queue: no guess until entries come
    assert len(sent) == 1
    queue.enqueue("b")
    entry = queue.dequeue()
    assert entry is not None and entry.value == "b"
    assert len(sent) == 1  # the first dequeue after entries came took the lock without a guess
    queue.enqueue("c")
    queue.dequeue()
    assert len(sent) == 2
