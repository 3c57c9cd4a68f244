"""Groups of commands (``Backend.grouped``): one transaction on the embedded store, none on Aerospike.

A group never changes a command's outcome; on the embedded store other
processes see all of it or none of it, and nothing inside it waits.
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from pathlib import Path

import pytest

from large_queue import Queue, errors
from large_queue.backends import Read, RecordKey, Write, connect
from large_queue.backends.conditions import Compare, IntBin
from large_queue.backends.embedded import EmbeddedBackend
from tests.fix_backends import Place, meanwhile

#: whether another connection sees a command of a group before the group ends: Aerospike
#: has no groups (each command is sent as it comes); the embedded store commits a group whole.
SEEN_INSIDE_A_GROUP = {"embedded": False, "aerospike": True}
SET = "grouped-commands"  # one set for every test here: Aerospike keeps a set name for good


def _key() -> RecordKey:
    return RecordKey("test", SET, uuid.uuid4().hex)


def test_other_connections_see_a_group_whole_or_not_at_all(place: Place) -> None:
    writer, reader = place.connect(), place.connect()
    first, second = _key(), _key()
    try:
        with writer.grouped():
            writer.put(first, {"n": 1})
            with writer.grouped():  # a group opened inside another joins it
                writer.put(second, {"n": 2})
            seen = [reader.get(first), reader.get(second)]
            assert [record is not None for record in seen] == [SEEN_INSIDE_A_GROUP[place.kind]] * 2
        after = [reader.get(first), reader.get(second)]
        assert [record.bins if record else None for record in after] == [{"n": 1}, {"n": 2}]
    finally:
        writer.remove(first)
        writer.remove(second)
        writer.close()
        reader.close()


def test_a_refused_command_in_a_group_leaves_the_others_applied(place: Place) -> None:
    store = place.connect()
    kept, refused = _key(), _key()
    try:
        with pytest.raises(RuntimeError, match="after the writes"), store.grouped():
            store.put(kept, {"n": 1})
            store.put(refused, {"n": 1})
            with pytest.raises(errors.ConditionNotMetError):
                store.operate(refused, [Read("n")], condition=Compare("==", IntBin("n"), 2))
            store.put(kept, {"n": 2})
            raise RuntimeError("an error of the caller's, after the writes")
        # every command counted on its own, and all that were applied stay applied
        found = store.get(kept)
        assert found is not None and found.bins == {"n": 2} and found.generation == 2
        assert store.get(refused) is not None
    finally:
        store.remove(kept)
        store.remove(refused)
        store.close()


def test_a_failure_of_sqlite_in_a_group_rolls_all_of_it_back(tmp_path: Path) -> None:
    store = EmbeddedBackend(tmp_path / "store.db")
    before, during = _key(), _key()
    store.put(before, {"n": 1})
    with pytest.raises(errors.StoreFileError, match="read-only"), store.grouped():
        store.put(before, {"n": 2})
        assert store._conn is not None
        store._conn.execute("PRAGMA query_only=1")  # SQLite now refuses every write
        try:
            store.put(during, {"n": 1})
        finally:
            store._conn.execute("PRAGMA query_only=0")
    found = store.get(before)
    assert found is not None and found.bins == {"n": 1} and found.generation == 1
    assert store.get(during) is None
    store.put(during, {"n": 1})  # and the store goes on
    store.close()


def test_a_full_disk_inside_a_batch_of_commands_keeps_none_of_it(tmp_path: Path) -> None:
    store = EmbeddedBackend(tmp_path / "store.db")
    big, small = [_key() for _ in range(3)], [_key() for _ in range(3)]
    for key in big + small:
        store.put(key, {"n": 0})
    assert store._conn is not None
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count={pages + 20}")  # the disk is full past 20 more pages
    commands = [(key, [Write("blob", b"x" * 60_000)], None) for key in big]
    commands += [(key, [Write("n", 42)], None) for key in small]
    with pytest.raises(errors.StoreFileError, match="rolled back"):
        store.operate_each(commands)  # the big writes fill the disk; the small ones must not go on alone
    other = EmbeddedBackend(tmp_path / "store.db")
    assert [other.get(key).bins for key in big + small] == [{"n": 0}] * 6  # type: ignore[union-attr]
    store._conn.execute(f"PRAGMA max_page_count={2**30}")
    store.operate_each([(key, [Write("n", 1)], None) for key in small])  # and the store goes on
    assert [other.get(key).bins for key in small] == [{"n": 1}] * 3  # type: ignore[union-attr]
    store.close()
    other.close()


def _reserve_and_die(url: str, name: str) -> None:
    queue = Queue.open(connect(url), name)
    with queue.backend.grouped():
        queue.appender.reserve(1, overwrite=False)
        os._exit(3)  # before publishing, inside the group


def test_a_producer_that_dies_inside_its_group_leaves_no_hole(tmp_path: Path) -> None:
    url = f"embedded://{tmp_path}/store.db"
    queue = Queue.create(connect(url), "no-hole", capacity=10, appends="reserve", hole_timeout=600)
    queue.enqueue("first")
    child = multiprocessing.get_context("fork").Process(target=_reserve_and_die, args=(url, "no-hole"))
    child.start()
    child.join(30)
    assert child.exitcode == 3
    info = queue.info()
    assert (info.tail_offset, info.reserved_tail) == (1, 1)  # the reservation never happened
    assert queue.enqueue("second") == 1
    # no hole to wait out (its timeout is ten minutes): both entries at once
    assert [entry.value for entry in queue.dequeue_batch(5)] == ["first", "second"]


@pytest.mark.parametrize("appends", ["lock", "reserve"])
def test_a_busy_queue_lock_is_waited_for_outside_any_group(tmp_path: Path, appends: str) -> None:
    # Had the dequeue waited inside its group, it would hold the store's writer lock, and
    # the holder could never release the queue lock: the dequeue would time out instead.
    url = f"embedded://{tmp_path}/store.db"
    waiting = Queue.create(connect(url), "busy", capacity=10, appends=appends)
    waiting.enqueue("entry")
    holder = Queue.open(connect(url), "busy")
    grant = holder.lock.acquire("holder")
    with meanwhile(0.3, holder.lock.release, grant):
        entry = waiting.dequeue()
    assert entry is not None and entry.value == "entry"
    assert waiting.stats().lock_waits >= 1  # it did find the lock busy
