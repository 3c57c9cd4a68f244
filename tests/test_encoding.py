"""Entry encodings: JSON and msgpack queues give back what a native one does (refusals: test_inputs.py)."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from large_queue import (
    CorruptQueueError,
    EntryTooLargeError,
    InvalidArgumentError,
    Queue,
    QueueNotFoundError,
)
from large_queue import _records as rec
from large_queue._check import check_queue
from large_queue._entries import INT64_MAX, INT64_MIN, decode_entry
from large_queue._msgpack import pack, unpack
from large_queue.backends import ListSet, WriteMode
from tests.fix_backends import Place, Store

# a native queue refuses NUL characters (Aerospike cuts strings at them): compared entries hold none
NO_NUL = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
) | st.text(alphabet=NO_NUL)
json_entries = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet=NO_NUL, max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_encoded_queue_round_trips_across_records_and_laps(store: Store, encoding: str) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=2, encoding=encoding)
    values = [None, True, -(2**63), 2**63 - 1, math.pi, "ünïcode\n", [], {}, {"k": [{"n": None}]}]
    assert queue.enqueue(values[0]) == 0
    queue.enqueue_batch(values[1:4])
    assert [e.value for e in queue.dequeue_batch(3)] == values[:3]
    queue.enqueue_batch(values[4:])  # wraps around into the first records
    assert queue.get(6) is not None and queue.get(6).value == values[6]  # type: ignore[union-attr]
    got = [e.value for e in queue.dequeue_batch(10)]
    assert got == values[3:]
    assert type(got[0]) is int and type(queue.enqueue(True)) is int
    assert queue.dequeue().value is True  # type: ignore[union-attr]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(json_entries, min_size=1, max_size=8))
def test_json_msgpack_and_native_queues_give_back_the_same_values(store: Store, values: list[Any]) -> None:
    queues = [
        store.new_queue(capacity=8, slots_per_record=3, encoding=e) for e in ("native", "json", "msgpack")
    ]
    for queue in queues:
        queue.enqueue_batch(values)
    native, encoded, packed = ([e.value for e in queue.dequeue_batch(8)] for queue in queues)
    assert encoded == packed == native == values


@pytest.mark.parametrize("encoding", ["native", "json", "msgpack"])
def test_dicts_come_back_with_their_keys_in_order(store: Store, encoding: str) -> None:
    queue = store.new_queue(encoding=encoding)
    queue.enqueue({"b": 1, "a": {"d": [{"z": 0, "y": 1}], "c": 2}})
    value = queue.dequeue().value  # type: ignore[union-attr]
    assert list(value) == ["a", "b"] and list(value["a"]) == ["c", "d"]
    assert list(value["a"]["d"][0]) == ["y", "z"]


map_keys = st.integers(INT64_MIN, INT64_MAX) | st.text(alphabet=NO_NUL, max_size=6) | st.binary(max_size=4)
keyed_values = st.recursive(
    json_scalars | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(map_keys, inner, max_size=4),
    max_leaves=12,
)


def _in_aerospike_order(value: Any) -> bool:
    """Every map of ``value``: int keys sorted, then str keys, then bytes keys."""
    if isinstance(value, dict):
        keys = list(value)
        rank = {int: 0, str: 1, bytes: 2}
        expected = sorted(keys, key=lambda key: (rank[type(key)], key))
        return keys == expected and all(_in_aerospike_order(item) for item in value.values())
    if isinstance(value, list):
        return all(_in_aerospike_order(item) for item in value)
    return True


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(alphabet=NO_NUL, min_size=1, max_size=6), keyed_values, max_size=5))
def test_packed_records_keep_every_map_in_aerospike_key_order(bins: dict[str, Any]) -> None:
    """A record's bins (str keys) holding maps of int, str and bytes keys at any depth, as the
    embedded store packs them: the same values back, each map's keys in Aerospike's order."""
    unpacked = unpack(pack(bins))
    assert unpacked == bins
    assert _in_aerospike_order(unpacked)


def test_stored_form_is_the_json_text(store: Store) -> None:
    queue = store.new_queue(capacity=3, slots_per_record=3, encoding="json")
    queue.enqueue({"id": 1, "tags": ["a"]})
    slots = store.backend.get(queue.keys.buffer(0)).bins[rec.SLOTS]  # type: ignore[union-attr]
    assert bytes(slots[0][1]) == orjson.dumps({"id": 1, "tags": ["a"]})


def test_stored_form_is_the_msgpack_bytes_keys_in_order(store: Store) -> None:
    queue = store.new_queue(capacity=3, slots_per_record=3)  # msgpack: the default
    queue.enqueue({"z": "\x00", 2: [b"b", 1.5], "a": None})
    slots = store.backend.get(queue.keys.buffer(0)).bins[rec.SLOTS]  # type: ignore[union-attr]
    assert bytes(slots[0][1]) == msgspec.msgpack.encode({2: [b"b", 1.5], "a": None, "z": "\x00"})


def test_json_entry_size_is_its_text(store: Store) -> None:
    queue = store.new_queue(capacity=4, slots_per_record=2, encoding="json")
    limit = queue.max_entry_bytes
    queue.enqueue("a" * (limit - 10))  # 2 quotes and the bytes header still fit
    escaped = "\n" * (limit // 2)  # half the limit as a str, but twice that as JSON text ("\\n")
    with pytest.raises(EntryTooLargeError, match=f"at most {limit} bytes"):
        queue.enqueue(escaped)
    assert queue.info().tail_offset == 1


def test_bad_encoding_is_refused_before_anything_is_written(store: Store) -> None:
    with pytest.raises(
        InvalidArgumentError, match="encoding must be one of native, msgpack, json, got 'xml'"
    ):
        Queue.create(store.backend, "t-bad-encoding", capacity=3, encoding="xml")
    with pytest.raises(QueueNotFoundError):
        Queue.open(store.backend, "t-bad-encoding")


def test_encoding_is_kept_in_the_metadata(store: Store) -> None:
    native = store.new_queue(appends="lock", encoding="native")
    assert Queue.open(store.backend, native.name).encoding == "native" == native.info().encoding
    assert store.backend.get(native.keys.metadata).bins[rec.FORMAT] == rec.FORMAT_VERSION  # type: ignore[union-attr]
    for encoding, asked in (
        ("json", "json"),
        ("msgpack", "msgpack"),
        ("msgpack", None),
    ):  # msgpack: the default
        encoded = store.new_queue(appends="lock", **({} if asked is None else {"encoding": asked}))
        assert Queue.open(store.backend, encoded.name).encoding == encoding == encoded.info().encoding
        bins = store.backend.get(encoded.keys.metadata).bins  # type: ignore[union-attr]
        # a library that reads only format 1 refuses the encoded queue rather than handing out its bytes
        assert (bins[rec.FORMAT], bins[rec.ENCODING]) == (rec.ENCODED_FORMAT_VERSION, encoding)
    # a queue whose producers append without the lock is format 3 whatever its encoding
    for encoding in ("json", "native", "msgpack"):
        reserving = store.new_queue(encoding=encoding, appends="reserve")
        bins = store.backend.get(reserving.keys.metadata).bins  # type: ignore[union-attr]
        assert (bins[rec.FORMAT], bins[rec.ENCODING]) == (rec.MARKED_FORMAT_VERSION, encoding)
        assert Queue.open(store.backend, reserving.name).encoding == encoding


@pytest.mark.parametrize(
    ("damage", "message"),
    [({rec.ENCODING: "yaml"}, "entry encoding 'yaml' is not supported"), ({rec.ENCODING: None}, "None")],
)
def test_damaged_encoding_is_named(store: Store, damage: dict[str, object], message: str) -> None:
    queue = store.new_queue(encoding="json")
    store.backend.put(queue.keys.metadata, damage, mode=WriteMode.UPDATE_ONLY)
    with pytest.raises(CorruptQueueError, match=message):
        Queue.open(store.backend, queue.name)


@pytest.mark.parametrize(
    ("encoding", "damaged"), [("json", b"{not json"), ("msgpack", b"\xc1"), ("msgpack", "str")]
)
@pytest.mark.parametrize("appends", ["reserve", "lock"])
def test_a_slot_that_holds_no_valid_entry_is_named_by_readers_and_the_checker(
    store: Store, encoding: str, damaged: object, appends: str
) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, encoding=encoding, appends=appends)
    queue.enqueue_batch([1, 2, 3])
    store.backend.operate(queue.keys.buffer(0), [ListSet(rec.SLOTS, 1, [1, damaged, 0])])
    with pytest.raises(CorruptQueueError, match="no valid entry for offset 1"):
        queue.get(1)
    report = check_queue(store.backend, queue.name)
    assert any("slot 1 holds no valid entry" in problem for problem in report.problems)
    assert queue.dequeue().value == 1  # type: ignore[union-attr]
    with pytest.raises(CorruptQueueError, match="no valid entry for offset 1"):
        queue.dequeue()
    assert queue.info().lock_owner is None  # the failed dequeue let go of the lock


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_cluster_consumers_get_decoded_entries(store: Store, encoding: str) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, encoding=encoding)
    queue.enqueue_batch([{"n": n} for n in range(4)])
    with queue.consumer("node-1", time_slice=5.0) as consumer:
        received = consumer.receive(10, timeout=5.0)
        assert [m.value for m in received] == [{"n": n} for n in range(4)]
        consumer.ack(received)


@pytest.mark.parametrize("appends", ["reserve", "lock"])
def test_a_cluster_consumer_names_a_slot_that_holds_no_valid_entry(store: Store, appends: str) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends=appends)  # msgpack: the default
    queue.enqueue_batch([{"n": n} for n in range(3)])
    store.backend.operate(queue.keys.buffer(0), [ListSet(rec.SLOTS, 1, [1, b"\xc1", 0])])
    with (
        queue.consumer("node-1", time_slice=5.0) as consumer,
        pytest.raises(CorruptQueueError, match="no valid entry for offset 1"),
    ):
        consumer.receive(10, timeout=5.0)


def test_stored_text_decodes_from_bytes_or_bytearray_only() -> None:
    assert decode_entry("json", bytearray(b'{"a": [1]}')) == {"a": [1]}  # as Aerospike's client returns blobs
    assert decode_entry("json", b'"x"') == "x"
    assert decode_entry("native", b'"x"') == b'"x"'
    with pytest.raises(ValueError, match="a json-encoded queue's slot holds str, not its bytes"):
        decode_entry("json", '"x"')
    with pytest.raises(ValueError):
        decode_entry("json", b"{")
    assert decode_entry("msgpack", bytearray(msgspec.msgpack.encode({"a": [1]}))) == {"a": [1]}
    with pytest.raises(ValueError, match="a msgpack-encoded queue's slot holds int, not its bytes"):
        decode_entry("msgpack", 7)
    with pytest.raises(ValueError):
        decode_entry("msgpack", b"\x92\x01")  # a list of two items with one


def test_command_line_creates_a_json_encoded_queue(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    from large_queue.cli import main

    url, q = place.url, place.name("q")
    assert main(["--url", url, "create", q, "--capacity", "4", "--encoding", "json"]) == 0
    assert '"encoding": "json"' in capsys.readouterr().out
    assert main(["--url", url, "enqueue", q, '{"a": [1, "x"]}']) == 0
    assert main(["--url", url, "dequeue", q]) == 0
    assert '"value": {"a": [1, "x"]}' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--url", url, "create", "r", "--capacity", "4", "--encoding", "xml"])
    assert "invalid choice: 'xml'" in capsys.readouterr().err
