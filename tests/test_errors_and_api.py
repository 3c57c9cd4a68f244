"""The error tree, its mapping from the Aerospike client, pickling, and the public API."""

from __future__ import annotations

import inspect
import math
import os
import pickle
from pathlib import Path

import pytest
from aerospike import exception as aerospike_exception

import large_queue
from large_queue import errors
from large_queue.backends import connect
from large_queue.backends._aerospike_compile import compile_condition
from large_queue.backends.aerospike import translate
from large_queue.backends.conditions import (
    UNKNOWN,
    BinExists,
    Bound,
    Clock,
    IntBin,
    ListRangeMax,
    MapItem,
    MapKeyCount,
    Not,
    NowMs,
    Param,
    SinceUpdateMs,
    StrBin,
    add,
    all_of,
    any_of,
    eq,
    evaluate,
    gt,
    le,
    lt,
    max_of,
    sub,
)
from large_queue.backends.embedded import EmbeddedBackend

EXPECTED_BY_CLIENT_CLASS = {
    "RecordNotFound": errors.RecordNotFoundError,
    "RecordGenerationError": errors.GenerationMismatchError,
    "RecordExistsError": errors.RecordExistsError,
    "RecordTooBig": errors.RecordTooLargeError,
    "BinNameError": errors.BinNameError,
    "FilteredOut": errors.ConditionNotMetError,
    "NamespaceNotFound": errors.NamespaceNotFoundError,
    "TimeoutError": errors.BackendTimeoutError,
    "ClusterError": errors.BackendUnavailableError,
    "ConnectionError": errors.BackendUnavailableError,
    "RecordBusy": errors.BackendBusyError,
    "DeviceOverload": errors.BackendBusyError,
    "ParamError": errors.BackendUsageError,
    "BinIncompatibleType": errors.BinTypeError,
    "ServerError": errors.BackendError,
}


@pytest.mark.parametrize(("client_class", "expected"), EXPECTED_BY_CLIENT_CLASS.items())
def test_client_exceptions_map_to_our_tree(client_class: str, expected: type) -> None:
    cls = getattr(aerospike_exception, client_class)
    original = cls(cls.code, "server said no", "file.c", 1, client_class == "TimeoutError")
    mapped = translate(original)
    assert type(mapped) is expected
    assert mapped.code == cls.code
    assert mapped.in_doubt is (client_class == "TimeoutError")
    assert "server said no" in str(mapped)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Unable to serialize unknown Python native type.", errors.BackendUsageError),  # a value no bin holds
        ("Failed to deserialize the record", errors.CorruptRecordError),
        ("Failed to connect", errors.BackendUnavailableError),
    ],
)
def test_a_client_error_is_told_apart_by_what_failed(message: str, expected: type) -> None:
    mapped = translate(aerospike_exception.ClientError(-1, message, "file.c", 1, False))
    assert type(mapped) is expected
    assert message in str(mapped)


def test_translation_reads_the_error_itself_not_its_class() -> None:
    """The client keeps the last raised error's details on the class: they must not leak into another's."""
    cls = aerospike_exception.RecordNotFound
    with pytest.raises(cls) as raised:  # a real client error: it sets the class's details
        raise cls(2, "the real one", "file.c", 1, True)
    cls.msg, cls.in_doubt = "an earlier error", False  # as the client leaves them after another raise
    mapped = translate(raised.value)
    assert ("the real one" in str(mapped), mapped.in_doubt) == (True, True)


def _error_classes() -> list[type[errors.LargeQueueError]]:
    return [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.LargeQueueError)
    ]


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_errors_pickle_with_details(cls: type[errors.LargeQueueError]) -> None:
    error = cls("something failed", txn_id="t-1", in_doubt=True, code=9)
    restored = pickle.loads(pickle.dumps(error))
    assert type(restored) is cls
    assert (restored.reason, restored.txn_id, restored.in_doubt, restored.code) == (
        "something failed",
        "t-1",
        True,
        9,
    )
    assert isinstance(restored, large_queue.ASAborted)


def test_public_names() -> None:
    public = {
        name
        for name, member in vars(large_queue).items()
        if not name.startswith("_") and not inspect.ismodule(member) and name != "annotations"
    }
    assert sorted(large_queue.__all__) == large_queue.__all__
    assert set(large_queue.__all__) == public


