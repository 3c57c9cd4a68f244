"""The original LargeQueue API, exactly as its README uses it."""

from __future__ import annotations

from large_queue import ASAborted, LargeQueue
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
        assert "does not exist" in ex.reason
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
    assert msg_queue.dequeue(txn_id) == {"offset": 0, "entry": msg}

    again = LargeQueue()
    again.initialize_existing_queue(client, "test", "shared-msg-bus")
    assert again.dequeue(txn_id) == {"offset": 1, "entry": msg2}
    assert again.dequeue(txn_id) is None


def test_reference_full_queue_and_overwrite(store: Store) -> None:
    store.created.append("test_queue")
    test_queue = LargeQueue()
    test_queue.create_new_queue(store.backend, "test", "test_queue", 10, 3)
    reasons = []
    for i in range(20):
        try:
            test_queue.enqueue(i, 111)
        except ASAborted as ex:
            reasons.append(ex.reason)
    assert len(reasons) == 8 and "free slots" in reasons[0]  # capacity rounds up to 12
    for i in range(20):
        test_queue.enqueue(i, 111, True)
    info = test_queue.get_queue_info()
    assert info is not None and info["tail-offset"] - info["head-offset"] == 12
    entries = [test_queue.get_entry_at_offset(o) for o in range(info["head-offset"], info["tail-offset"])]
    assert [e["entry"] for e in entries if e] == list(range(8, 20))
