"""Bad input gets a clear error before anything is written; the queue stays usable."""

from __future__ import annotations

import math

import pytest

from large_queue import (
    CorruptQueueError,
    EntryTooLargeError,
    InvalidArgumentError,
    Queue,
    QueueNotFoundError,
    UnsupportedEntryError,
)
from large_queue import _records as rec
from large_queue.backends import WriteMode
from large_queue.errors import NamespaceNotFoundError
from tests.fix_backends import Store


class Custom:
    pass


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


def test_supported_values_round_trip(store: Store) -> None:
    queue = store.new_queue()
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


def test_oversize_entry_is_refused_and_queue_unchanged(store: Store) -> None:
    queue = store.new_queue(capacity=4, slots_per_record=2)
    limit = queue.max_entry_bytes
    queue.enqueue("a" * (limit - 10))  # fits
    with pytest.raises(EntryTooLargeError, match=f"at most {limit} bytes"):
        queue.enqueue_batch(["ok", "b" * (limit + 1)])
    info = queue.info()
    assert (info.tail_offset, info.lock_owner) == (1, None)
    assert queue.dequeue().value == "a" * (limit - 10)  # type: ignore[union-attr]


def test_record_size_limit_is_configurable(store: Store) -> None:
    store.skip_if_lacking("configurable_record_size")
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
        ({"slots_per_record": 100_000}, "use fewer slots per record"),
        ({"lock_ttl": 0}, "lock_ttl"),
        ({"record_size_limit": 9 * 1024 * 1024}, "record_size_limit"),
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
        ({rec.FORMAT: 99}, "format version 99"),
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
    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.enqueue("in record 0")
    store.backend.remove(queue.keys.buffer(1))
    with pytest.raises(CorruptQueueError, match=r"buffer record 1 .* is missing"):
        queue.enqueue_batch(["a", "b", "c"])
    assert queue.info().lock_owner is None
    assert queue.dequeue().value == "in record 0"  # type: ignore[union-attr]
