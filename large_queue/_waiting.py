"""Waiting for entries by polling the store, at a bounded cost.

A store has no way to push "something was published" to a client, so a
caller that waits polls. Polls back off exponentially from ``FIRST_PAUSE``
to ``cap`` seconds after the last command that found nothing, and the
backoff outlives one call: a loop of short waiting calls polls no more
often than one long one. So a queue that is busy is seen within
milliseconds, and an idle waiter costs at most ``1 / cap`` polls per second
however it is called. Anything delivered ends the idling.
"""

from __future__ import annotations

import threading
import time

FIRST_PAUSE = 0.005
MAX_PAUSE = 0.1


class IdlePoller:
    """When a waiting reader may poll again (one per reader: a queue handle, a consumer)."""

    def __init__(self, cap: float = MAX_PAUSE) -> None:
        self.cap = cap
        self.pause = 0.0  # 0: not idle, poll at once
        self._last = float("-inf")  # when the last poll that found nothing was sent (monotonic)
        self._lock = threading.Lock()

    @property
    def idle(self) -> bool:
        """True if the last poll found nothing."""
        return self.pause > 0

    def found_nothing(self) -> None:
        """A poll just found nothing: the next waits longer."""
        with self._lock:
            self._last = time.monotonic()
            self.pause = min(self.cap, max(FIRST_PAUSE, self.pause * 2))

    def found_something(self) -> None:
        """Entries came: poll at once from now on."""
        with self._lock:
            self.pause = 0.0

    def next_poll(self) -> float:
        """When the next poll is due (monotonic)."""
        return self._last + self.pause

    def wait_turn(self, deadline: float) -> bool:
        """Sleep until the next poll is due; False (after sleeping to ``deadline``) if that is later."""
        due = self.next_poll()
        now = time.monotonic()
        if due > deadline:
            time.sleep(max(0.0, deadline - now))
            return False
        if due > now:
            time.sleep(due - now)
        return True


__all__ = ["FIRST_PAUSE", "MAX_PAUSE", "IdlePoller"]
