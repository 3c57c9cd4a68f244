"""large_queue: durable FIFO queues far larger than one record, on Aerospike.

Quick start::

    import large_queue

    store = large_queue.connect()                 # LARGE_QUEUE_URL, or an embedded file
    queue = large_queue.Queue.create(store, "events", capacity=100_000)
    queue.enqueue({"user": 7, "action": "login"})
    entry = queue.dequeue()

The original API (``LargeQueue``, ``ASAborted``) is kept for existing code.
"""

from __future__ import annotations

from large_queue._receipts import Outcome, Receipt
from large_queue._seed import ASAborted, LargeQueue
from large_queue._stats import QueueStats
from large_queue.backends import Backend, connect
from large_queue.errors import (
    BackendError,
    CorruptQueueError,
    DataLossError,
    DeliveryExpiredError,
    EntriesGoneError,
    EntryTooLargeError,
    GroupNotFoundError,
    GroupsInUseError,
    InvalidArgumentError,
    LargeQueueError,
    LockLostError,
    LockNotAcquiredError,
    OutcomeUnknownError,
    OwnershipLostError,
    QueueExistsError,
    QueueFullError,
    QueueNotFoundError,
    ReservationClosedError,
    UnsupportedEntryError,
)
from large_queue.fencing import FencingToken
from large_queue.lock import LockPolicy
from large_queue.producer import Producer
from large_queue.queue import Entry, Queue, QueueInfo

__version__ = "0.1.0"

__all__ = [
    "ASAborted",
    "Backend",
    "BackendError",
    "CorruptQueueError",
    "DataLossError",
    "DeliveryExpiredError",
    "EntriesGoneError",
    "Entry",
    "EntryTooLargeError",
    "FencingToken",
    "GroupNotFoundError",
    "GroupsInUseError",
    "InvalidArgumentError",
    "LargeQueue",
    "LargeQueueError",
    "LockLostError",
    "LockNotAcquiredError",
    "LockPolicy",
    "Outcome",
    "OutcomeUnknownError",
    "OwnershipLostError",
    "Producer",
    "Queue",
    "QueueExistsError",
    "QueueFullError",
    "QueueInfo",
    "QueueNotFoundError",
    "QueueStats",
    "Receipt",
    "ReservationClosedError",
    "UnsupportedEntryError",
    "connect",
]
