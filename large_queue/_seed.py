"""The original ``LargeQueue`` API, kept call-for-call.

Code written for the original Aerospike example runs unchanged::

    msg_queue = LargeQueue()
    try:
        msg_queue.initialize_existing_queue(client, 'test', 'shared-msg-bus')
    except ASAborted as ex:
        msg_queue.create_new_queue(client, 'test', 'shared-msg-bus', 1000, 100)
    offset = msg_queue.enqueue({'msg-id': 100}, txn_id)
    entry = msg_queue.dequeue(txn_id)        # {'offset': 0, 'entry': {'msg-id': 100}}

``client`` is an ``aerospike.Client`` or anything :func:`large_queue.connect`
accepts. Every error is an ``ASAborted`` (the library's root error) with a
``reason``; the operations run on :class:`large_queue.Queue`. The outcomes
the original API named keep its reasons word for word, so that code
matching on them works: 'Queue already exists', 'Queue does not exist',
'Failed to acquire lock', 'Timed out' (the lock was lost) and 'Queue is
full'. The error is still the library's own class, with the detailed
message in ``detail``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from large_queue import errors
from large_queue._entries import NATIVE
from large_queue._records import LOCKED_APPENDS
from large_queue.errors import LargeQueueError, QueueError
from large_queue.queue import Entry, Queue

ASAborted = LargeQueueError

# the original API's reasons for the outcomes it named
_REASONS: dict[type[LargeQueueError], str] = {
    errors.QueueExistsError: "Queue already exists",
    errors.QueueNotFoundError: "Queue does not exist",
    errors.LockNotAcquiredError: "Failed to acquire lock",
    errors.LockLostError: "Timed out",
    errors.QueueFullError: "Queue is full",
}


@contextlib.contextmanager
def _reference_reasons() -> Iterator[None]:
    """Re-raise the outcomes the original API named with its reasons, detail kept."""
    try:
        yield
    except tuple(_REASONS) as exc:
        reason = next(text for cls, text in _REASONS.items() if isinstance(exc, cls))
        details = {**exc.__dict__, "detail": str(exc)}
        raise type(exc)(reason, **details) from exc


def _flag(value: Any) -> Any:
    """``overwrite_if_full`` as the reference took it (any truthy value): None, 0 and 1 as the bools
    they stand for; anything else not a bool is refused by the queue (``"false"`` is truthy, and
    would drop entries)."""
    return bool(value) if value is None or (type(value) is int and value in (0, 1)) else value


def _as_dict(entry: Entry | None) -> dict[str, Any] | None:
    return None if entry is None else {"offset": entry.offset, "entry": entry.value}


class LargeQueue:
    """The original API: create or open a queue, then enqueue, dequeue and read by offset."""

    def __init__(self) -> None:
        self.queue: Queue | None = None

    def create_new_queue(
        self, client: Any, namespace: str, q_name: str, max_size: int, slots_per_rec: int
    ) -> None:
        """Create a queue of at least ``max_size`` entries, ``slots_per_rec`` per buffer record."""
        with _reference_reasons():
            self.queue = Queue.create(  # the reference's protocol: appends under the queue lock
                client,
                q_name,
                namespace=namespace,
                capacity=max_size,
                slots_per_record=slots_per_rec,
                appends=LOCKED_APPENDS,
                encoding=NATIVE,  # the reference's records: entries as the store's own values
            )

    def initialize_existing_queue(self, client: Any, namespace: str, q_name: str) -> None:
        """Open an existing queue; raises ``ASAborted`` if it does not exist."""
        with _reference_reasons():
            self.queue = Queue.open(client, q_name, namespace=namespace)

    def _opened(self) -> Queue:
        if self.queue is None:
            raise QueueError(
                "the queue is not initialized: call create_new_queue or initialize_existing_queue"
            )
        return self.queue

    def get_queue_info(self) -> dict[str, Any] | None:
        """Keys ``name``, ``max-size``, ``namespace``, ``head-offset``, ``tail-offset`` (and more)."""
        if self.queue is None:
            return None
        with _reference_reasons():
            info = self.queue.info()
        return {
            "name": info.name,
            "max-size": info.capacity,
            "namespace": info.namespace,
            "head-offset": info.head_offset,
            "tail-offset": info.tail_offset,
            "size": info.size,
            "slots-per-rec": info.slots_per_record,
            "num-buf-recs": info.record_count,
            "lock-owner": info.lock_owner,
        }

    def enqueue(self, entry: Any, txn_id: Any, overwrite_if_full: bool = False) -> int:
        """Append ``entry``; return its offset.

        As in the reference, ``txn_id`` names the lock holder only: the same
        id may serve many calls (no receipts; see ``Queue.enqueue`` for those).
        """
        with _reference_reasons():
            return self._opened()._enqueue_as(entry, txn_id, _flag(overwrite_if_full))

    def dequeue(self, txn_id: Any) -> dict[str, Any] | None:
        """Remove the head entry: ``{'offset': ..., 'entry': ...}``, or None if empty."""
        with _reference_reasons():
            return _as_dict(self._opened()._dequeue_as(txn_id))

    def get_entry_at_offset(self, offset: int) -> dict[str, Any] | None:
        """``{'offset': ..., 'entry': ...}`` if ``offset`` is in the queue now, else None.

        As in the reference, any int outside the queue is None, a negative one
        too (``Queue.get`` refuses it); what is no int is refused.
        """
        queue = self._opened()
        if type(offset) is int and offset < 0:
            return None
        with _reference_reasons():
            return _as_dict(queue.get(offset))
