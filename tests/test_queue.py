"""Queue behaviour on every backend: FIFO, edges, overwrite, offsets, batches, costs."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from large_queue import (
    InvalidArgumentError,
    Queue,
    QueueExistsError,
    QueueFullError,
    QueueNotFoundError,
)
from large_queue import _records as rec
from large_queue._check import check_queue
from large_queue.backends import Backend, ListSet, ListSetRange, WriteMode
from large_queue.backends._delegating import Delegating
from large_queue.backends.faults import FaultInjectingBackend
from large_queue.errors import BackendTimeoutError
from tests.fix_backends import SECOND_NAMESPACE, AfterFirstRead, Store


def drain(queue: Queue) -> list[int]:
    values = []
    while (entry := queue.dequeue()) is not None:
        values.append(entry.value)
    return values


def test_fifo_across_records_and_laps(store: Store) -> None:
    queue = store.new_queue(capacity=10, slots_per_record=3)  # 4 records, capacity 12
    assert queue.capacity == 12
    expected: list[int] = []
    produced = 0
    for _lap in range(5):  # several laps around the ring, offsets keep growing
        for _ in range(7):
            assert queue.enqueue(produced) == produced
            expected.append(produced)
            produced += 1
        got = [queue.dequeue() for _ in range(7)]
        assert [e.value for e in got if e] == expected[:7]
        assert [e.offset for e in got if e] == expected[:7]
        expected = expected[7:]
    info = queue.info()
    assert (info.head_offset, info.tail_offset, info.size) == (35, 35, 0)


def test_empty_and_full_edges(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    assert queue.dequeue() is None
    assert queue.dequeue_batch(5) == []
    offsets = queue.enqueue_batch(range(6))
    assert offsets == range(0, 6)
    with pytest.raises(QueueFullError, match="0 free slots"):
        queue.enqueue("one too many")
    with pytest.raises(QueueFullError):
        queue.enqueue_batch(["a", "b"])
    assert queue.info().tail_offset == 6  # a refused enqueue changes nothing
    assert queue.dequeue().value == 0  # type: ignore[union-attr]
    assert queue.enqueue(6) == 6
    assert drain(queue) == [1, 2, 3, 4, 5, 6]
    assert queue.info().lock_owner is None


@pytest.mark.parametrize("appends", ["reserve", "lock"])
def test_overwrite_if_full_drops_oldest(store: Store, appends: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="large_queue")
    queue = store.new_queue(capacity=6, slots_per_record=3, appends=appends)
    queue.enqueue_batch(range(6))
    assert queue.enqueue(6, overwrite_if_full=True) == 6
    assert queue.enqueue_batch([7, 8], overwrite_if_full=True) == range(7, 9)
    info = queue.info()
    assert (info.head_offset, info.tail_offset) == (3, 9)
    assert queue.get(2) is None  # dropped
    # the producer that dropped entries counts and logs them: nobody else may ever see the loss
    assert queue.stats().entries_overwritten == 3
    dropped = [r.getMessage() for r in caplog.records if "overwrite_if_full dropped" in r.getMessage()]
    assert len(dropped) == 2 and "1 entries (offsets 0..0)" in dropped[0] and "(offsets 1..2)" in dropped[1]
    assert drain(queue) == [3, 4, 5, 6, 7, 8]
    queue.enqueue(9, overwrite_if_full=True)  # there is room: nothing dropped
    assert queue.stats().entries_overwritten == 3


def test_offset_reads_live_dequeued_and_overwritten(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.enqueue_batch(["a", "b", "c"])
    entry = queue.get(1)
    assert entry is not None and (entry.offset, entry.value) == (1, "b")
    assert entry.enqueued_at_ms > 0
    assert queue.get(3) is None  # not yet written
    queue.dequeue()
    assert queue.get(0) is None  # dequeued
    queue.enqueue_batch(["d", "e", "f", "g"])
    queue.enqueue_batch(["h", "i"], overwrite_if_full=True)  # offsets 7, 8 reuse the slots of 1, 2
    assert queue.get(1) is None and queue.get(2) is None
    assert queue.get(8).value == "i"  # type: ignore[union-attr]
    with pytest.raises(InvalidArgumentError):
        queue.get(-1)


def test_batches_span_records_and_cost_one_command_per_record(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=30, slots_per_record=4)  # 8 records
    queue.enqueue_batch(range(3))
    before = store.backend.commands
    offsets = queue.enqueue_batch(range(3, 13))  # offsets 3..12: records 0, 1, 2, 3
    assert offsets == range(3, 13)
    assert store.backend.commands - before == 2 + 4
    before = store.backend.commands
    taken = queue.dequeue_batch(11)  # offsets 0..10: records 0, 1, 2
    assert [e.value for e in taken] == list(range(11))
    assert store.backend.commands - before == 2 + 3
    assert [e.value for e in queue.dequeue_batch(100)] == [11, 12]


def test_single_operations_cost_three_round_trips(store: Store) -> None:
    queue = store.new_queue(appends="lock")
    before = store.backend.commands
    queue.enqueue("x")
    assert store.backend.commands - before == 3
    before = store.backend.commands
    queue.dequeue()
    assert store.backend.commands - before == 3
    before = store.backend.commands
    assert queue.dequeue() is None
    assert store.backend.commands - before == 2  # lock, release


def test_batch_that_wraps_into_its_first_record(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.enqueue_batch(range(4))
    queue.dequeue_batch(4)
    queue.enqueue_batch(range(100, 106))  # offsets 4..9: records 1, 0, 1 (wraps into record 1)
    assert [e.value for e in queue.dequeue_batch(6)] == list(range(100, 106))


def test_dequeued_slots_are_erased(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=6, slots_per_record=3, encoding="native")  # stored as is
    queue.enqueue_batch(["secret-0", "secret-1", "secret-2", "x"])
    queue.dequeue()
    queue.dequeue()  # erases offset 0 (below the head it read)
    queue.dequeue()  # erases offset 1
    slots = store.backend.get(queue.keys.buffer(0)).bins[rec.SLOTS]  # type: ignore[union-attr]
    assert slots[0] is None and slots[1] is None
    assert slots[2][1] == "secret-2"  # delivered by the last dequeue; erased by the next one here
    queue.enqueue_batch(["y", "z"])
    queue.dequeue()
    queue.dequeue()  # reads record 1 only; record 0 keeps its last slot until reused
    queue.enqueue_batch(["p", "q", "r"])  # offsets 6, 7, 8 reuse record 0
    slots = store.backend.get(queue.keys.buffer(0)).bins[rec.SLOTS]  # type: ignore[union-attr]
    assert [s[1] for s in slots] == ["p", "q", "r"]


def test_each_dequeue_erases_only_the_slots_it_newly_passes(store: Store) -> None:
    faulty = FaultInjectingBackend(store.backend)
    created = store.new_queue(appends="lock", capacity=20, slots_per_record=10, encoding="native")  # as is
    queue = Queue.open(faulty, created.name)
    queue.enqueue_batch(range(20))
    erased_per_dequeue = []
    for _ in range(9):
        faulty.calls.clear()
        queue.dequeue()
        (buffer_command,) = [call for call in faulty.calls if call.is_buffer]
        ranges = [op for op in buffer_command.operations if isinstance(op, ListSetRange)]
        singles = [op for op in buffer_command.operations if isinstance(op, ListSet)]
        erased_per_dequeue.append(sum(len(op.values) for op in ranges) + len(singles))
        assert all(value is None for op in ranges for value in op.values)
        assert all(op.value is None for op in singles)
    assert erased_per_dequeue == [0] + [1] * 8  # each erases its predecessor's slot, once
    queue.dequeue_batch(5)  # offsets 9..13: erases slot 8 of record 0, nothing it delivers
    slots = store.backend.get(queue.keys.buffer(0)).bins[rec.SLOTS]  # type: ignore[union-attr]
    assert slots[:9] == [None] * 9 and slots[9][1] == 9


def test_create_open_delete(store: Store) -> None:
    queue = store.new_queue(capacity=10, slots_per_record=5)
    with pytest.raises(QueueExistsError, match="already exists"):
        Queue.create(store.backend, queue.name, capacity=10)
    reopened = Queue.open(store.backend, queue.name)
    reopened.enqueue({"k": [1, 2.5, None, True, b"\x00\xff"]})
    assert queue.dequeue().value == {"k": [1, 2.5, None, True, b"\x00\xff"]}  # type: ignore[union-attr]
    info = reopened.info()
    assert (info.capacity, info.record_count, info.slots_per_record) == (10, 2, 5)
    assert Queue.delete(store.backend, queue.name) is True
    assert Queue.delete(store.backend, queue.name) is False
    assert store.backend.get(queue.keys.buffer(0)) is None
    with pytest.raises(QueueNotFoundError):
        Queue.open(store.backend, queue.name)
    with pytest.raises(QueueNotFoundError):
        queue.enqueue(1)


def test_metadata_and_buffers_in_different_namespaces(store: Store) -> None:
    queue = store.new_queue(namespace="test", buffer_namespace=SECOND_NAMESPACE)
    queue.enqueue_batch([1, 2, 3, 4])
    assert (
        store.backend.get(
            rec.QueueKeys(
                name=queue.name, metadata_namespace=SECOND_NAMESPACE, buffer_namespace=SECOND_NAMESPACE
            ).buffer(1)
        )
        is not None
    )
    assert [e.value for e in queue.dequeue_batch(4)] == [1, 2, 3, 4]
    assert queue.info().buffer_namespace == SECOND_NAMESPACE


def test_a_capacity_beyond_what_a_queue_may_have_is_refused_before_writing(store: Store) -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"needs 10,995,116,278 buffer records.* at most 1,000,000"
    ):
        Queue.create(store.backend, "t-huge", capacity=2**40, slots_per_record=100)
    with pytest.raises(QueueNotFoundError):
        Queue.open(store.backend, "t-huge")


class _InterruptedAt(Delegating):
    """A store whose call number ``at`` of ``method`` is interrupted (Ctrl-C) before it is sent."""

    def __init__(self, inner: Backend, method: str, at: int) -> None:
        super().__init__(inner)
        self.calls = 0
        self.method = method
        self.at = at

    def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == self.method:
            self.calls += 1
            if self.calls == self.at:
                raise KeyboardInterrupt
        return super().relay(method, *args, **kwargs)


def test_an_interrupted_delete_is_finished_by_the_next(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)  # 4 buffer records
    queue.enqueue_batch(range(5))
    interrupted = _InterruptedAt(store.backend, "remove", at=3)
    with pytest.raises(KeyboardInterrupt):
        Queue.delete(interrupted, queue.name)  # two buffer records removed, two left
    assert store.backend.get(queue.keys.buffer(3)) is not None
    with pytest.raises(QueueNotFoundError, match="is being deleted"):  # gone for opens
        Queue.open(store.backend, queue.name)
    with pytest.raises(QueueNotFoundError):  # and for handles
        queue.enqueue(5)
    with pytest.raises(QueueExistsError, match="delete it again"):
        Queue.create(store.backend, queue.name, capacity=3)
    assert queue.name in Queue.names(store.backend)  # still listed: something to delete
    assert Queue.delete(store.backend, queue.name)
    assert [store.backend.get(queue.keys.buffer(i)) for i in range(4)] == [None] * 4
    assert store.backend.get(queue.keys.metadata) is None
    assert not Queue.delete(store.backend, queue.name)


def test_an_interrupted_create_is_deleted_in_proportion_to_what_it_made(store: Store) -> None:
    queue = store.new_queue(capacity=9, slots_per_record=3)
    # What a create killed after its first three buffer records leaves: a metadata record
    # that is not ready, for a million records.
    store.backend.put(
        queue.keys.metadata,
        {rec.READY: 0, rec.RECORD_COUNT: 1_000_000, rec.CREATED: 0},
        mode=WriteMode.UPDATE_ONLY,
    )
    before = store.backend.commands
    assert Queue.delete(store.backend, queue.name)
    assert store.backend.commands - before < 1100
    assert [store.backend.get(queue.keys.buffer(i)) for i in range(3)] == [None] * 3


def test_a_create_interrupted_by_ctrl_c_removes_what_it_wrote(store: Store) -> None:
    name = store.new_queue().name + "-interrupted"
    with pytest.raises(KeyboardInterrupt):
        Queue.create(_InterruptedAt(store.backend, "put", at=3), name, capacity=12, slots_per_record=3)
    keys = rec.QueueKeys(name=name, metadata_namespace="test", buffer_namespace="test")
    assert store.backend.get(keys.metadata) is None
    assert [store.backend.get(keys.buffer(i)) for i in range(4)] == [None] * 4
    Queue.create(store.backend, name, capacity=12, slots_per_record=3)  # the name is free at once
    assert Queue.delete(store.backend, name)


def test_a_failed_create_removes_what_it_wrote(store: Store) -> None:
    faulty = FaultInjectingBackend(store.backend)
    faulty.inject(lambda call: call.key.user_key == f"{rec.BUFFER_KEY_PREFIX}2", applied=False)
    name = store.new_queue().name + "-failed"
    with pytest.raises(BackendTimeoutError):
        Queue.create(faulty, name, capacity=12, slots_per_record=3)
    with pytest.raises(QueueNotFoundError):
        Queue.open(store.backend, name)
    keys = rec.QueueKeys(name=name, metadata_namespace="test", buffer_namespace="test")
    assert [store.backend.get(keys.buffer(i)) for i in range(4)] == [None] * 4


def test_a_delete_paused_while_the_name_is_deleted_and_made_again_removes_what_is_there(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)  # 2 buffer records
    bigger: list[Queue] = []

    def deleted_and_made_again() -> None:
        assert Queue.delete(store.backend, queue.name)
        bigger.append(Queue.create(store.backend, queue.name, capacity=15, slots_per_record=3))  # 5 records
        bigger[0].enqueue("new")

    assert Queue.delete(AfterFirstRead(store.backend, deleted_and_made_again), queue.name)
    # its mark was refused (another creation): it read the record again and removed that queue whole
    assert [store.backend.get(bigger[0].keys.buffer(i)) for i in range(5)] == [None] * 5
    assert store.backend.get(queue.keys.metadata) is None


def test_a_queue_being_deleted_is_not_checked_or_repaired_and_its_handles_are_told(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    queue.enqueue_batch(range(5))
    with pytest.raises(KeyboardInterrupt):
        Queue.delete(_InterruptedAt(store.backend, "remove", at=3), queue.name)  # buffers 0 and 1 gone
    for report in (
        check_queue(store.backend, queue.name),
        check_queue(store.backend, queue.name, repair=True),
    ):
        assert (
            report.problems
            == ["the queue is being deleted (or its delete was interrupted: deleting it again finishes it)"]
            and not report.repaired
        )
    assert store.backend.get(queue.keys.buffer(0)) is None  # not made again by the repair
    for call in (lambda: queue.enqueue(5), lambda: queue.dequeue()):
        with pytest.raises(QueueNotFoundError, match="is being deleted"):  # not "created again"
            call()
    assert Queue.delete(store.backend, queue.name)
