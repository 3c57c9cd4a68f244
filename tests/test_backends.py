"""Record semantics that the queue relies on, checked on every store."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from large_queue import Queue, errors
from large_queue.backends import (
    Compute,
    Evaluate,
    Increment,
    ListGetRange,
    ListSet,
    ListSetRange,
    LogPut,
    MapGet,
    Read,
    Record,
    RecordKey,
    Write,
    WriteMode,
)
from large_queue.backends._embedded_file import SCHEMA
from large_queue.backends.conditions import (
    BinExists,
    Bound,
    IntBin,
    MapItem,
    MapKeyCount,
    Not,
    NowMs,
    Param,
    SinceUpdateMs,
    add,
    all_of,
    any_of,
    eq,
    gt,
    sub,
)
from large_queue.backends.embedded import EmbeddedBackend
from tests.fix_backends import Place, Store


@pytest.fixture
def key(store: Store) -> Iterator[RecordKey]:
    record = RecordKey("test", "backend-tests", uuid.uuid4().hex)
    yield record
    store.backend.remove(record)


def test_put_modes_and_generations(store: Store, key: RecordKey) -> None:
    backend = store.backend
    with pytest.raises(errors.RecordNotFoundError):
        backend.put(key, {"a": 1}, mode=WriteMode.UPDATE_ONLY)
    backend.put(key, {"a": 1, "b": "x"}, mode=WriteMode.CREATE_ONLY)
    with pytest.raises(errors.RecordExistsError):
        backend.put(key, {"a": 2}, mode=WriteMode.CREATE_ONLY)
    record = backend.get(key)
    assert record is not None and record.bins == {"a": 1, "b": "x"}
    backend.put(key, {"a": 2}, generation=record.generation)
    with pytest.raises(errors.GenerationMismatchError):
        backend.put(key, {"a": 3}, generation=record.generation)
    updated = backend.get(key)
    assert updated is not None and updated.bins == {"a": 2, "b": "x"}
    assert updated.generation == record.generation + 1
    backend.put(key, {"c": 1}, mode=WriteMode.REPLACE)
    assert backend.get(key).bins == {"c": 1}  # type: ignore[union-attr]
    assert backend.remove(key) is True
    assert backend.remove(key) is False
    assert backend.get(key) is None


def test_operate_applies_in_order_atomically(store: Store, key: RecordKey) -> None:
    backend = store.backend
    backend.put(key, {"n": 1, "items": [None, None, None]})
    result = backend.operate(
        key, [Increment("n", 4), ListSet("items", 1, ["v"]), Read("n"), ListGetRange("items", 0, 2)]
    )
    assert result == {"n": 5, "items": [None, ["v"]]}
    with pytest.raises(errors.ConditionNotMetError):
        backend.operate(key, [Write("n", 100)], condition=eq(IntBin("n"), 4))
    with pytest.raises(errors.GenerationMismatchError):
        backend.operate(key, [Write("n", 100)], generation=999)
    assert backend.operate(key, [Read("n")]) == {"n": 5}  # neither refused command applied
    missing = RecordKey("test", "backend-tests", uuid.uuid4().hex)
    with pytest.raises(errors.RecordNotFoundError):
        backend.operate(missing, [Write("n", 1)])


def test_condition_on_time_since_update_uses_store_clock(store: Store, key: RecordKey) -> None:
    backend = store.backend
    backend.put(key, {"ttl": 200})
    with pytest.raises(errors.ConditionNotMetError):
        backend.operate(key, [Write("x", 1)], condition=gt(SinceUpdateMs(), IntBin("ttl")))
    store.advance(0.3)
    backend.operate(key, [Write("x", 1)], condition=gt(SinceUpdateMs(), IntBin("ttl")))
    with pytest.raises(errors.ConditionNotMetError):  # the write restarted the clock
        backend.operate(key, [Write("x", 2)], condition=gt(SinceUpdateMs(), IntBin("ttl")))


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ((1, 2), "is a tuple"),
        ({1, 2}, "is a set"),
        (object(), "is a object"),
        (2**70, "does not fit a signed 64-bit integer"),
        ({1.5: 2}, "a key of type float"),  # Aerospike's client would store the map empty
        ("a\x00b", "NUL"),  # Aerospike would keep "a"
        ([{"k": ("nested",)}], "[0]['k'] is a tuple"),
    ],
)
def test_a_put_refuses_values_a_store_would_change(
    store: Store, key: RecordKey, value: object, problem: str
) -> None:
    backend = store.backend
    backend.put(key, {"kept": 1})
    with pytest.raises(errors.BackendUsageError, match="bin 'bad'") as refused:
        backend.put(key, {"kept": 2, "bad": value})
    assert problem in str(refused.value)
    assert backend.get(key).bins == {"kept": 1}  # type: ignore[union-attr]


def test_an_operation_writing_what_no_bin_holds_is_a_usage_error(store: Store, key: RecordKey) -> None:
    backend = store.backend
    backend.put(key, {"kept": 1})
    for value in (object(), 2**70):
        with pytest.raises(errors.BackendUsageError):
            backend.operate(key, [Write("kept", 2), Write("bad", value)])
    assert backend.get(key).bins == {"kept": 1}  # type: ignore[union-attr]


def test_bin_names_and_record_size_limit(store: Store, key: RecordKey) -> None:
    backend = store.backend
    with pytest.raises(errors.BinNameError):
        backend.put(key, {"a" * 16: 1})
    with pytest.raises(errors.BinNameError, match="must be a str"):
        backend.put(key, {1: 1})  # type: ignore[dict-item]
    backend.put(key, {"a" * 15: 1})
    with pytest.raises(errors.BinNameError, match="must be a str"):
        backend.operate(key, [Write(2, 1)])  # type: ignore[arg-type]
    with pytest.raises(errors.RecordTooLargeError):
        backend.put(key, {"big": b"x" * (8 * 1024 * 1024 + 1)})
    assert backend.get(key).bins == {"a" * 15: 1}  # type: ignore[union-attr]


def test_batch_get_reports_missing_records(store: Store, key: RecordKey) -> None:
    backend = store.backend
    backend.put(key, {"v": 1})
    missing = RecordKey("test", "backend-tests", uuid.uuid4().hex)
    records = backend.batch_get([key, missing, key])
    assert [r.bins if r else None for r in records] == [{"v": 1}, None, {"v": 1}]
    before = backend.commands
    backend.batch_get([key, missing])
    assert backend.commands - before == 1
    # a record asked only for bins it does not have answers with none: it is not damaged
    answers = backend.batch_read([(key, [Read("not_there")]), (missing, [Read("v")]), (key, [Read("v")])])
    assert answers == [{}, None, {"v": 1}]


def test_batch_get_keeps_order_across_sets_and_skips_expired(store: Store, key: RecordKey) -> None:
    backend = store.backend
    keys = [RecordKey("test", f"backend-tests-{n % 3}", f"{key.user_key}-{n}") for n in range(700)]
    for n, each in enumerate(keys):
        backend.put(each, {"n": n}, ttl=1 if n % 7 == 0 else 60)
    store.advance(2.5)  # on Aerospike, a real wait: its TTLs count whole seconds
    records = backend.batch_get(list(reversed(keys)))
    assert [r.bins["n"] if r else None for r in records] == [
        None if n % 7 == 0 else n for n in reversed(range(700))
    ]


def test_records_expire_after_their_ttl(store: Store, key: RecordKey) -> None:
    store.backend.put(key, {"v": 1}, ttl=3)
    store.advance(1)
    assert store.backend.operate(key, [Increment("v", 1), Read("v")]) == {"v": 2}  # keeps its TTL
    assert store.backend.get(key) is not None
    store.advance(3)
    assert store.backend.get(key) is None


@pytest.mark.parametrize("ttl", [0, -1, -2, 1.5, "10", 2**40, True])
def test_a_ttl_a_store_would_read_its_own_way_is_refused(store: Store, key: RecordKey, ttl: object) -> None:
    store.backend.put(key, {"v": 1})
    with pytest.raises(errors.BackendUsageError, match="ttl must be None"):
        store.backend.put(key, {"w": 2}, ttl=ttl)  # type: ignore[arg-type]
    assert store.backend.get(key).bins == {"v": 1}  # type: ignore[union-attr]


def test_a_record_key_is_made_of_str() -> None:
    for bad in [("test", "s", 7), ("test", None, "k"), (b"test", "s", "k")]:
        with pytest.raises(errors.BackendUsageError, match="are str"):
            RecordKey(*bad)  # type: ignore[arg-type]


def test_junctions_of_fewer_than_two_parts_read_alike_on_every_store(store: Store, key: RecordKey) -> None:
    store.backend.put(key, {"a": 1})
    verdicts = []
    for condition in [all_of(eq(IntBin("a"), 1)), any_of(eq(IntBin("a"), 2)), all_of(), any_of()]:
        try:
            store.backend.operate(key, [Read("a")], condition=condition)
            verdicts.append(True)
        except errors.ConditionNotMetError:
            verdicts.append(False)
    assert verdicts == [True, False, True, False]


def test_unknown_stays_unknown_through_junctions_and_negations_on_every_store(
    store: Store, key: RecordKey
) -> None:
    """A missing bin, or one of another type, makes a comparison unknown; ``not`` of unknown is unknown.

    Negated, an unknown condition is still not met: a store that took unknown
    for false would let each of these commands through.
    """
    store.backend.put(key, {"n": 1, "s": "text"})
    missing, true, false = eq(IntBin("missing"), 1), eq(IntBin("n"), 1), eq(IntBin("n"), 2)
    unknown = [
        missing,
        all_of(missing, true),  # and: unknown unless a part is false
        any_of(missing, false),  # or: unknown unless a part is true
        eq(IntBin("s"), 1),  # a str bin read as an int
        Not(missing),
        Not(Not(missing)),
        Not(all_of(missing, true)),
        Not(any_of(missing, false)),
        Not(eq(IntBin("s"), 1)),
    ]
    for condition in unknown:
        with pytest.raises(errors.ConditionNotMetError):
            store.backend.operate(key, [Write("w", 1)], condition=condition)
    # decided by one known part, whatever the unknown one: met
    store.backend.operate(key, [Write("w", 1)], condition=any_of(missing, true))
    store.backend.operate(key, [Write("w", 2)], condition=Not(all_of(missing, false)))
    assert store.backend.get(key).bins.get("w") == 2  # type: ignore[union-attr]


def test_a_comparison_of_an_int_with_a_str_is_refused_when_built() -> None:
    for left, right in [(IntBin("n"), "a"), (NowMs(), "now"), (1, "1")]:
        with pytest.raises(errors.BackendUsageError, match="comparison of an int with a str"):
            eq(left, right)
    eq(Param("p"), "a")  # a value given later: checked by the store that compares it


def test_the_embedded_file_shrinks_as_queues_are_deleted(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = EmbeddedBackend(path)
    queue = Queue.create(store, "big", capacity=2000, slots_per_record=20)
    for _ in range(20):
        queue.enqueue_batch([b"x" * 2000] * 100)
        queue.dequeue_batch(100)
    queue.enqueue_batch([b"x" * 2000] * 2000)
    store.close()
    full = path.stat().st_size
    store = EmbeddedBackend(path)
    Queue.delete(store, "big")
    store.close()  # the last connection checkpoints the write-ahead log into the file
    assert path.stat().st_size < full / 10, (full, path.stat().st_size)


def test_a_file_made_before_space_was_reclaimed_is_compacted(tmp_path: Path) -> None:
    from large_queue.cli import main

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:  # as earlier versions made files: no auto-vacuum
        old.execute("PRAGMA auto_vacuum=NONE")
        old.execute(SCHEMA)  # a store's table, made with no auto-vacuum
    store = EmbeddedBackend(path)
    Queue.create(store, "big", capacity=2000, slots_per_record=20).enqueue_batch([b"x" * 2000] * 2000)
    Queue.delete(store, "big")
    store.close()
    kept = path.stat().st_size
    assert kept > 4_000_000  # the deleted queue's pages stayed in the file
    assert main(["--url", f"embedded://{path}", "compact"]) == 0
    assert path.stat().st_size < kept / 10
    store = EmbeddedBackend(path)  # and from now on it gives pages back as they are freed
    assert store._connection().execute("PRAGMA auto_vacuum").fetchone() == (2,)


def test_bounded_log_puts_trim_by_count_and_age_on_the_store_clock(store: Store, key: RecordKey) -> None:
    """A :class:`LogPut` keeps at most ``keep`` entries, drops those older than its age, both stores alike."""
    store.backend.put(key, {"tail": 10})
    now = (NowMs(),)
    put = LogPut("log", Param("k"), (*now, sub(IntBin("tail"), Param("n")), Param("n"), "e"), 3, 60_000)
    for index in range(5):
        store.backend.operate(
            key,
            [
                Increment("tail", 2),
                LogPut(put.bin, put.key, put.items, 3, 60_000, {"k": f"t{index}", "n": 2}),
            ],
        )
    log = store.backend.get(key).bins["log"]  # type: ignore[union-attr]
    assert sorted(log) == ["t2", "t3", "t4"]  # the newest 3 (ranked by store time, then first offset)
    assert [log[k][1:] for k in sorted(log)] == [[14, 2, "e"], [16, 2, "e"], [18, 2, "e"]]
    stamps = [log[k][0] for k in sorted(log)]
    assert all(type(stamp) is int and abs(stamp - time.time() * 1000) < 60_000 for stamp in stamps)
    # key lookups: present, absent; and the guards that read the log
    got = store.backend.operate(key, [MapGet("log", "t3")])
    assert got["log"][1:] == [16, 2, "e"]
    assert store.backend.operate(key, [MapGet("log", "nope")]).get("log") is None
    absent = Bound(any_of(Not(BinExists("log")), eq(MapKeyCount("log", Param("k")), 0)), {"k": "t3"})
    with pytest.raises(errors.ConditionNotMetError):
        store.backend.operate(key, [Increment("tail", 1)], condition=absent)
    first_is = Bound(eq(MapItem("log", Param("k"), 1), Param("f")), {"k": "t3", "f": 16})
    store.backend.operate(key, [Increment("tail", 1)], condition=first_is)
    with pytest.raises(errors.ConditionNotMetError):
        store.backend.operate(
            key, [Increment("tail", 1)], condition=Bound(first_is.template, {"k": "t3", "f": 17})
        )
    # an age of 0 ms drops everything older than now: the put leaves only its own entry
    store.advance(0.01)
    store.backend.operate(key, [LogPut("log", "late", now, 3, 0)])
    assert list(store.backend.get(key).bins["log"]) == ["late"]  # type: ignore[union-attr]


def _stop_inside_a_command(path: str, ready: Any) -> None:
    backend = EmbeddedBackend(path)
    with backend.grouped():  # the writer lock is held from here to the group's end
        backend.put(RecordKey("test", "s", "held"), {"v": 1})
        ready.set()
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped inside its command: it never ends on its own


@contextlib.contextmanager
def _a_writer_stopped_inside_a_command(path: str) -> Iterator[None]:
    """Another process stopped inside a command on the store at ``path``, for the body's length."""
    ready = multiprocessing.get_context("fork").Event()
    stopped = multiprocessing.get_context("fork").Process(target=_stop_inside_a_command, args=(path, ready))
    stopped.start()
    try:
        assert ready.wait(10)
        yield
    finally:
        os.kill(stopped.pid, signal.SIGKILL)  # type: ignore[arg-type]
        stopped.join()


