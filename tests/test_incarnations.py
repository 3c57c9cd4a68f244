"""A handle is tied to the creation of the queue it opened: once it is created again, nothing gets through."""

from __future__ import annotations

from typing import Any

import pytest

from large_queue import Queue, QueueNotFoundError, _locked
from large_queue import _records as rec
from large_queue._check import check_queue
from large_queue.backends import ListSetRange
from tests.fix_backends import Store

NEW_SHAPES = [
    {"capacity": 400, "slots_per_record": 100},
    {"capacity": 200, "slots_per_record": 100, "encoding": "json"},
    {"capacity": 12, "slots_per_record": 3},
]


def _created_again(store: Store, queue: Queue, **options: Any) -> Queue:
    assert Queue.delete(store.backend, queue.name)
    return Queue.create(store.backend, queue.name, **options)


def _untouched(queue: Queue, values: list[object]) -> None:
    info = queue.info()
    assert (info.tail_offset - info.head_offset, info.lock_owner) == (len(values), None)
    assert [e.value for e in queue.dequeue_batch(10)] == values


@pytest.mark.parametrize("options", NEW_SHAPES, ids=["bigger", "json", "other shape"])
def test_a_stale_handle_writes_and_takes_nothing_from_the_new_queue(store: Store, options: Any) -> None:
    stale = store.new_queue(capacity=200, slots_per_record=100)
    stale.enqueue_batch(range(50))
    new = _created_again(store, stale, **options)
    new.enqueue("new's own")
    for attempt in (
        lambda: stale.enqueue("ghost"),
        lambda: stale.enqueue_batch(["a", "b", "c"]),
        stale.dequeue,
        lambda: stale.dequeue_batch(5),
        lambda: stale.get(0),
        stale.info,
    ):
        with pytest.raises(QueueNotFoundError, match="deleted and created again since this handle opened it"):
            attempt()
    _untouched(new, ["new's own"])


def test_a_holder_paused_across_a_delete_and_create_cannot_write_into_the_new_queue(store: Store) -> None:
    stale = store.new_queue(capacity=6, slots_per_record=3)
    for _ in range(5):
        stale.lock.release(stale.lock.try_acquire("B"))
    grant = stale.lock.try_acquire("A")  # t=0: A holds the old queue's lock with a high token...
    new = _created_again(store, stale, capacity=6, slots_per_record=3)
    new.enqueue("new's own")  # ...whose token is larger than anything the new queue has issued
    with pytest.raises(QueueNotFoundError, match="nothing was written"):
        _locked.fenced_command(stale, grant, 0, [ListSetRange(rec.SLOTS, 0, [[0, "ghost", 0]])], read=None)
    with pytest.raises(QueueNotFoundError):
        stale.lock.commit(grant, tail=grant.tail + 1)
    _untouched(new, ["new's own"])


def test_a_stale_consumer_delivers_nothing_from_the_new_queue(store: Store) -> None:
    stale = store.new_queue(capacity=6, slots_per_record=3)
    consumer = stale.consumer("n1", time_slice=60, timeout=60, poll_interval=30)
    new = _created_again(store, stale, capacity=6, slots_per_record=3)
    new.enqueue("new's own")
    with pytest.raises(QueueNotFoundError, match="created again since this"), consumer:
        consumer.receive(5, timeout=5)
    _untouched(new, ["new's own"])


def test_check_names_a_buffer_record_left_from_another_creation(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.enqueue_batch(range(4))
    left = store.backend.get(queue.keys.buffer(1))
    assert left is not None
    again = _created_again(store, queue, capacity=6, slots_per_record=3)
    store.backend.put(again.keys.buffer(1), left.bins)  # as an interrupted delete would have left it
    report = check_queue(store.backend, again.name)
    assert any("buffer record 1 belongs to another creation of the queue" in p for p in report.problems)


def test_an_owner_whose_queue_is_created_again_delivers_nothing_from_it(store: Store) -> None:
    stale = store.new_queue(capacity=6, slots_per_record=3)
    stale.enqueue_batch(["old-0", "old-1", "old-2"])
    with stale.consumer("n1", time_slice=60, timeout=60, poll_interval=30) as consumer:
        assert [m.value for m in consumer.receive(1)] == ["old-0"]  # owning, the tail already seen
        new = _created_again(store, stale, capacity=6, slots_per_record=3)
        new.enqueue_batch(["new-0", "new-1"])
        with pytest.raises(QueueNotFoundError, match="was deleted while node 'n1' owned it"):
            consumer.receive(1)
    _untouched(new, ["new-0", "new-1"])
