"""Whatever a damaged store holds, and whatever ails its file, reaches the user as a library error."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from large_queue import CorruptQueueError, Queue, QueueNotFoundError, _locked, connect
from large_queue import _records as rec
from large_queue._check import check_queue
from large_queue.backends import ListSet, ListSetRange
from large_queue.errors import StoreFileError
from tests.fix_backends import APPENDS, Store


@pytest.mark.parametrize("appends", APPENDS)
def test_a_damaged_buffer_record_is_named_and_the_rest_stays_readable(store: Store, appends: str) -> None:
    queue = store.new_queue(capacity=9, slots_per_record=3, appends=appends)
    queue.enqueue_batch(range(7))  # records 0, 1, 2
    store.damage(queue.keys.buffer(1))
    assert [e.value for e in queue.dequeue_batch(3)] == [0, 1, 2]  # record 0 is sound
    with pytest.raises(CorruptQueueError, match=r"buffer record 1 of queue .* cannot be read"):
        queue.dequeue()
    assert queue.info().lock_owner is None  # the failed dequeue let go of the lock
    if appends == "lock":
        assert queue.get(6).value == 6  # type: ignore[union-attr]
    else:  # the published prefix cannot be settled past the damaged record: readers are told so
        with pytest.raises(CorruptQueueError, match=r"buffer record 1 of queue .* cannot be read"):
            queue.get(6)
    report = check_queue(store.backend, queue.name)
    assert any("buffer record 1 cannot be read" in p and "3, 4, 5" in p for p in report.problems), (
        report.problems
    )


def test_a_slot_cut_short_is_named_by_readers(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=12, slots_per_record=3, encoding="native")
    queue.enqueue_batch(["a", "b"])
    store.backend.operate(queue.keys.buffer(0), [ListSet(rec.SLOTS, 0, [0, "a"])])  # its enqueue time gone
    with pytest.raises(CorruptQueueError, match="malformed"):
        queue.get(0)
    entry = queue.get(1)
    assert entry is not None and entry.value == "b"  # the rest stays readable


def test_a_damaged_metadata_record_is_named(store: Store) -> None:
    queue = store.new_queue()
    store.damage(queue.keys.metadata)
    with pytest.raises(CorruptQueueError, match=r"the metadata record of queue .* cannot be read"):
        Queue.open(store.backend, queue.name)
    assert any("metadata record cannot be read" in p for p in check_queue(store.backend, queue.name).problems)


def test_a_queue_deleted_under_an_operation_in_progress_is_reported_as_gone(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    grant = queue.lock.try_acquire("A")  # an enqueue in another process, between its steps
    Queue.delete(store.backend, queue.name)
    with pytest.raises(QueueNotFoundError):
        _locked.fenced_command(queue, grant, 0, [ListSetRange(rec.SLOTS, 0, [[0, "x", 0]])], read=None)
    with pytest.raises(QueueNotFoundError):
        queue.lock.commit(grant, tail=1)
    with pytest.raises(QueueNotFoundError):
        queue.enqueue("x")


def test_store_files_that_cannot_be_used_are_named(tmp_path: Path) -> None:
    with pytest.raises(StoreFileError, match="cannot be opened"):
        connect(f"embedded://{tmp_path}")  # a directory
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(StoreFileError, match="is damaged or is not a large_queue store"):
        connect(f"embedded://{garbage}")
    store = connect(f"embedded://{tmp_path}/truncated.db")
    Queue.create(store, "q", capacity=300, slots_per_record=3).enqueue_batch(range(200))
    store.close()
    data = (tmp_path / "truncated.db").read_bytes()
    (tmp_path / "truncated.db").write_bytes(data[: len(data) // 3])
    for name in ("truncated.db-wal", "truncated.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    with pytest.raises((StoreFileError, CorruptQueueError)):
        again = connect(f"embedded://{tmp_path}/truncated.db")
        Queue.open(again, "q").dequeue_batch(300)


def test_a_read_only_store_file_is_read_and_refuses_writes_by_name(tmp_path: Path) -> None:
    store = connect(f"embedded://{tmp_path}/ro.db")
    Queue.create(store, "q", capacity=10).enqueue("kept")
    store.close()
    # Immutable even for root, who ignores file modes.
    if subprocess.run(["chattr", "+i", str(tmp_path / "ro.db")], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not available here to make the file read-only")
    try:
        queue = Queue.open(connect(f"embedded://{tmp_path}/ro.db"), "q")
        assert queue.get(0).value == "kept"  # type: ignore[union-attr]
        with pytest.raises(StoreFileError, match="is read-only"):
            queue.enqueue("more")
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "ro.db")], check=False)