def test_a_process_stopped_inside_a_command_holds_writers_up_for_busy_timeout_not_forever(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "store.db")
    backend = EmbeddedBackend(path, busy_timeout=0.5)
    key = RecordKey("test", "s", "k")
    backend.put(key, {"v": 0})
    ready = multiprocessing.get_context("fork").Event()
    stopped = multiprocessing.get_context("fork").Process(target=_stop_inside_a_command, args=(path, ready))
    stopped.start()
    try:
        assert ready.wait(10)
        started = time.monotonic()
        with pytest.raises(errors.BackendBusyError, match=r"stayed locked by another process for 0\.5 s"):
            backend.put(key, {"v": 1})
        assert 0.5 <= time.monotonic() - started < 5
        assert backend.get(key).bins == {"v": 0}  # type: ignore[union-attr]  (reads go on)
    finally:
        os.kill(stopped.pid, signal.SIGKILL)  # type: ignore[arg-type]
        stopped.join()
    backend.put(key, {"v": 2})  # its transaction died with it: the file is free again
    assert backend.get(key).bins == {"v": 2}  # type: ignore[union-attr]
    assert backend.get(RecordKey("test", "s", "held")) is None


def test_info_does_not_wait_out_a_writer_stopped_inside_a_command(tmp_path: Path) -> None:
    """info() walks the published prefix and leaves a hint for the next reader: that hint is not worth
    waiting the busy timeout for (every info, and the CLI's info and stats, took it)."""
    path = str(tmp_path / "store.db")
    backend = EmbeddedBackend(path, busy_timeout=3.0)
    queue = Queue.create(backend, "q", capacity=1000, slots_per_record=10)
    queue.enqueue_batch(list(range(100)))
    with _a_writer_stopped_inside_a_command(path):
        started = time.monotonic()
        fresh = Queue.open(EmbeddedBackend(path, busy_timeout=3.0), "q")
        assert fresh.info().size == 100 and fresh.info().size == 100
        assert time.monotonic() - started < 1.5