def test_public_functions_have_docstrings() -> None:
    import large_queue._lifecycle
    import large_queue._txn
    import large_queue.appends._prefix
    import large_queue.appends._reader
    import large_queue.backends._aerospike_compile
    import large_queue.backends.aerospike
    import large_queue.backends.embedded
    import large_queue.backends.faults
    import large_queue.cli
    import large_queue.cluster
    import large_queue.producer

    modules = [
        large_queue,
        large_queue.queue,
        large_queue._txn,
        large_queue._lifecycle,
        large_queue.producer,
        large_queue.appends,
        large_queue.appends._prefix,
        large_queue.appends._reader,
        large_queue.lock,
        large_queue.fencing,
        large_queue.errors,
        large_queue.backends,
        large_queue.backends.embedded,
        large_queue.backends.aerospike,
        large_queue.backends._aerospike_compile,
        large_queue.backends.conditions,
        large_queue.backends.faults,
        large_queue.cli,
        large_queue.cluster,
        large_queue.cluster._consumer,
        large_queue.cluster._ownership,
    ]
    missing = []
    for module in modules:
        assert module.__doc__, module.__name__
        for name, member in inspect.getmembers(module):
            if name.startswith("_") or getattr(member, "__module__", None) != module.__name__:
                continue
            if not inspect.getdoc(member):
                missing.append(f"{module.__name__}.{name}")
            if inspect.isclass(member):
                for attr, method in vars(member).items():
                    if not attr.startswith("_") and inspect.isfunction(method) and not method.__doc__:
                        missing.append(f"{module.__name__}.{name}.{attr}")
    assert missing == []


def AT(since_update_ms: int) -> Clock:
    return Clock(now_ms=0, since_update_ms=since_update_ms)


def test_conditions_follow_aerospike_three_valued_logic() -> None:
    bins = {"n": 5, "s": "x"}
    assert evaluate(eq(IntBin("n"), 5), bins, AT(0)) is True
    assert evaluate(eq(IntBin("missing"), 5), bins, AT(0)) is UNKNOWN
    assert evaluate(eq(IntBin("s"), 5), bins, AT(0)) is UNKNOWN  # type mismatch
    assert evaluate(any_of(eq(IntBin("missing"), 1), eq(StrBin("s"), "x")), bins, AT(0)) is True
    assert evaluate(all_of(eq(IntBin("missing"), 1), eq(StrBin("s"), "x")), bins, AT(0)) is UNKNOWN
    assert evaluate(all_of(lt(IntBin("n"), 1), eq(IntBin("missing"), 1)), bins, AT(0)) is False
    assert evaluate(Not(eq(IntBin("missing"), 1)), bins, AT(0)) is UNKNOWN
    assert evaluate(gt(SinceUpdateMs(), IntBin("n")), bins, AT(6)) is True
    assert evaluate(le(SinceUpdateMs(), IntBin("n")), bins, AT(6)) is False
    assert evaluate(BinExists("s"), bins, AT(0)) is True
    # arithmetic, the store's clock and list items, unknown where Aerospike's would be
    assert evaluate(le(sub(IntBin("n"), 2), 3), bins, AT(0)) is True
    assert evaluate(eq(max_of(IntBin("n"), 9, add(1, 2)), 9), bins, AT(0)) is True
    assert evaluate(eq(add(IntBin("missing"), 1), 1), bins, AT(0)) is UNKNOWN
    assert evaluate(gt(sub(NowMs(), IntBin("n")), 994), bins, Clock(now_ms=1000, since_update_ms=0)) is True
    slots = {"slots": [[-1], [7, "v", 0], [3]], "bad": [[1], None]}
    assert evaluate(eq(ListRangeMax("slots", 0, 3), 7), slots, AT(0)) is True
    assert evaluate(lt(ListRangeMax("slots", 2, 1), 4), slots, AT(0)) is True
    assert evaluate(eq(ListRangeMax("slots", 5, 1), 1), slots, AT(0)) is UNKNOWN  # out of range
    assert evaluate(eq(ListRangeMax("bad", 0, 2), 1), slots, AT(0)) is UNKNOWN  # an item is no list


