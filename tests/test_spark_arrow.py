"""The Spark read's hot loop without Spark: buffer slots into Arrow columns.

The chunk-at-a-time shortcuts (one JSON encoding split by Arrow, zip
transposition of slots) must give exactly what the plain per-row way gives.
"""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from large_queue import errors
from large_queue._entries import INT64_MAX, INT64_MIN, bytes_as_json
from large_queue.spark._arrow import Rows, collector_paused, json_column, stored_column

scalars = (
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)  # non-finite: spelled as Spark reads them (below)
    | st.text()
    | st.binary(max_size=20)
)
entries = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers(-(2**40), 2**40), inner, max_size=4)
    ),
    max_leaves=12,
)


def one_by_one(value: Any) -> str:
    return orjson.dumps(value, default=bytes_as_json, option=orjson.OPT_NON_STR_KEYS).decode()


@given(st.lists(entries, min_size=1, max_size=30))
def test_json_column_matches_encoding_each_value(values: list[Any]) -> None:
    column = json_column("q", list(range(len(values))), values)
    assert column.to_pylist() == [one_by_one(v) for v in values]


def test_json_column_keeps_newlines_and_separators_inside_values() -> None:
    values = ["a\nb", {"k,\n": "[\n,]"}, "\n", "", [",", "\n,"], {"$bytes": "x"}, b"\n"]
    assert json_column("q", list(range(len(values))), values).to_pylist() == [one_by_one(v) for v in values]


def test_json_column_spells_floats_json_has_no_number_for_as_sparks_json_reads_them() -> None:
    nan, inf = float("nan"), float("inf")
    values = [nan, {"x": [inf, -inf, None], "y": 1.5}, None, {"n": None}, [1, {2: -inf}]]
    assert json_column("q", list(range(5)), values).to_pylist() == [
        "NaN",
        '{"x":[Infinity,-Infinity,null],"y":1.5}',
        "null",
        '{"n":null}',
        '[1,{"2":-Infinity}]',
    ]


def test_json_column_shows_bytes_map_keys_as_the_command_line_prints_them() -> None:
    values = [1, {b"raw-key": {b"k": b"v"}, "s": [{2: 3}]}, {"plain": 1}]
    assert json_column("q", [7, 8, 9], values).to_pylist() == [
        "1",
        '{"$bytes:cmF3LWtleQ==":{"$bytes:aw==":{"$bytes":"dg=="}},"s":[{"2":3}]}',
        '{"plain":1}',
    ]


def test_json_column_shows_a_bytes_key_whatever_its_value_and_refuses_one_that_would_merge() -> None:
    assert json_column("q", [0], [{b"k": None}]).to_pylist() == ['{"$bytes:aw==":null}']
    with pytest.raises(errors.UnsupportedEntryError, match="would be one key in JSON"):
        json_column("q", [0], [{b"x": 1, "$bytes:eA==": 2}])  # two keys, one in JSON: not one dropped
    with pytest.raises(errors.UnsupportedEntryError, match="key 1 and key '1' would be one key in JSON"):
        json_column("q", [0], [{"a": [{1: "int", "1": "str"}]}])  # orjson would write the key twice


def test_json_column_names_entries_it_cannot_show() -> None:
    with pytest.raises(errors.UnsupportedEntryError, match=r"queue 'q' \(offsets 7..9\).*valueFormat=binary"):
        json_column("q", [7, 8, 9], [1, {1: object()}, 3])  # no entry holds one: the message, should one


def test_rows_take_live_slots_and_report_the_rest_lost() -> None:
    slots: list[Any] = [
        [10, "a", 1],
        None,  # erased
        [22, "c", 3],  # a later lap
        [13, "d", 4],
        [14, "e"],  # malformed
    ]
    rows, lost = Rows(), []
    rows.add(slots, 0, 10, 15, lost)
    assert (rows.offsets, rows.values, rows.times, lost) == ([10, 13], ["a", "d"], [1, 4], [11, 12, 14])
    rows, lost = Rows(), []
    rows.add([[20, "x", 5], [21, "y", 6], [22, "z", 7]], 1, 21, 23, lost)  # a window inside a record
    assert (rows.offsets, rows.values, rows.times, lost) == ([21, 22], ["y", "z"], [6, 7], [])
    rows, lost = Rows(), []
    rows.add([[30, "x", 5]], 0, 30, 32, lost)  # a record shorter than the range asked for
    assert (rows.offsets, lost) == ([30], [31])


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_state_is_restored(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with pytest.raises(RuntimeError), collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("a failed chunk")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize(("stored", "problem"), [(b"\xff\xfe", "Invalid UTF8"), (7, "")])
def test_stored_json_text_that_is_not_text_is_named(stored: object, problem: str) -> None:
    rows = Rows(offsets=[4, 5], values=[b'{"ok": 1}', stored], times=[0, 0])
    with pytest.raises(
        errors.CorruptQueueError, match=rf"queue 'q' \(offsets 4..5\).*not json bytes.*{problem}"
    ):
        stored_column("q", rows, "json")


def test_stored_json_text_is_passed_on_as_it_is() -> None:
    texts = [orjson.dumps(v) for v in ({"a": "\n"}, [1, 2.5], "ü", None)]
    stored: list[Any] = [*texts[:3], bytearray(texts[3])]  # Aerospike's client gives blobs as bytearray
    rows = Rows(offsets=[0, 1, 2, 3], values=stored, times=[0, 0, 0, 0])
    assert stored_column("q", rows, "json").to_pylist() == [t.decode() for t in texts]


def test_stored_msgpack_bytes_are_passed_on_as_they_are() -> None:
    packed = [msgspec.msgpack.encode(v) for v in ({"a": b"\x00"}, [1, 2.5], "ü\x00")]
    stored: list[Any] = [*packed[:2], bytearray(packed[2])]  # Aerospike's client gives blobs as bytearray
    rows = Rows(offsets=[0, 1, 2], values=stored, times=[0, 0, 0])
    assert stored_column("q", rows, "msgpack").to_pylist() == packed
    with pytest.raises(errors.CorruptQueueError, match=r"offsets 0..2\).*not msgpack bytes"):
        stored_column("q", Rows(offsets=[0, 1, 2], values=[*packed[:2], 7], times=[0, 0, 0]), "msgpack")
