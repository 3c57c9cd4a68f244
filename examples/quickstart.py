"""The original usage, unchanged, then the same steps with the typed API.

Runs on the store LARGE_QUEUE_URL names (e.g. aerospike://127.0.0.1:3000/test
with docker-compose up), else on the embedded store in the user's data dir.
"""

from __future__ import annotations

import large_queue
from large_queue import ASAborted, LargeQueue, Queue

QUEUE_MAX_SIZE = 1000
ENTRIES_PER_REC = 100

client = large_queue.connect()  # an aerospike.Client works here too
msg_queue = LargeQueue()
try:
    msg_queue.initialize_existing_queue(client, "test", "shared-msg-bus")
except ASAborted as ex:
    print(f"creating the queue ({ex.reason})")
    msg_queue.create_new_queue(client, "test", "shared-msg-bus", QUEUE_MAX_SIZE, ENTRIES_PER_REC)

txn_id = 1
for msg in (
    {"msg-id": 100, "msg-text": "The school is closed for summer."},
    {"msg-id": 101, "msg-text": "Have a nice summer!"},
):
    try:
        offset = msg_queue.enqueue(msg, txn_id)
        print(f"message {msg['msg-id']} added at offset {offset}")
    except ASAborted as ex:
        print(f"enqueue failed, reason: {ex.reason}")

q_info = msg_queue.get_queue_info()
print(f"queue status: {q_info}")
assert q_info is not None
offset = q_info["head-offset"] + 1
print(f"entry at offset {offset}: {msg_queue.get_entry_at_offset(offset)}")
try:
    print(f"dequeued entry: {msg_queue.dequeue(txn_id)}")
    print(f"dequeued entry: {msg_queue.dequeue(txn_id)}")
except ASAborted as ex:
    print(f"dequeue failed, reason: {ex.reason}")

# The same, with the typed API.
queue = Queue.open(client, "shared-msg-bus")
offsets = queue.enqueue_batch([{"msg-id": n} for n in range(102, 107)])  # one lock, one commit
print(f"batch enqueued at offsets {offsets.start}..{offsets.stop - 1}")
print("batch dequeued:", [entry.value["msg-id"] for entry in queue.dequeue_batch(10)])
print(queue.info())