def test_templates_compile_once_and_take_each_binding_s_values() -> None:
    log = {"log": {"t1": [5, 16], "t2": [6, "x"]}, "n": 3}
    first_is = eq(MapItem("log", Param("k"), 1), Param("f"))  # one template, bound per command
    assert evaluate(Bound(first_is, {"k": "t1", "f": 16}), log, AT(0)) is True
    assert evaluate(Bound(first_is, {"k": "t1", "f": 17}), log, AT(0)) is False
    assert evaluate(Bound(first_is, {"k": "t2", "f": 16}), log, AT(0)) is UNKNOWN  # not an int
    assert evaluate(Bound(first_is, {"k": "t9", "f": 16}), log, AT(0)) is UNKNOWN  # no such key
    assert evaluate(eq(MapKeyCount("log", "t2"), 1), log, AT(0)) is True
    assert evaluate(eq(MapKeyCount("n", "t2"), 0), log, AT(0)) is UNKNOWN  # not a map
    nested = any_of(Bound(lt(IntBin("n"), Param("m")), {"m": 4}), eq(IntBin("missing"), 1))
    assert evaluate(nested, log, AT(0)) is True
    assert evaluate(Not(nested), log, AT(0)) is False
    with pytest.raises(TypeError, match="has no value: bind the template"):
        evaluate(first_is, log, AT(0))
    with pytest.raises(TypeError, match="not a condition"):
        evaluate(IntBin("n"), log, AT(0))  # type: ignore[arg-type]
    for n in range(3):  # a condition built anew for each command: compiled as it comes
        assert evaluate(eq(IntBin("n"), n), {"n": 1}, AT(0)) is (n == 1)


def test_conditions_compile_to_the_clients_filter_expressions() -> None:
    from aerospike_helpers import expressions as exp

    condition = any_of(
        eq(StrBin("owner"), ""),
        all_of(
            gt(SinceUpdateMs(), IntBin("ttl")), Not(BinExists("x")), le(IntBin("c"), 3), lt(IntBin("c"), 9)
        ),
    )
    expected = exp.Or(
        exp.Eq(exp.StrBin("owner"), ""),
        exp.And(
            exp.GT(exp.SinceUpdateTime(), exp.IntBin("ttl")),
            exp.Not(exp.BinExists("x")),
            exp.LE(exp.IntBin("c"), 3),
            exp.LT(exp.IntBin("c"), 9),
        ),
    ).compile()
    assert compile_condition(condition) == expected
    assert compile_condition(eq(IntBin("n"), 5)) == exp.Eq(exp.IntBin("n"), 5).compile()
    assert (
        compile_condition(le(sub(NowMs(), max_of(IntBin("a"), add(IntBin("b"), 1))), 3))
        == exp.LE(
            exp.Sub(
                exp.Add(exp.Div(exp.LastUpdateTime(), 1_000_000), exp.SinceUpdateTime()),
                exp.Max(exp.IntBin("a"), exp.Add(exp.IntBin("b"), 1)),
            ),
            3,
        ).compile()
    )
    import aerospike

    items = exp.ListGetByIndexRange(None, aerospike.LIST_RETURN_VALUE, 1, 2, exp.ListBin("slots"))
    top = exp.ListGetByRank(None, aerospike.LIST_RETURN_VALUE, exp.ResultType.LIST, -1, items)
    leading = exp.ListGetByIndex(None, aerospike.LIST_RETURN_VALUE, exp.ResultType.INTEGER, 0, top)
    assert compile_condition(lt(ListRangeMax("slots", 1, 2), 3)) == exp.LT(leading, 3).compile()


def test_bound_templates_compile_and_evaluate_as_their_literal_conditions() -> None:
    template = any_of(
        eq(StrBin("owner"), Param("owner")), all_of(le(IntBin("c"), Param("limit")), BinExists("x"))
    )
    for values in ({"owner": "a", "limit": 3}, {"owner": "b", "limit": 9}):
        literal = any_of(
            eq(StrBin("owner"), values["owner"]), all_of(le(IntBin("c"), values["limit"]), BinExists("x"))
        )
        bound = Bound(template, values)
        assert compile_condition(bound) == compile_condition(literal)
        for bins in ({"owner": "a"}, {"c": 5, "x": 1}, {"owner": "b", "c": 2}):
            assert evaluate(bound, bins, AT(0)) is evaluate(literal, bins, AT(0))
    with pytest.raises(TypeError, match="bind it"):
        compile_condition(template)