def test_a_batch_of_commands_may_hold_commands_that_only_read(store: Store, key: RecordKey) -> None:
    other = RecordKey("test", "backend-tests", uuid.uuid4().hex)
    missing = RecordKey("test", "backend-tests", uuid.uuid4().hex)
    store.backend.put(key, {"a": 1})
    store.backend.put(other, {"a": 1})
    try:
        outcomes = store.backend.operate_each(
            [
                (key, [Read("a")], None),
                (other, [Write("a", 2)], None),
                (missing, [Read("a")], None),
                (key, [Read("a")], eq(IntBin("a"), 5)),
            ]
        )
        assert outcomes[0] == {"a": 1}
        assert [type(o).__name__ for o in outcomes[2:]] == ["RecordNotFoundError", "ConditionNotMetError"]
        assert store.backend.get(other).bins == {"a": 2}  # type: ignore[union-attr]
        assert store.backend.operate_and_read(key, [Read("a")], (other, [Read("a")], None)) == (
            {"a": 1},
            {"a": 2},
        )
        with pytest.raises(errors.BinNameError):  # the caller's mistake, raised before anything is written
            store.backend.operate_each([(other, [Write("a", 3)], None), (key, [Write("b" * 16, 1)], None)])
        assert store.backend.get(other).bins == {"a": 2}  # type: ignore[union-attr]
    finally:
        store.backend.remove(other)


