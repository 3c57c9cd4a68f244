"""What a node's consumer hands out and reports: messages, ownership events, ownership state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from large_queue.cluster._ownership import NodeState, Ownership
from large_queue.queue import Queue

if TYPE_CHECKING:
    from large_queue.cluster._consumer import Consumer


@dataclass(frozen=True, kw_only=True)
class Message:
    """An entry delivered to this node and not yet acked."""

    offset: int
    value: Any
    enqueued_at_ms: int
    delivery_count: int
    epoch: int
    group: str | None = None
    consumer: Consumer = field(repr=False, compare=False)

    @property
    def redelivered(self) -> bool:
        """True if this entry was delivered before and not acked (``delivery_count > 1``).

        By an earlier owner, or by this one before a nack or a visibility timeout.
        """
        return self.delivery_count > 1

    def ack(self) -> None:
        """Acknowledge: the entry is consumed and will not be delivered again."""
        self.consumer.ack([self])

    def nack(self, *, delay: float = 0.0, error: str | None = None) -> None:
        """Give the entry back: it is delivered again after ``delay`` seconds (delivery count + 1).

        ``error`` is kept as the entry's last error (for its dead letter).
        """
        self.consumer.nack(self, delay=delay, error=error)

    def extend(self, seconds: float) -> None:
        """Keep the entry from being delivered again for ``seconds`` more from now."""
        self.consumer.extend(self, seconds)


@dataclass(frozen=True, kw_only=True)
class OwnershipEvent:
    """A change seen by one node: ``take``, ``release`` or ``lost``, or an owner ``commit``."""

    kind: str
    node_id: str
    epoch: int
    at_ns: int


@dataclass(frozen=True, kw_only=True)
class OwnershipInfo:
    """Who owns a queue, who wants it, and how far delivery and acks have got."""

    owner: str | None
    epoch: int
    nodes: list[NodeState]
    delivered_offset: int
    acked_offset: int
    in_flight: int


def ownership_info(queue: Queue, *, timeout: float = 10.0) -> OwnershipInfo:
    """The ownership state of ``queue`` (``QueueNotFoundError`` if no consumer ever joined).

    Each node is judged alive by the timeout it states; ``timeout`` judges
    the nodes that state none (written by an earlier version).
    """
    ownership = Ownership(queue, "info", timeout=timeout)
    state = ownership.read()
    return OwnershipInfo(
        owner=state.owner or None,
        epoch=state.epoch,
        nodes=ownership.nodes(),
        delivered_offset=state.cursor,
        acked_offset=min(state.inflight, default=state.cursor),
        in_flight=len(state.inflight),
    )


__all__ = ["Message", "OwnershipEvent", "OwnershipInfo", "ownership_info"]
