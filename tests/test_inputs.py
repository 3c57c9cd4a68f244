"""Bad input gets a clear error before anything is written; the queue stays usable."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from large_queue import (
    CorruptQueueError,
    EntryTooLargeError,
    InvalidArgumentError,
    LockPolicy,
    Queue,
    QueueNotFoundError,
    UnsupportedEntryError,
)
from large_queue import _records as rec
from large_queue._entries import (
    INT64_MAX,
    INT64_MIN,
    MAX_NESTING_DEPTH,
    check_entries,
    check_entry,
    max_entry_bytes,
)
from large_queue.backends import WriteMode, connect
from large_queue.errors import NamespaceNotFoundError
from tests.fix_backends import APPENDS, Store


class Custom:
    pass


def nested(depth: int) -> object:
    value: object = 0
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize(
    ("encoding", "entry", "message"),
    [
        ("native", Custom(), "Custom"),
        ("native", (1, 2), "use a list"),
        ("native", {1.5: "x"}, "dict keys must be"),
        ("native", [1, {"a": {3, 4}}], r"entry 1\[1\]\['a'\] is a set"),
        ("native", 2**64, "signed 64-bit"),
        ("native", ["ok", "lone \ud800"], "entry 1 cannot be stored: .*surrogates not allowed"),
        ("json", {"k": "lone \udfff"}, "entry 1 cannot be stored: .*surrogates not allowed"),
        # what JSON cannot hold, in a queue that stores entries as JSON text
        ("json", b"raw", r"entry 1 is bytes, which JSON cannot hold"),
        ("json", {"k": bytearray(b"x")}, r"entry 1\['k'\] is bytearray"),
        ("json", {7: "int key"}, "dict keys must be str in a JSON-encoded queue"),
        ("json", [1.0, math.nan], r"entry 1\[1\] = nan"),
        ("json", {"x": -math.inf}, r"= -inf, which JSON cannot hold"),
        ("json", (1, 2), "use a list"),
        ("json", 2**64, "signed 64-bit"),
        # what Aerospike would change or could not read back, refused on every store
        ("native", "a\x00b", r"entry 1 is a str holding a NUL character: Aerospike cuts a str"),
        ("native", [{"k\x00": 1}], r"entry 1\[0\] has a key holding a NUL character \('k\\x00'\)"),
        ("native", {"k": ["\x00"]}, r"entry 1\['k'\]\[0\] is a str holding a NUL"),
        (
            "native",
            nested(MAX_NESTING_DEPTH + 1),
            f"is nested deeper than {MAX_NESTING_DEPTH} lists and dicts",
        ),
        ("json", nested(MAX_NESTING_DEPTH + 1), f"is nested deeper than {MAX_NESTING_DEPTH} lists and dicts"),
        ("native", nested(2000), "is nested deeper than"),
        # msgpack entries take the native domain (NUL included), and refuse the rest alike
        ("msgpack", Custom(), "Custom"),
        ("msgpack", [1, {"a": {3, 4}}], r"entry 1\[1\]\['a'\] is a set"),
        ("msgpack", {1.5: "x"}, "dict keys must be"),
        ("msgpack", -(2**63) - 1, "signed 64-bit"),
        ("msgpack", ["ok", "lone \ud800"], "entry 1 cannot be stored: .*surrogates not allowed"),
        ("msgpack", {"k": "lone \ud800"}, "entry 1 cannot be stored: .*surrogates not allowed"),
        ("msgpack", nested(MAX_NESTING_DEPTH + 1), f"is nested deeper than {MAX_NESTING_DEPTH}"),
    ],
)
def test_unsupported_entries_are_refused_before_writing(
    store: Store, encoding: str, entry: object, message: str
) -> None:
    queue = store.new_queue(encoding=encoding)
    queue.enqueue("before")
    commands = store.backend.commands
    with pytest.raises(UnsupportedEntryError, match=message):
        queue.enqueue_batch(["fine", entry])
    assert store.backend.commands == commands  # nothing was sent
    assert [e.value for e in queue.dequeue_batch(10)] == ["before"]


@pytest.mark.parametrize(
    ("encoding", "entry", "message"),
    [  # flat dicts and lists take quicker checks than nested values: each refuses alike
        ("native", {"k": "a\x00b"}, r"\['k'\] is a str holding a NUL character"),
        ("native", {"k\x00": "v"}, r"has a key holding a NUL character"),
        ("native", {"k": 2**63}, r"\['k'\] = 9223372036854775808 does not fit a signed 64-bit"),
        ("msgpack", {"k": 2**63}, r"\['k'\] = 9223372036854775808 does not fit a signed 64-bit"),
        ("native", [2**63], r"\[0\] = 9223372036854775808 does not fit a signed 64-bit"),
        ("msgpack", {"k": [-(2**63) - 1]}, r"\['k'\]\[0\] = -9223372036854775809 does not fit"),
        ("native", {2**63: "v"}, "has a key 9223372036854775808 that does not fit a signed 64-bit"),
        ("msgpack", {2**63: "v"}, "has a key 9223372036854775808 that does not fit a signed 64-bit"),
    ],
)
def test_flat_entries_are_refused_alike_alone_and_in_batches(
    store: Store, encoding: str, entry: object, message: str
) -> None:
    queue = store.new_queue(encoding=encoding)
    commands = store.backend.commands
    with pytest.raises(UnsupportedEntryError, match=message) as alone:
        queue.enqueue(entry)
    with pytest.raises(UnsupportedEntryError, match=message) as batched:
        queue.enqueue_batch(["fine", entry])
    assert (alone.value.entry_index, batched.value.entry_index) == (None, 1)  # type: ignore[attr-defined]
    assert store.backend.commands == commands  # nothing was sent
    assert queue.info().size == 0


def test_a_flat_native_dict_is_sized_alike_alone_and_in_batches() -> None:
    entry = {f"k{i:03}": "v" for i in range(120)}
    # stored natively, each str key and value takes up to 2 bytes more than in msgpack: 4 an item here
    limit = len(msgspec.msgpack.encode(entry)) + 3 * len(entry)
    with pytest.raises(EntryTooLargeError):
        check_entries([entry], limit, "native")
    with pytest.raises(EntryTooLargeError):
        check_entry(entry, limit, "native")
    check_entries([entry], limit, "msgpack")  # as msgpack it fits
    check_entry(entry, limit, "msgpack")


@pytest.mark.parametrize("encoding", ["native", "msgpack"])
def test_supported_values_round_trip(store: Store, encoding: str) -> None:
    queue = store.new_queue(encoding=encoding)
    values = [
        None,
        True,
        False,
        -(2**63),
        2**63 - 1,
        math.pi,
        "",
        "ünïcode",
        b"\x00bin",
        [],
        {},
        {"nested": [{"k": [1, "two", None]}], 7: "int key"},
    ]
    queue.enqueue_batch(values[:6])
    queue.enqueue_batch(values[6:])
    got = [e.value for e in queue.dequeue_batch(12)]
    assert [bytes(v) if isinstance(v, bytearray) else v for v in got] == values
    assert type(got[1]) is bool


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_json_and_msgpack_queues_keep_what_a_native_one_refuses(store: Store, encoding: str) -> None:
    queue = store.new_queue(encoding=encoding)
    values = ["a\x00b", {"k\x00": ["\x00"]}, nested(MAX_NESTING_DEPTH)]
    queue.enqueue_batch(values)
    assert [e.value for e in queue.dequeue_batch(10)] == values


def aerospike_order(value: object) -> object:
    """``value`` with every dict as a list of its items, in the order Aerospike gives keys back."""
    if isinstance(value, dict):
        rank = {int: 0, str: 1, bytes: 2}
        return [(k, aerospike_order(value[k])) for k in sorted(value, key=lambda k: (rank[type(k)], k))]
    if isinstance(value, list):
        return [aerospike_order(item) for item in value]
    return bytes(value) if isinstance(value, bytearray) else value


native_keys = st.integers(INT64_MIN, INT64_MAX) | st.text(max_size=6) | st.binary(max_size=4)
native_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.binary().map(bytearray),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(native_keys, inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.parametrize("encoding", ["native", "msgpack"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(native_values, min_size=1, max_size=6))
def test_every_store_gives_back_exactly_what_it_accepts(
    store: Store, encoding: str, values: list[object]
) -> None:
    """One rule on both stores: refused before writing, or given back the same, dicts in key order."""
    queue = store.new_queue(capacity=8, slots_per_record=3, encoding=encoding)
    try:
        queue.enqueue_batch(values)
    except UnsupportedEntryError as refused:
        assert encoding == "native", refused  # msgpack keeps every value drawn here
        assert "NUL character" in str(refused), refused  # the only native value refused here
        assert queue.info().tail_offset == 0
        return
    got = [e.value for e in queue.dequeue_batch(8)]
    assert [_items_in_order(v) for v in got] == [aerospike_order(v) for v in values]


def _items_in_order(value: object) -> object:
    """``value`` with every dict as the list of its items in the order the store gave them back."""
    if isinstance(value, dict):
        return [(k, _items_in_order(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_items_in_order(item) for item in value]
    return value


def test_oversize_entry_is_refused_and_queue_unchanged(store: Store) -> None:
    queue = store.new_queue(capacity=4, slots_per_record=2)
    limit = queue.max_entry_bytes
    queue.enqueue("a" * (limit - 10))  # fits
    with pytest.raises(EntryTooLargeError, match=f"at most {limit} bytes"):
        queue.enqueue_batch(["ok", "b" * (limit + 1)])
    info = queue.info()
    assert (info.tail_offset, info.lock_owner) == (1, None)
    assert queue.dequeue().value == "a" * (limit - 10)  # type: ignore[union-attr]


@pytest.mark.parametrize("too_large", [0, 1, 17, 48, 49])
def test_a_batch_larger_than_a_slot_names_its_first_entry_too_large(too_large: int) -> None:
    limit = 1000
    small = ["x" * 90] * 50  # about 4.6 KB in all: more than a slot holds, each entry well within it
    assert check_entries(small, limit) == small
    batch = list(small)
    batch[too_large] = "y" * limit
    batch[min(too_large + 3, 49)] = "z" * limit  # a later one too large as well: the first is named
    # a native entry: its encoding (3 bytes of header) and the 2 Aerospike may add to a str in a list
    with pytest.raises(
        EntryTooLargeError, match=f"^entry {too_large} is {limit + 5} bytes as stored"
    ) as refused:
        check_entries(batch, limit)
    assert refused.value.entry_index == too_large  # type: ignore[attr-defined]
    batch = list(small)
    batch[too_large] = "y" * (limit - 5)  # exactly a slot: fits
    assert check_entries(batch, limit) == batch


def test_a_native_entry_that_passes_the_size_check_fits_its_record(store: Store) -> None:
    """Aerospike keeps each str inside a list with a type byte more than msgpack counts: 31 chars take 34."""
    queue = store.new_queue(capacity=4, slots_per_record=4, encoding="native")  # the store's own record limit
    limit = queue.max_entry_bytes
    low, high = 1, limit // 32  # the largest count of such strings that passes the check, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if _fits(["b" * 31] * middle, limit) else (low, middle - 1)
    with pytest.raises(EntryTooLargeError):
        queue.enqueue(["b" * 31] * (low + 1))
    queue.enqueue_batch([["b" * 31] * low] * 4)  # a whole record of the largest such entries
    assert [len(queue.dequeue().value) for _ in range(4)] == [low] * 4  # type: ignore[union-attr]


def _fits(entry: object, limit: int) -> bool:
    try:
        check_entries([entry], limit)
    except EntryTooLargeError:
        return False
    return True


def test_slots_take_their_size_from_the_stores_record_limit(store: Store) -> None:
    limit = store.backend.max_record_bytes("test")  # 8 MiB on the test server and the test store
    queue = store.new_queue(capacity=1000, slots_per_record=None)
    assert (queue.shape.slots_per_record, queue.max_entry_bytes) == (100, max_entry_bytes(limit, 100))
    big = b"x" * (queue.max_entry_bytes - 64)  # more than a 1 MiB record's slot would hold
    queue.enqueue(big)
    assert queue.dequeue().value == big  # type: ignore[union-attr]


@pytest.mark.parametrize(("store_limit", "slots"), [(16384, 11), (65536, 58), (1024 * 1024, 100)])
def test_default_slots_leave_room_in_small_records(tmp_path: object, store_limit: int, slots: int) -> None:
    store = connect(f"embedded://{tmp_path}/s.db?record_size_limit={store_limit}")
    queue = Queue.create(store, "q", capacity=1000)
    assert queue.shape.slots_per_record == slots and queue.max_entry_bytes >= 1024
    queue.enqueue("x" * 1000)  # fits a slot and the store's record
    with pytest.raises(InvalidArgumentError, match="more than the store's records hold"):
        Queue.create(store, "r", capacity=10, record_size_limit=store_limit * 2)


def test_a_store_whose_records_cannot_hold_a_queue_is_refused_at_create(tmp_path: object) -> None:
    store = connect(f"embedded://{tmp_path}/s.db?record_size_limit=2048")
    with pytest.raises(InvalidArgumentError, match=r"records hold at most 2048 bytes.* needs at least 8192"):
        Queue.create(store, "q", capacity=10)
    with pytest.raises(QueueNotFoundError):
        Queue.open(store, "q")


def test_record_size_limit_is_configurable(store: Store) -> None:
    small = store.new_queue(capacity=4, slots_per_record=2, record_size_limit=16384)
    assert small.max_entry_bytes < 8192
    with pytest.raises(EntryTooLargeError):
        small.enqueue(b"x" * 8192)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"capacity": 0}, "capacity must be a positive int"),
        ({"capacity": 2.5}, "capacity must be a positive int"),
        ({"slots_per_record": -1}, "slots_per_record"),
        ({"slots_per_record": 1_000_000}, "use fewer slots per record"),
        ({"lock_ttl": 0}, "lock_ttl"),
        (
            {"record_size_limit": 9 * 1024 * 1024},
            r"record_size_limit=9437184 is more than the store's records hold",
        ),
        ({"record_size_limit": 4096}, "record_size_limit must be an int of at least 8192 bytes"),
        ({"namespace": "bad name"}, "namespace 'bad name' is invalid"),
    ],
)
def test_bad_create_parameters(store: Store, options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        store.new_queue(**options)


@pytest.mark.parametrize("name", ["", "has space", "x" * 64, "semi;colon", 42])
def test_bad_queue_names(store: Store, name: object) -> None:
    with pytest.raises(InvalidArgumentError, match="queue name"):
        Queue.create(store.backend, name, capacity=3)  # type: ignore[arg-type]


def test_bad_operation_arguments(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    with pytest.raises(InvalidArgumentError, match="txn_id"):
        queue.enqueue(1, txn_id=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        queue.enqueue_batch(range(7))
    with pytest.raises(InvalidArgumentError, match="max_entries"):
        queue.dequeue_batch(0)
    with pytest.raises(InvalidArgumentError, match="node_id"):
        queue.consumer("node\x00one")  # Aerospike would keep "node"
    assert queue.enqueue("still usable") == 0


def test_missing_queue_and_namespace(store: Store) -> None:
    with pytest.raises(QueueNotFoundError, match="does not exist"):
        Queue.open(store.backend, "never-created")
    with pytest.raises(NamespaceNotFoundError):
        Queue.create(store.backend, "q", capacity=3, namespace="nosuchns")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ({rec.TAIL: None}, "bin 'tail' is missing"),
        ({rec.HEAD: "zero"}, "'head' holds str"),
        ({rec.HEAD: 5, rec.TAIL: 2}, "break 0 <= head <= tail"),
        (
            {rec.HEAD: 0, rec.TAIL: 10**9},
            r"head 0 and tail 1000000000 break .* tail <= head \+",
        ),  # past capacity
        ({rec.RECEIPT_KEEP: 0}, "bin 'rcpt_keep' holds 0, not a positive integer"),
        ({rec.FORMAT: 99}, "format version 99"),
        ({rec.FORMAT: None}, "this library did not write it"),  # as a queue of the original code
        ({rec.READY: 0}, "not completely created"),
    ],
)
def test_damaged_metadata_is_named(store: Store, damage: dict[str, object], message: str) -> None:
    queue = store.new_queue()
    queue.enqueue("kept")
    store.backend.put(queue.keys.metadata, damage, mode=WriteMode.UPDATE_ONLY)
    with pytest.raises(CorruptQueueError, match=message):
        Queue.open(store.backend, queue.name)
    with pytest.raises(CorruptQueueError):
        queue.info()


def test_missing_buffer_record_is_named_and_lock_released(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=6, slots_per_record=3)
    queue.enqueue("in record 0")
    store.backend.remove(queue.keys.buffer(1))
    with pytest.raises(CorruptQueueError, match=r"buffer record 1 .* is missing"):
        queue.enqueue_batch(["a", "b", "c"])
    assert queue.info().lock_owner is None
    assert queue.dequeue().value == "in record 0"  # type: ignore[union-attr]


def test_bad_call_arguments_are_library_errors_before_anything_is_written(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.enqueue("kept")
    for bad, named in [
        (lambda: queue.dequeue(timeout="1"), "timeout"),
        (lambda: queue.dequeue(timeout=True), "timeout"),
        (lambda: queue.dequeue_batch(2, timeout=math.nan), "timeout"),
        (lambda: queue.outcome("T", within=math.inf), "within"),
        (lambda: queue.outcome("T", within=-5), "within"),
        (lambda: queue.outcome(None), "txn_id"),  # type: ignore[arg-type]
        (lambda: queue.enqueue_batch(None), "iterable"),  # type: ignore[arg-type]
        (lambda: queue.enqueue_batch("abc"), "iterable"),
        (lambda: queue.enqueue_batch([], txn_id=True), "txn_id"),  # type: ignore[arg-type]
        (lambda: queue.enqueue("x", txn_id="job\x00001"), "NUL"),  # Aerospike would cut it: ids would collide
        (
            lambda: queue.enqueue("x", txn_id="\U0001f600" * 40),
            "bytes in UTF-8",
        ),  # 160 bytes: receipts fit 128
        (lambda: Queue.names(store.backend, namespace=5), "namespace"),  # type: ignore[arg-type]
        (lambda: Queue.open(store.backend, queue.name, lock_policy=None), "LockPolicy"),  # type: ignore[arg-type]
        (lambda: LockPolicy(acquire_timeout="1"), "LockPolicy"),  # type: ignore[arg-type]
        (
            lambda: LockPolicy(initial_wait=math.inf, max_wait=math.inf),
            "at most 86400",
        ),  # sleep would overflow
        (lambda: LockPolicy(max_wait=1e300), "at most 86400"),
        (lambda: LockPolicy(acquire_timeout=math.nan), "LockPolicy"),
        (lambda: queue.enqueue("x", overwrite_if_full="false"), "overwrite_if_full"),  # type: ignore[arg-type]
        (lambda: queue.enqueue_batch(["x"], overwrite_if_full=1), "overwrite_if_full"),  # type: ignore[arg-type]
        (lambda: queue.producer(overwrite_if_full="no"), "overwrite_if_full"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(InvalidArgumentError, match=named):
            bad()
    assert [e.value for e in queue.dequeue_batch(10)] == ["kept"]


@pytest.mark.parametrize("appends", APPENDS)
def test_a_call_answered_from_its_receipt_is_not_counted_as_enqueued_again(
    store: Store, appends: str
) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends=appends)
    assert queue.enqueue_batch([1, 2, 3], txn_id="T") == queue.enqueue_batch([1, 2, 3], txn_id="T")
    stats = queue.stats()
    assert (stats.enqueue_calls, stats.entries_enqueued, stats.repeats_answered) == (1, 3, 1)


@pytest.mark.parametrize("hole_timeout", [86400.5, 1e9, math.inf])
def test_a_hole_timeout_past_a_day_is_refused_by_name_before_anything_is_written(
    store: Store, hole_timeout: float
) -> None:
    name = store.new_queue().name + "-holes"
    commands = store.backend.commands
    with pytest.raises(InvalidArgumentError, match="hole_timeout"):
        Queue.create(store.backend, name, capacity=12, slots_per_record=3, hole_timeout=hole_timeout)
    assert store.backend.commands == commands  # nothing was sent
    with pytest.raises(QueueNotFoundError):
        Queue.open(store.backend, name)