def test_an_expression_read_that_cannot_be_told_reads_none_and_the_command_goes_on(
    store: Store, key: RecordKey
) -> None:
    store.backend.put(key, {"a": 1})
    answer = store.backend.operate(key, [Evaluate("v", IntBin("missing")), Write("a", 2)])
    assert answer.get("v") is None
    assert store.backend.get(key).bins == {"a": 2}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "command",
    [
        lambda: ([Increment("i", "1")], None),  # type: ignore[arg-type]
        lambda: ([ListSet("l", "0", 5)], None),  # type: ignore[arg-type]
        lambda: ([Write("i", 6), "read i"], None),
        lambda: ([Write("i", 6)], True),
        lambda: ([Write("i", 6)], Bound(eq(IntBin("i"), Param("p")), {})),  # a template missing its value
        lambda: ([Write("i", 6)], eq(IntBin("i"), 5.0)),  # type: ignore[arg-type]
        lambda: ([LogPut("g", "t", (NowMs(),), 1, 1000)], None),
    ],
)
def test_a_malformed_command_is_a_usage_error_on_every_store_and_writes_nothing(
    store: Store, key: RecordKey, command: Any
) -> None:
    store.backend.put(key, {"i": 5, "l": [1]})
    with pytest.raises(errors.BackendUsageError):
        operations, condition = command()
        store.backend.operate(key, operations, condition=condition)
    assert store.backend.get(key).bins == {"i": 5, "l": [1]}  # type: ignore[union-attr]


def test_a_bound_template_inside_another_condition_reads_alike(store: Store, key: RecordKey) -> None:
    store.backend.put(key, {"i": 5})
    store.backend.operate(key, [Write("i", 6)], condition=Not(Bound(eq(IntBin("i"), Param("p")), {"p": 4})))
    assert store.backend.get(key).bins == {"i": 6}  # type: ignore[union-attr]


def test_records_without_bins_and_generations_read_alike_on_every_store(store: Store, key: RecordKey) -> None:
    backend = store.backend
    backend.put(key, {"a": 1})
    backend.operate(key, [Write("a", None)])  # its last bin: the record goes with it
    assert backend.get(key) is None
    with pytest.raises(errors.RecordNotFoundError):
        backend.put(key, {"a": None})  # removes a bin of a record that is not there
    with pytest.raises(errors.BackendUsageError):
        backend.put(key, {})
    backend.put(key, {"a": 1}, generation=0)  # a missing record is at generation 0
    assert backend.get(key) == Record({"a": 1}, 1)
    assert backend.operate(key, [Read("a")], generation=7) == {"a": 1}  # reads are not guarded by it
    backend.put(key, {"a": None})
    assert backend.get(key) is None


def test_list_writes_past_the_end_are_refused_alike_and_a_write_at_the_end_appends(
    store: Store, key: RecordKey
) -> None:
    backend = store.backend
    backend.put(key, {"l": [1, 2, 3]})
    backend.operate(key, [ListSet("l", 3, 4)])  # the next index appends
    backend.operate(key, [ListSetRange("l", 3, [5, 6])])  # a range running past the end grows the list
    assert backend.get(key).bins == {"l": [1, 2, 3, 5, 6]}  # type: ignore[union-attr]
    for past in (ListSet("l", 6, 0), ListSetRange("l", 6, [0])):
        with pytest.raises(errors.BinTypeError):  # Aerospike would pad the list with nils
            backend.operate(key, [Write("x", 1), past])
    assert backend.get(key).bins == {"l": [1, 2, 3, 5, 6]}  # type: ignore[union-attr]
    assert backend.operate(key, [ListGetRange("l", 3, 10)]) == {"l": [5, 6]}


@pytest.mark.parametrize(
    "make",
    [
        lambda: ListSet("l", -1, 0),  # Aerospike would count from the end
        lambda: ListSetRange("l", -2, [0]),
        lambda: ListSetRange("l", 0, (0,)),  # type: ignore[arg-type]
        lambda: ListGetRange("l", -1, 1),
        lambda: ListGetRange("l", 0, -1),
        lambda: ListSet("l", True, 0),
        lambda: Increment("n", 2**63),
        lambda: Increment("n", 1.0),  # type: ignore[arg-type]
    ],
)
def test_an_operation_a_store_would_read_its_own_way_cannot_be_made(make: Any) -> None:
    with pytest.raises(errors.BackendUsageError):
        make()


def test_an_increment_wraps_around_at_64_bits_on_every_store(store: Store, key: RecordKey) -> None:
    store.backend.put(key, {"n": 2**63 - 2})
    store.backend.operate(key, [Increment("n", 3)])
    assert store.backend.get(key).bins == {"n": -(2**63) + 1}  # type: ignore[union-attr]
    store.backend.operate(key, [Increment("n", -2)])
    assert store.backend.get(key).bins == {"n": 2**63 - 1}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "call",
    [
        lambda b, k, o: b.operate_each([(o, [Write("a", 9)], None), (k, [Write("a", 9), "read a"], None)]),
        lambda b, k, o: b.operate_each([(o, [Write("a", 9)], None), (k, [Write("a", 9)], "a condition")]),
        lambda b, k, o: b.operate_each(
            [(o, [Write("a", 9)], None), (k, [Write("a", 9)], Bound(eq(IntBin("a"), Param("p")), {}))]
        ),
        lambda b, k, o: b.operate_and_read(o, [Write("a", 9)], (k, ["read a"], None)),
        lambda b, k, o: b.operate_and_read(o, [Write("a", 9)], (k, [Read("a")], "a condition")),
        lambda b, k, o: b.batch_read([(o, [Read("a")]), (k, [Write("a", 9)])]),
        lambda b, k, o: b.batch_read([(o, [Read("a")]), (k, [7])]),
    ],
)
def test_a_malformed_command_among_others_is_a_usage_error_and_none_of_them_is_applied(
    store: Store, key: RecordKey, call: Any
) -> None:
    other = RecordKey("test", "backend-tests", uuid.uuid4().hex)
    store.backend.put(key, {"a": 1})
    store.backend.put(other, {"a": 1})
    try:
        with pytest.raises(errors.BackendUsageError):
            call(store.backend, key, other)
        assert [r.bins for r in store.backend.batch_get([key, other])] == [{"a": 1}, {"a": 1}]  # type: ignore[union-attr]
    finally:
        store.backend.remove(other)


def test_commands_at_the_edges_of_the_batch_calls_read_alike_on_every_store(
    store: Store, key: RecordKey
) -> None:
    backend = store.backend
    other = RecordKey("test", "backend-tests", uuid.uuid4().hex)
    backend.put(key, {"n": 1})
    backend.put(other, {"n": 1})
    try:
        backend.operate(key, [ListSet("fresh", 0, "a")])  # a list write makes its missing bin
        assert backend.get(key).bins == {"n": 1, "fresh": ["a"]}  # type: ignore[union-attr]
        with pytest.raises(errors.BackendUsageError):  # the read beside a command only reads
            backend.operate_and_read(key, [Write("x", 1)], (other, [Write("n", 2)], None))
        with pytest.raises(errors.BackendUsageError):  # no command without an operation
            backend.operate_each([(other, [Write("n", 3)], None), (key, [], None)])
        with pytest.raises(errors.BinNameError):
            backend.batch_read([(key, [Read("b" * 16)])])
        assert [r.bins for r in backend.batch_get([key, other])] == [  # type: ignore[union-attr]
            {"n": 1, "fresh": ["a"]},
            {"n": 1},
        ]
    finally:
        backend.remove(other)


