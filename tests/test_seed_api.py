"""The original LargeQueue API, exactly as its README uses it."""

from __future__ import annotations

import pytest

from large_queue import ASAborted, InvalidArgumentError, LargeQueue, Queue, QueueFullError
from tests.fix_backends import Store


def test_reference_usage(store: Store) -> None:
    client = store.backend
    store.created.append("shared-msg-bus")
    msg_queue = LargeQueue()
    assert msg_queue.get_queue_info() is None
    try:
        msg_queue.initialize_existing_queue(client, "test", "shared-msg-bus")
        opened = True
    except ASAborted as ex:
        assert ex.reason == "Queue does not exist"
        msg_queue.create_new_queue(client, "test", "shared-msg-bus", 1000, 100)
        opened = False
    assert opened is False

    txn_id = 1
    msg = {"msg-id": 100, "msg-text": "The school is closed for summer."}
    assert msg_queue.enqueue(msg, txn_id) == 0
    msg2 = {"msg-id": 101, "msg-text": "Have a nice summer!"}
    assert msg_queue.enqueue(msg2, txn_id) == 1

    q_info = msg_queue.get_queue_info()
    assert q_info is not None
    assert {k: q_info[k] for k in ("name", "max-size", "namespace", "head-offset", "tail-offset")} == {
        "name": "shared-msg-bus",
        "max-size": 1000,
        "namespace": "test",
        "head-offset": 0,
        "tail-offset": 2,
    }
    offset = q_info["head-offset"] + 1
    assert msg_queue.get_entry_at_offset(offset) == {"offset": 1, "entry": msg2}
    # outside head..tail is None, below zero too, as the reference's range check gives
    assert msg_queue.get_entry_at_offset(q_info["head-offset"] - 1) is None
    assert msg_queue.get_entry_at_offset(q_info["tail-offset"]) is None
    assert msg_queue.dequeue(txn_id) == {"offset": 0, "entry": msg}

    again = LargeQueue()
    again.initialize_existing_queue(client, "test", "shared-msg-bus")
    assert again.dequeue(txn_id) == {"offset": 1, "entry": msg2}
    assert again.dequeue(txn_id) is None


def test_reference_full_queue_and_overwrite(store: Store) -> None:
    store.created.append("test_queue")
    test_queue = LargeQueue()
    test_queue.create_new_queue(store.backend, "test", "test_queue", 10, 3)
    refused = []
    for i in range(20):
        try:
            test_queue.enqueue(i, 111)
        except ASAborted as ex:
            refused.append(ex)
    assert len(refused) == 8  # capacity rounds up to 12
    assert refused[0].reason == "Queue is full" and isinstance(refused[0], QueueFullError)
    assert "free slots" in refused[0].detail  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgumentError, match="overwrite_if_full"):  # "false" is truthy: refused
        test_queue.enqueue(20, 111, "false")
    for falsy in (0, None):  # the reference took any truthy value: these are what they mean
        with pytest.raises(QueueFullError):
            test_queue.enqueue(20, 111, falsy)
    assert test_queue.enqueue(20, 111, 1) == 12  # overwrites the oldest
    assert test_queue.get_entry_at_offset(0) is None
    for i in range(20):
        test_queue.enqueue(i, 111, True)
    info = test_queue.get_queue_info()
    assert info is not None and info["tail-offset"] - info["head-offset"] == 12
    entries = [test_queue.get_entry_at_offset(o) for o in range(info["head-offset"], info["tail-offset"])]
    assert [e["entry"] for e in entries if e] == list(range(8, 20))


def test_reference_reasons_hold_for_reads_of_a_deleted_queue_and_asaborted_is_made_as_before(
    store: Store,
) -> None:
    name = store.new_queue(appends="lock").name
    reader = LargeQueue()
    reader.initialize_existing_queue(store.backend, "test", name)
    Queue.delete(store.backend, name)
    for read in (reader.get_queue_info, lambda: reader.get_entry_at_offset(0), lambda: reader.dequeue(1)):
        with pytest.raises(ASAborted) as gone:
            read()
        assert gone.value.reason == "Queue does not exist" and name in gone.value.detail  # type: ignore[attr-defined]
    made = ASAborted(reason="Queue is full")  # as application code made the original exception
    assert made.reason == str(made) == "Queue is full"


def test_reference_reasons_for_the_outcomes_it_named(store: Store) -> None:
    name = store.new_queue(appends="lock").name
    with pytest.raises(ASAborted) as exists:
        LargeQueue().create_new_queue(store.backend, "test", name, 10, 3)
    assert exists.value.reason == "Queue already exists"
    holder = LargeQueue()
    holder.initialize_existing_queue(store.backend, "test", name)
    assert holder.queue is not None
    holder.queue.lock.policy = type(holder.queue.lock.policy)(acquire_timeout=0.05)
    grant = holder.queue.lock.try_acquire("other")
    with pytest.raises(ASAborted) as busy:
        holder.enqueue("x", 1)
    assert busy.value.reason == "Failed to acquire lock"
    holder.queue.lock.release(grant)
