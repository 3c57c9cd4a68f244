"""What the owning node knows of its deliveries: which are held, until when, and why they failed.

The owner record keeps, for every entry delivered and not acked, how many
times it was delivered (that survives a change of owner). This node keeps,
in memory, what only matters while it owns the queue:

- **held**: delivered to this node's consumers and not yet acked, nacked
  or timed out; never delivered again while held;
- **visible again at**: a held delivery whose ``visibility_timeout`` passes
  (on this node's monotonic clock) is no longer held, and the next receive
  delivers it again with its delivery count + 1; ``extend`` moves it later;
- **not before**: ``nack(delay=...)`` releases a delivery and keeps it from
  being delivered again until the delay is over;
- **last error**: what ``nack(error=...)`` said, for the dead-letter queue.

A new owner knows none of this: it delivers every unacked entry again at
once (with its stored delivery count + 1), as after any change of owner.
Only the latest delivery of an entry may be acked, nacked or extended: the
delivery count of the message must match the one stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Deliveries:
    """The in-memory side of one owner's deliveries (see the module docstring)."""

    def __init__(self, visibility_timeout: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.visibility_timeout = visibility_timeout
        self.clock = clock  #: this node's monotonic clock (seconds)
        self.held: set[int] = set()
        self._visible_at: dict[int, float] = {}
        self._not_before: dict[int, float] = {}
        self.last_error: dict[int, str] = {}

    def reset(self) -> None:
        """Forget everything: ownership began or ended."""
        self.held.clear()
        self._visible_at.clear()
        self._not_before.clear()
        self.last_error.clear()

    def expire(self, now: float | None = None) -> list[int]:
        """Release held deliveries whose visibility timeout has passed; return their offsets."""
        if not self.held:
            return []  # the common case of a consumer that acks at once: nothing to look at
        now = self.clock() if now is None else now
        expired = [offset for offset in self.held if self._visible_at.get(offset, float("inf")) <= now]
        for offset in expired:
            self.held.discard(offset)
            self._visible_at.pop(offset, None)
        return expired

    def due(self, inflight: dict[int, int], now: float | None = None) -> list[int]:
        """In-flight offsets to deliver again now, lowest first: not held and not delayed by a nack."""
        if not inflight:
            return []
        now = self.clock() if now is None else now
        return sorted(
            offset
            for offset in inflight
            if offset not in self.held and self._not_before.get(offset, 0.0) <= now
        )

    def delivered(self, offsets: list[int], now: float | None = None) -> None:
        """These offsets were just delivered to this node's consumers."""
        now = self.clock() if now is None else now
        self.held.update(offsets)
        if self._not_before:  # a nacked entry delivered again: its delay is over
            for offset in offsets:
                self._not_before.pop(offset, None)
        if self.visibility_timeout is not None:
            self._visible_at.update(dict.fromkeys(offsets, now + self.visibility_timeout))

    def acked(self, offsets: set[int]) -> None:
        """These offsets were acked (or moved to the dead-letter queue): forget them."""
        self.held.difference_update(offsets)
        for kept in (self._visible_at, self._not_before, self.last_error):
            if kept:  # most are empty: no visibility timeout, nothing nacked
                for offset in offsets:
                    kept.pop(offset, None)

    def nacked(self, offset: int, delay: float, error: str | None) -> None:
        """Release ``offset`` now, to be delivered again after ``delay`` seconds."""
        self.held.discard(offset)
        self._visible_at.pop(offset, None)
        self._not_before[offset] = self.clock() + delay
        if error is not None:
            self.last_error[offset] = error

    def extended(self, offset: int, seconds: float) -> None:
        """Keep ``offset`` held for ``seconds`` more from now; never less long than it already was.

        Without a visibility timeout a held delivery never comes back: nothing to extend.
        """
        if self.visibility_timeout is None:
            return
        self._visible_at[offset] = max(self._visible_at.get(offset, 0.0), self.clock() + seconds)

    def next_due(self, inflight: dict[int, int]) -> float | None:
        """When the next delayed or held delivery becomes due again (monotonic), if any is waiting."""
        if not inflight:
            return None
        times = [at for offset, at in self._not_before.items() if offset in inflight]
        times += [at for offset, at in self._visible_at.items() if offset in self.held]
        return min(times, default=None)


__all__ = ["Deliveries"]