def test_a_read_sees_the_bin_as_it_was_before_the_list_write_after_it(store: Store, key: RecordKey) -> None:
    store.backend.put(key, {"l": [1, 2, 3]})
    assert store.backend.operate(key, [Read("l"), ListSet("l", 0, 7), Read("l")]) == {"l": [7, 2, 3]}
    assert store.backend.operate(key, [Read("l"), ListSet("l", 1, 8)]) == {"l": [7, 2, 3]}
    assert store.backend.get(key).bins == {"l": [7, 8, 3]}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "write",
    [ListSetRange("l", 0, [9]), Compute("n", add(IntBin("n"), 1))],
    ids=["ListSetRange", "Compute"],
)
def test_a_bin_read_and_then_written_where_aerospike_would_lose_the_read_is_refused(
    store: Store, key: RecordKey, write: Any
) -> None:
    store.backend.put(key, {"l": [1, 2, 3], "n": 5})
    with pytest.raises(errors.BackendUsageError, match="read and then written"):
        store.backend.operate(key, [Increment("n", 1), Read(write.bin), write])
    assert store.backend.get(key).bins == {"l": [1, 2, 3], "n": 5}  # type: ignore[union-attr]
    never = eq(IntBin("n"), 99)
    with pytest.raises(errors.BackendUsageError, match="read and then written"):  # refused before the guard
        store.backend.operate(key, [Read(write.bin), write], condition=never)
    with pytest.raises(errors.BackendUsageError, match="read and then written"):  # ... and the record
        store.backend.operate(RecordKey("test", key.set_name, "nothing-here"), [Read(write.bin), write])
    assert store.backend.operate(key, [write, Read(write.bin)])  # read after it: taken, and read back


def test_a_command_with_no_operation_is_a_usage_error_on_every_store(store: Store, key: RecordKey) -> None:
    store.backend.put(key, {"n": 1})
    with pytest.raises(errors.BackendUsageError):  # each store says it in its own words
        store.backend.operate(key, [])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_childs_writes_outlive_the_parent_closing_its_store(tmp_path: Path) -> None:
    """The child's own connection takes its own file locks: the parent's close, seeing them, leaves the
    write-ahead log the child writes into where later readers find it."""
    path = tmp_path / "forked.db"
    backend = EmbeddedBackend(path)
    backend.put(RecordKey("test", "forked", "before"), {"n": 0})
    wrote, closed = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one write, then more once the parent has closed its store
        code = 1
        try:
            backend.put(RecordKey("test", "forked", "k0"), {"n": 0})
            os.write(wrote[1], b"x")
            os.read(closed[0], 1)
            for n in range(1, 20):
                backend.put(RecordKey("test", "forked", f"k{n}"), {"n": n})
            code = 0
        finally:
            os._exit(code)
    os.read(wrote[0], 1)
    backend.close()
    os.write(closed[1], b"x")
    assert os.waitpid(pid, 0)[1] == 0
    later = EmbeddedBackend(path)  # a process that comes later, as it finds the file
    found = [later.get(RecordKey("test", "forked", f"k{n}")) for n in range(20)]
    assert [record.bins["n"] if record else None for record in found] == list(range(20))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_while_another_thread_is_inside_a_command_can_use_the_store(tmp_path: Path) -> None:
    backend = EmbeddedBackend(tmp_path / "forked.db")
    key = RecordKey("test", "forked", "k")
    backend.put(key, {"n": 1})
    inside, leave = threading.Event(), threading.Event()

    def in_a_command() -> None:
        with backend._lock:  # as a thread is while its command runs
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=in_a_command)
    thread.start()
    assert inside.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: its copy of the lock was held by a thread it does not have
        code = 1
        try:
            record = backend.get(key)
            backend.put(key, {"n": 2})
            code = 0 if record is not None and record.bins == {"n": 1} else 3
        finally:
            os._exit(code)
    leave.set()
    thread.join()
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the store")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert backend.get(key).bins == {"n": 2}  # type: ignore[union-attr]


def test_a_guarded_write_waiting_for_another_writer_holds_no_snapshot_a_checkpoint_waits_for(
    tmp_path: Path,
) -> None:
    path = tmp_path / "waits.db"
    writer, other = EmbeddedBackend(path), EmbeddedBackend(path, busy_timeout=5.0)
    key = RecordKey("test", "waits", "k")
    writer.put(key, {"n": 1})
    with pytest.raises(
        errors.ConditionNotMetError
    ):  # refused once: its next guarded write starts as a reader
        writer.operate(key, [Write("n", 2)], condition=eq(IntBin("n"), 9))
    other._writer_lock(True)  # another process writes (compact(), say)
    written: list[object] = []
    thread = threading.Thread(
        target=lambda: written.append(writer.operate(key, [Write("n", 2)], condition=eq(IntBin("n"), 1)))
    )
    thread.start()
    time.sleep(0.3)  # the guarded write waits for the writer lock now
    assert other._conn is not None
    started = time.monotonic()
    busy, _, _ = other._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0 and time.monotonic() - started < 2  # no reader held it up for the busy timeout
    other._writer_lock(False)
    thread.join(10)
    assert written == [{}] and writer.get(key).bins == {"n": 2}  # type: ignore[union-attr]


def test_removing_an_expired_record_says_there_was_none(store: Store, key: RecordKey) -> None:
    store.backend.put(key, {"n": 1}, ttl=1)
    store.advance(2.5)
    assert store.backend.get(key) is None
    removed = store.backend.remove(key)
    if store.kind == "embedded":  # Aerospike says True until its expiry thread has reaped the record
        assert removed is False
    assert store.backend.get(key) is None and store.backend.remove(key) is False


def test_a_replacing_put_that_would_remove_a_bin_is_refused_and_keeps_the_record(
    store: Store, key: RecordKey
) -> None:
    store.backend.put(key, {"a": 1, "b": 2})
    for bins in ({"a": None}, {"a": None, "c": 3}):
        with pytest.raises(errors.BackendUsageError):
            store.backend.put(key, bins, mode=WriteMode.REPLACE)
    assert store.backend.get(key).bins == {"a": 1, "b": 2}  # type: ignore[union-attr]
    with pytest.raises(errors.BackendUsageError):  # a read of no bin, as well
        store.backend.get(key, [])