def test_connect_urls(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = connect(f"embedded://{tmp_path}/a.db?namespaces=one,two&record_size_limit=65536")
    assert isinstance(backend, EmbeddedBackend)
    assert backend.namespaces == {"one", "two"} and backend.record_size_limit == 65536
    assert connect(f"embedded://{tmp_path}/a.db?busy_timeout_ms=250")._busy_timeout == 0.25  # type: ignore[attr-defined]
    assert connect(f"embedded://{tmp_path}/a.db?busy_timeout_ms=0")._busy_timeout == 0  # type: ignore[attr-defined]
    for bad in (-1, math.nan, math.inf, True, "5"):
        with pytest.raises(errors.InvalidArgumentError, match="busy_timeout must be a number of seconds"):
            EmbeddedBackend(f"{tmp_path}/a.db", busy_timeout=bad)  # type: ignore[arg-type]
    monkeypatch.setenv("LARGE_QUEUE_URL", f"embedded://{tmp_path}/b.db")
    assert isinstance(connect(), EmbeddedBackend)
    assert connect(backend) is backend
    for bad, message in [
        ("redis://x", "unknown store URL"),
        ("embedded://", "names no file"),
        ("aerospike://:3000/test", "not host:port"),
        (f"embedded://{tmp_path}/a%00b.db", r"a NUL character \(%00\)"),
        (f"embedded://{tmp_path}/c.db?record_size_limit=big", "not a positive integer"),
        ("embedded://tmp/x.db", r"names a host \('tmp'\).* use embedded:///tmp/x.db \(three slashes\)"),
        (f"embedded://{tmp_path}/d.db?namespace=x", r"unknown parameter\(s\) namespace in"),
        (f"embedded://{tmp_path}/e.db?namespaces=a,,b", "names an empty namespace"),
        ("aerospike://127.0.0.1:1/test?timeout=5", r"unknown parameter\(s\) timeout in .* timeout_ms"),
        ("aerospike://127.0.0.1:1/test?timeout_ms=0", "not a positive integer"),
        ("aerospike://127.0.0.1:1/test?timeout_ms=-5", "not a positive integer"),
        (f"embedded://{tmp_path}/g.db?record_size_limit=0", "not a positive integer"),
        ("aerospike://127.0.0.1:0/test", "a port from 1 to 65535"),
        ("aerospike://127.0.0.1:99999/test", "a port from 1 to 65535"),
        ("aerospike://127.0.0.1:\u00b3/test", "not host:port"),
        ("aerospike://127.0.0.1:4333/test?tls_name=db.example", "without cafile="),
        (f"embedded://{tmp_path}/queue#1.db", "holds a '#'.*%23"),
        (f"embedded://{tmp_path}/h.db?namespaces=", "namespaces= .* is blank"),
        (f"embedded://{tmp_path}/h.db?synchronous=", "synchronous= .* is blank"),
        (f"embedded://{tmp_path}/h.db?synchronous=full&synchronous=normal", "given 2 times"),
        (
            f"embedded://{tmp_path}/h.db?busy_timeout=5",
            r"unknown parameter\(s\) busy_timeout in .* busy_timeout_ms",
        ),
        (f"embedded://{tmp_path}/h.db?busy_timeout_ms=-1", "not a number of milliseconds from 0 to 86400000"),
        (
            f"embedded://{tmp_path}/h.db?busy_timeout_ms=86400001",
            "not a number of milliseconds from 0 to 86400000",
        ),
        (f"embedded://{tmp_path}/h.db?busy_timeout_ms={'9' * 5000}", "not a number of milliseconds"),
        (f"embedded://{tmp_path}/h.db?record_size_limit={'9' * 5000}", "not a positive integer"),
    ]:
        with pytest.raises(errors.InvalidArgumentError, match=message):
            connect(bad)
    with pytest.raises(errors.InvalidArgumentError, match="not int"):
        connect(42)
    with pytest.raises(errors.StoreFileError, match="there is no store file"):
        connect(f"embedded://{tmp_path}/new/f.db", create=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    home = connect("embedded:~/at-home.db")
    assert isinstance(home, EmbeddedBackend) and home.path == Path(f"{tmp_path}/at-home.db")
    assert connect(f"embedded://{tmp_path}/queue%231.db").path.name == "queue#1.db"  # type: ignore[attr-defined]
    assert not os.path.exists(f"{tmp_path}/new")


def test_unreachable_aerospike_is_a_clear_error_that_names_where_it_tried() -> None:
    with pytest.raises(errors.BackendUnavailableError, match=r"\(hosts 127\.0\.0\.1:1, \[::1\]:2\)$"):
        connect("aerospike://127.0.0.1:1,[::1]:2/test?timeout_ms=200")


def test_an_aerospike_host_without_a_port_is_on_the_servers_default_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from large_queue.backends.aerospike import AerospikeBackend, AerospikeSettings

    asked: list[AerospikeSettings] = []
    monkeypatch.setattr(AerospikeBackend, "connect", asked.append)  # what the URL was read as, no more
    connect("aerospike://db1,db2:4000,[::1]/events")
    assert asked[0].hosts == (("db1", 3000), ("db2", 4000), ("::1", 3000))
    assert asked[0].namespace == "events"


def test_an_aerospike_url_without_the_client_package_is_a_library_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "large_queue.backends.aerospike", None)  # as if aerospike were missing
    with pytest.raises(errors.BackendUnavailableError, match="pip install aerospike"):
        connect("aerospike://127.0.0.1:3000/test")
