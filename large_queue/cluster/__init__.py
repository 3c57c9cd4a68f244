"""Sharing one queue between consumer processes on many machines.

After Qpid's "moving queue ownership": at most one node owns a queue at any
time; the owner delivers without taking the queue lock; ownership passes to
the next interested node in node-id order when the owner's time slice ends
(if another node wants the queue) or when the owner has been silent past the
timeout; every owner write is fenced by the ownership epoch; entries delivered
and not acked when an owner leaves or dies are delivered again, marked.
See :mod:`large_queue.cluster._ownership` for the records and the timeline.

Consumer groups (:mod:`large_queue.cluster._groups`) give a queue many
cursors: every group sees every entry, each shared by its own nodes this
way; deliveries not acked in time are delivered again
(:mod:`large_queue.cluster._deliveries`), and entries that fail too often go
to a dead-letter queue (:mod:`large_queue.cluster._dead_letters`).
"""

from __future__ import annotations

from large_queue.cluster._consumer import Consumer
from large_queue.cluster._groups import GroupInfo
from large_queue.cluster._messages import Message, OwnershipEvent, OwnershipInfo, ownership_info
from large_queue.cluster._ownership import NodeState

__all__ = [
    "Consumer",
    "GroupInfo",
    "Message",
    "NodeState",
    "OwnershipEvent",
    "OwnershipInfo",
    "ownership_info",
]