def test_generations_go_from_the_last_to_one_as_on_aerospike(tmp_path: Path) -> None:
    backend = EmbeddedBackend(tmp_path / "generations.db")
    key = RecordKey("test", "generations", "k")
    backend.put(key, {"n": 1})
    assert backend._conn is not None
    backend._conn.execute("UPDATE records SET generation=65534")  # as after 65,533 more writes
    backend.put(key, {"n": 2})
    assert backend.get(key).generation == 65535  # type: ignore[union-attr]
    backend.operate(key, [Write("n", 3)])
    assert backend.get(key).generation == 1  # type: ignore[union-attr]
    backend.put(key, {"n": 4}, generation=1)  # and a write guarded by it goes on
    assert backend.get(key).generation == 2  # type: ignore[union-attr]


def test_compacting_a_file_that_is_no_store_any_more_is_a_store_file_error(tmp_path: Path) -> None:
    backend = EmbeddedBackend(tmp_path / "compacted.db")
    backend.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path}/compacted.db{suffix}").unlink(missing_ok=True)
    (tmp_path / "compacted.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(errors.StoreFileError):
        backend.compact()


def test_a_write_to_a_store_file_deleted_while_open_is_refused_not_lost(tmp_path: Path) -> None:
    path = tmp_path / "deleted.db"
    backend = EmbeddedBackend(path)
    key = RecordKey("test", "deleted", "k")
    backend.put(key, {"n": 1})
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with pytest.raises(errors.StoreFileError, match="deleted or replaced while this process had it open"):
        backend.put(key, {"n": 2})
    backend.put(key, {"n": 3})  # the next command opens the file at the path: a new store
    assert EmbeddedBackend(path).get(key).bins == {"n": 3}  # type: ignore[union-attr]


def _read_until(stop: threading.Event, queue: Queue, raised: list[BaseException]) -> None:
    while not stop.is_set():
        try:
            queue.info()
        except BaseException as exc:  # every failure is looked at by the caller
            raised.append(exc)


def test_a_store_closed_while_threads_are_inside_its_calls_ends_them_with_library_errors(
    place: Place,
) -> None:
    # The Aerospike client ends the process (SIGSEGV) when closed under another thread's call:
    # closing waits for the calls under way, and later calls are refused before the client.
    name = place.name("closing")
    for _ in range(5):  # the crash came about one close in three
        backend = place.connect()
        queue = (
            Queue.open(backend, name)
            if name in Queue.names(backend)
            else Queue.create(backend, name, capacity=10)
        )
        stop = threading.Event()
        raised: list[BaseException] = []
        threads = [threading.Thread(target=_read_until, args=(stop, queue, raised)) for _ in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(0.05)
        backend.close()
        time.sleep(0.05)
        stop.set()
        for thread in threads:
            thread.join()
        assert all(isinstance(exc, errors.LargeQueueError) for exc in raised), raised
        if place.kind == "aerospike":  # a closed client stays closed; the embedded store opens its file again
            assert raised and all(isinstance(exc, errors.BackendUnavailableError) for exc in raised)
            with pytest.raises(errors.BackendUnavailableError, match="was closed"):
                queue.info()
            with pytest.raises(errors.BackendUnavailableError, match="was closed"):
                Queue.names(backend)  # a scan, not a record command: refused alike


def test_a_comparison_on_a_missing_bin_or_another_type_is_not_met(store: Store) -> None:
    """As on Aerospike (the filter expression is unknown: FilteredOut), a guard that compares a
    bin the record lacks, or a bin of another type, refuses the write: e.g. a lock whose
    ``lock_ttl`` bin is lost must not count as expired."""
    import uuid

    from large_queue import errors
    from large_queue.backends import Read, RecordKey, Write
    from large_queue.backends.conditions import IntBin, eq, gt, lt

    key = RecordKey("test", "backend-tests", uuid.uuid4().hex)
    backend = store.backend
    backend.put(key, {"n": 1, "s": "x"})
    for condition in (eq(IntBin("absent"), 1), gt(IntBin("n"), IntBin("absent")), lt(IntBin("s"), 5)):
        with pytest.raises(errors.ConditionNotMetError):
            backend.operate(key, [Write("n", 2)], condition=condition)
    assert backend.operate(key, [Read("n")]) == {"n": 1}


class _Interrupting:
    """An SQLite connection that raises ``KeyboardInterrupt`` at one statement: after it ran, or instead."""

    def __init__(self, conn: sqlite3.Connection, statement: str, *, ran: bool) -> None:
        self._conn = conn
        self.statement = statement
        self.ran = ran
        self.armed = False

    def execute(self, sql: str, *args: Any) -> Any:
        if self.armed and sql == self.statement:
            self.armed = False
            if self.ran:
                self._conn.execute(sql, *args)
            raise KeyboardInterrupt
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.mark.parametrize(
    ("statement", "ran", "grouped"),
    [
        ("BEGIN IMMEDIATE", True, True),  # an enqueue's group, just begun
        ("BEGIN IMMEDIATE", True, False),  # one command, just begun
        ("COMMIT", False, True),  # a group at its end, before its commit ran
        ("COMMIT", False, False),
    ],
)
def test_an_interrupt_inside_a_transaction_leaves_the_store_usable_and_nothing_half_kept(
    tmp_path: Path, statement: str, ran: bool, grouped: bool
) -> None:
    backend = EmbeddedBackend(tmp_path / "interrupted.db", busy_timeout=2.0)
    queue = Queue.create(backend, "q", capacity=10)
    queue.enqueue("before")
    conn = backend._connection()
    interrupting = _Interrupting(conn, statement, ran=ran)
    backend._conn = interrupting  # type: ignore[assignment]
    interrupting.armed = True
    with pytest.raises(KeyboardInterrupt):
        if grouped:
            queue.enqueue("interrupted")  # its commands in one group
        else:
            backend.put(RecordKey("test", "other", "k"), {"n": 1})
    assert not conn.in_transaction and backend._group is None
    assert queue.enqueue("after") >= 1  # this handle goes on
    other = EmbeddedBackend(tmp_path / "interrupted.db", busy_timeout=2.0)  # another process's writes too
    assert Queue.open(other, "q").enqueue("from another") >= 2
    values = [e.value for e in Queue.open(other, "q").dequeue_batch(10)]
    assert values == ["before", "after", "from another"]  # the interrupted enqueue: none of it
    assert backend.get(RecordKey("test", "other", "k")) is None
    other.close()
    backend.close()


@pytest.mark.parametrize("left", ["group", "command"])
def test_a_group_or_command_left_without_its_end_is_rolled_back_and_later_writes_are_kept(
    tmp_path: Path, left: str
) -> None:
    # As an interrupt does that lands at the very start of the end, where none of its code runs:
    # the object that would have ended it is dropped with it still open.
    backend = EmbeddedBackend(tmp_path / "left.db", busy_timeout=2.0)
    queue = Queue.create(backend, "q", capacity=10)
    queue.enqueue("before")
    opened = backend.grouped() if left == "group" else backend._transaction(write=True)
    conn = opened.__enter__()
    if left == "command":
        assert conn is not None
        conn.execute("UPDATE records SET generation = generation")  # a write under way
    del opened, conn  # its end never runs
    assert queue.enqueue("after") == 1  # not joined to what was left open: committed on its own
    done = threading.Thread(target=lambda: queue.enqueue("another thread"))  # the locks were let go
    done.start()
    done.join(10)
    assert not done.is_alive()
    other = EmbeddedBackend(tmp_path / "left.db", busy_timeout=2.0)  # another process sees them
    assert [e.value for e in Queue.open(other, "q").dequeue_batch(10)] == [
        "before",
        "after",
        "another thread",
    ]
    other.close()
    backend.close()


def test_a_call_left_counted_by_an_interrupt_does_not_hold_up_the_close(place: Place) -> None:
    if place.kind != "aerospike":
        pytest.skip(
            "only the Aerospike store counts its calls under way (its client must not close under one)"
        )
    backend = place.connect()
    backend._calls.__enter__()  # a call an interrupt cut short: its end never ran
    ended = threading.Thread(target=backend._calls.__enter__)  # ... in a thread that has ended since
    ended.start()
    ended.join()
    started = time.monotonic()
    backend.close()
    assert time.monotonic() - started < 5  # not the minute it waits for calls other threads have under way
    with pytest.raises(errors.BackendUnavailableError):
        backend.get(RecordKey("test", "closing", "k"))


class _FailingWrite:
    """An SQLite connection whose ``nth`` write statement (INSERT/UPDATE/DELETE) fails: ``raising``
    after it ran, or instead of it."""

    def __init__(self, conn: sqlite3.Connection, nth: int, raising: BaseException, *, ran: bool) -> None:
        self._conn = conn
        self.left = nth
        self.raising = raising
        self.ran = ran
        self.armed = False

    def execute(self, sql: str, *args: Any) -> Any:
        if self.armed and sql.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            self.left -= 1
            if self.left == 0:
                self.armed = False
                if self.ran:
                    self._conn.execute(sql, *args)
                raise self.raising
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_an_interrupt_after_a_commands_write_ran_keeps_none_of_it(tmp_path: Path) -> None:
    """An interrupt inside a command, before its commit ran, rolls it back: nothing of it is kept."""
    backend = EmbeddedBackend(tmp_path / "s.db", busy_timeout=2.0)
    key = RecordKey("test", "probe", "k")
    conn = backend._connection()
    failing = _FailingWrite(conn, 1, KeyboardInterrupt(), ran=True)
    backend._conn = failing  # type: ignore[assignment]
    failing.armed = True
    with pytest.raises(KeyboardInterrupt):
        backend.put(key, {"n": 1})  # its write ran; the interrupt lands before the commit
    assert not conn.in_transaction
    other = EmbeddedBackend(tmp_path / "s.db", busy_timeout=2.0)
    assert other.get(key) is None and backend.get(key) is None
    other.close()
    backend.close()


def test_a_failure_of_sqlite_inside_a_group_rolls_the_whole_group_back(tmp_path: Path) -> None:
    """A failure of SQLite itself (a full disk) rolls the whole group back, and is reported.

    An enqueue is a group of a reservation and a publish: the publish failing
    leaves no reservation (no hole) behind.
    """
    backend = EmbeddedBackend(tmp_path / "s.db", busy_timeout=2.0)
    queue = Queue.create(backend, "q", capacity=10, appends="reserve")
    queue.enqueue("before")
    conn = backend._connection()
    full = sqlite3.OperationalError("database or disk is full")
    failing = _FailingWrite(conn, 2, full, ran=False)  # the reservation's write, then the publish's
    backend._conn = failing  # type: ignore[assignment]
    failing.armed = True
    with pytest.raises(errors.StoreFileError):
        queue.enqueue("lost")
    assert not failing.armed  # the second write did fail
    backend._conn = conn
    other = EmbeddedBackend(tmp_path / "s.db", busy_timeout=2.0)
    info = Queue.open(other, "q").info()
    assert (info.tail_offset, info.reserved_tail) == (1, 1)  # nothing of the failed enqueue was kept
    other.close()
    backend.close()


def test_a_file_sqlite_itself_finds_locked_past_busy_timeout_is_busy_not_damaged(tmp_path: Path) -> None:
    """Writers wait for the file up to ``busy_timeout``, then fail with ``BackendBusyError``:
    also where the lock is SQLite's own (another program's transaction on the file)."""
    path = tmp_path / "s.db"
    backend = EmbeddedBackend(path, busy_timeout=0.3)
    key = RecordKey("test", "probe", "k")
    backend.put(key, {"n": 1})
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another program writing the file, past the store's lock
    try:
        with pytest.raises(errors.BackendBusyError):
            backend.put(key, {"n": 2})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    backend.put(key, {"n": 3})
    assert backend.get(key).bins == {"n": 3}  # type: ignore[union-attr]
    backend.close()


def test_a_write_beside_a_damaged_records_read_is_answered_and_not_in_doubt(store: Store) -> None:
    """The write's own answer stands beside a read of a damaged record: not a failure, nor in doubt."""
    written = RecordKey("test", "backend-tests", uuid.uuid4().hex)
    damaged = RecordKey("test", "backend-tests", uuid.uuid4().hex)
    store.backend.put(written, {"n": 1})
    store.backend.put(damaged, {"slots": [1], "head": 0})
    store.damage(damaged)
    try:
        bins, seen = store.backend.operate_and_read(
            written, [Increment("n", 1), Read("n")], (damaged, [Read("head")], None)
        )
        assert (bins, seen) == ({"n": 2}, None)
        assert store.backend.get(written).bins == {"n": 2}  # type: ignore[union-attr]
    finally:
        store.backend.remove(written)
        store.backend.remove(damaged)


def test_a_read_only_store_file_error_says_when_the_directory_is_what_cannot_be_written(
    tmp_path: Path,
) -> None:
    from large_queue.backends._transactions import store_file_error

    readonly = sqlite3.OperationalError("attempt to write a readonly database")
    assert "is read-only: attempt" in str(store_file_error(tmp_path / "s.db", readonly))
    shut = tmp_path / "gone" / "s.db"  # a directory no one can write into (there is none)
    said = str(store_file_error(shut, readonly))
    assert f"its directory {shut.parent} is not writable" in said and isinstance(
        store_file_error(shut, readonly), errors.StoreFileError
    )


def test_a_store_file_with_several_names_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """SQLite keeps the write-ahead log beside the name: two hard-linked names are two logs over one
    file, whose writes overwrite each other (acknowledged entries lost, or the file damaged)."""
    first = tmp_path / "a.db"
    store = EmbeddedBackend(first)
    queue = Queue.create(store, "q", capacity=10)
    queue.enqueue(1)
    os.link(first, tmp_path / "b.db")
    with pytest.raises(errors.StoreFileError, match="has 2 names \\(hard links\\)"):
        Queue.open(EmbeddedBackend(tmp_path / "b.db"), "q")
    with pytest.raises(errors.StoreFileError, match="has 2 names"):  # the store already open: its next write
        queue.enqueue(2)
    os.unlink(tmp_path / "b.db")
    queue.enqueue(3)
    assert [entry.value for entry in queue.dequeue_batch(10)] == [1, 3]
    os.symlink(first, tmp_path / "c.db")  # a symbolic link is the same name to SQLite: fine
    assert Queue.open(EmbeddedBackend(tmp_path / "c.db"), "q").info().size == 0
    store.close()


def test_a_delete_through_a_store_without_the_buffers_namespace_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ns.db"
    both = EmbeddedBackend(path, namespaces=("a", "b"))
    queue = Queue.create(both, "q", capacity=100, namespace="a", buffer_namespace="b")
    queue.enqueue(1)
    with pytest.raises(errors.NamespaceNotFoundError, match="'b'"):
        Queue.delete(EmbeddedBackend(path, namespaces=("a",)), "q", namespace="a")
    assert Queue.open(both, "q", namespace="a").dequeue().value == 1  # type: ignore[union-attr]
    assert Queue.delete(both, "q", namespace="a")


def _made_anew(path: str) -> None:
    queue = Queue.create(EmbeddedBackend(path), "q", capacity=100)
    queue.enqueue_batch(["b", "c"])


def test_a_process_that_only_reads_finds_its_file_deleted_and_made_anew(tmp_path: Path) -> None:
    """A consumer polling an empty queue only reads: it found out only at a write, so it read the
    deleted file for ever while the file at the path filled up."""
    path = tmp_path / "s.db"
    queue = Queue.create(EmbeddedBackend(path), "q", capacity=100)
    queue.enqueue("a")
    assert queue.dequeue().value == "a"  # type: ignore[union-attr]
    assert queue.dequeue(timeout=0.2) is None  # idle: reads only from here on
    for made in tmp_path.iterdir():
        made.unlink()
    maker = multiprocessing.get_context("fork").Process(target=_made_anew, args=(str(path),))
    maker.start()
    maker.join()
    deadline = time.monotonic() + 10
    with pytest.raises(errors.StoreFileError, match="was deleted or replaced"):
        while time.monotonic() < deadline:
            queue.dequeue(timeout=0.2)
    with pytest.raises(errors.QueueNotFoundError, match="created again"):  # the new file: another queue
        queue.dequeue(timeout=0.2)
    assert [e.value for e in Queue.open(EmbeddedBackend(path), "q").dequeue_batch(5)] == ["b", "c"]


def test_a_queue_whose_first_buffer_record_is_damaged_can_still_be_deleted(tmp_path: Path) -> None:
    path = tmp_path / "e.db"
    store = EmbeddedBackend(path)
    Queue.create(store, "q", capacity=100, slots_per_record=10).enqueue_batch(list(range(5)))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE records SET bins = ? WHERE user_key LIKE '%buffer-0'", (b"\xc1garbage",))
    assert Queue.delete(store, "q")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM records").fetchone() == (0,)


def test_a_reader_that_may_not_create_the_file_does_not_make_it_anew_once_it_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Queue.create(EmbeddedBackend(path), "q", capacity=100).enqueue("a")
    queue = Queue.open(EmbeddedBackend(path, create=False), "q")
    assert queue.info().size == 1
    for made in tmp_path.iterdir():
        made.unlink()
    time.sleep(1.1)  # past the reader's next look at the file
    with pytest.raises(errors.StoreFileError, match="was deleted or replaced"):
        queue.info()
    with pytest.raises(errors.StoreFileError, match="there is no store file at"):
        queue.info()
    assert list(tmp_path.iterdir()) == []


def test_a_reader_goes_on_while_the_file_has_another_name_which_only_writes_refuse(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    queue = Queue.create(EmbeddedBackend(path), "q", capacity=100)
    queue.enqueue("a")
    os.link(path, tmp_path / "backup.db")
    time.sleep(1.1)  # past the reader's next look at the file
    assert queue.info().size == 1 and queue.get(0).value == "a"  # type: ignore[union-attr]
    with pytest.raises(errors.StoreFileError, match="has 2 names"):
        queue.enqueue("b")


def test_a_store_opened_through_a_symbolic_link_shares_the_files_writer_lock(tmp_path: Path) -> None:
    """SQLite names the log after the file a link points to; the writer lock goes with it too, so a
    process using the link does not wait out SQLite's busy timeout behind one using the file's name."""
    path = str(tmp_path / "real.db")
    os.symlink(path, tmp_path / "link.db")
    queue = Queue.create(EmbeddedBackend(path, busy_timeout=3.0), "q", capacity=1000, slots_per_record=10)
    queue.enqueue_batch(list(range(100)))
    with _a_writer_stopped_inside_a_command(path):
        linked = Queue.open(EmbeddedBackend(tmp_path / "link.db", busy_timeout=3.0), "q")
        started = time.monotonic()
        assert linked.info().size == 100
        assert time.monotonic() - started < 1.5  # its hint write does not wait for the lock
        with pytest.raises(errors.BackendBusyError, match="stayed locked by another process"):
            linked.enqueue("late")  # the store's own writer lock, the one the stopped process holds
