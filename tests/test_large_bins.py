"""A record with a large bin: commands that do not name it leave it as it was, those that do see it whole.

The embedded store leaves a large bin that a command does not name
encoded (``backends/_embedded_decode.py``); these tests hold it to what
Aerospike does with the same commands.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator

import pytest

from large_queue import Queue, errors
from large_queue._msgpack import pack
from large_queue.backends import Compute, Evaluate, Increment, LogPut, MapGet, Read, RecordKey, Write
from large_queue.backends._embedded_decode import LAZY_BYTES, RecordDecoder
from large_queue.backends.conditions import (
    BinExists,
    Bound,
    IntBin,
    MapItem,
    MapKeyCount,
    NowMs,
    Param,
    add,
    eq,
    gt,
)
from large_queue.backends.embedded import EmbeddedBackend
from tests.fix_backends import Place, Store

_LOG = {f"txn-{n:05d}-{'x' * 30}": [n, n * 2, "e"] for n in range(600)}  # about 30 KB


@pytest.fixture
def key(store: Store) -> Iterator[RecordKey]:
    record = RecordKey("test", "large-bins", uuid.uuid4().hex)
    yield record
    store.backend.remove(record)


def test_commands_that_do_not_name_a_large_bin_leave_it_and_those_that_do_see_it(
    store: Store, key: RecordKey
) -> None:
    backend = store.backend
    assert len(pack(_LOG)) > 2 * LAZY_BYTES
    backend.put(key, {"head": 1, "tail": 5, "log": _LOG})
    # plain commands: increments, a guard, an expression read and write, on the small bins only
    for _ in range(3):
        backend.operate(
            key,
            [Increment("tail", 1), Compute("head", add(IntBin("head"), 1)), Read("tail")],
            condition=gt(IntBin("tail"), IntBin("head")),
        )
    got = backend.operate(key, [Evaluate("size", add(IntBin("tail"), 0)), Read("head")])
    assert got == {"size": 8, "head": 4}
    assert backend.get(key).bins == {"head": 4, "tail": 8, "log": _LOG}  # type: ignore[union-attr]
    # commands that name it only in their guard, or only in an expression
    known = Bound(eq(MapKeyCount("log", Param("k")), 1), {"k": "txn-00007-" + "x" * 30})
    backend.operate(key, [Increment("tail", 1)], condition=known)
    item = Bound(eq(MapItem("log", Param("k"), 1), Param("v")), {"k": "txn-00007-" + "x" * 30, "v": 13})
    with pytest.raises(errors.ConditionNotMetError):
        backend.operate(key, [Increment("tail", 1)], condition=item)
    backend.operate(key, [Increment("tail", 1)], condition=Bound(item.template, {**item.values, "v": 14}))
    backend.operate(key, [Increment("tail", 1)], condition=BinExists("log"))
    assert backend.operate(key, [MapGet("log", "txn-00599-" + "x" * 30)]) == {"log": [599, 1198, "e"]}
    # a command that writes it
    backend.operate(key, [LogPut("log", "new", (NowMs(), IntBin("tail"), "e"), 1000, 10**13)])  # none too old
    log = backend.get(key).bins["log"]  # type: ignore[union-attr]
    assert len(log) == len(_LOG) + 1 and log["new"][1:] == [11, "e"]
    assert {k: v for k, v in log.items() if k != "new"} == _LOG
    backend.operate(key, [Write("log", {"small": [1]}), Increment("tail", 1)])
    assert backend.get(key).bins == {"head": 4, "tail": 12, "log": {"small": [1]}}  # type: ignore[union-attr]


def test_a_bin_that_grows_large_is_left_encoded_from_then_on() -> None:
    """A record first split when none of its bins was large is split again once one is."""
    decoder = RecordDecoder()
    key = RecordKey("test", "s", "k")
    small = pack({"head": 1, "log": {"a": [1]}, "pad": "p" * (LAZY_BYTES + 10)})
    assert decoder.decode(small, key, ([Read("head"), Read("pad")], None))["log"] == {"a": [1]}
    grown = pack({"head": 1, "log": _LOG})
    bins = decoder.decode(grown, key, ([Read("head")], None))
    assert bins["head"] == 1 and type(bins["log"]) is not dict  # kept as its bytes
    assert decoder.decode(grown, key, ([Read("head")], BinExists("log")))["log"] == _LOG
    assert decoder.decode(grown, key, None)["log"] == _LOG  # whole-record reads decode it all


def test_a_damaged_large_bin_is_named_as_damaged_by_every_command_that_reads_it(tmp_path: object) -> None:
    path = f"{tmp_path}/damaged.db"
    backend = EmbeddedBackend(path)
    key = RecordKey("test", "s", "k")
    backend.put(key, {"head": 1, "log": {"k": "v" * (2 * LAZY_BYTES)}})
    with sqlite3.connect(path) as conn:  # the log's str no longer UTF-8, the record's shape intact
        (blob,) = conn.execute("SELECT bins FROM records").fetchone()
        damaged = blob.replace(b"v" * 8, b"\xff" * 8, 1)
        conn.execute("UPDATE records SET bins = ?", (damaged,))
    with pytest.raises(errors.CorruptRecordError, match="damaged data"):
        backend.operate(key, [MapGet("log", "k")])
    with pytest.raises(errors.CorruptRecordError, match="damaged data"):
        backend.get(key)
    # a command that does not read it still works, and leaves it as it was
    assert backend.operate(key, [Increment("head", 1), Read("head")]) == {"head": 2}
    with sqlite3.connect(path) as conn:
        (after,) = conn.execute("SELECT bins FROM records").fetchone()
    assert b"\xff" * 8 in after
    backend.close()


def test_plain_calls_on_a_queue_with_a_large_receipt_log_keep_it_whole(place: Place) -> None:
    queue = Queue.create(place.connect(), place.name("rcpt"), capacity=40, slots_per_record=10, receipts=400)
    for n in range(400):
        queue.enqueue({"n": n}, txn_id=f"{n:04d}-{'t' * 32}")
        assert queue.dequeue() is not None
    for n in range(50):  # calls without a txn id leave the log alone
        queue.enqueue({"m": n})
        assert queue.dequeue() is not None
    assert queue.outcome(f"{399:04d}-{'t' * 32}").state == "committed"
    assert queue.outcome(f"{0:04d}-{'t' * 32}").state == "committed"
    repeated = queue.enqueue({"n": 399}, txn_id=f"{399:04d}-{'t' * 32}")  # answered from its receipt
    assert repeated == 399
