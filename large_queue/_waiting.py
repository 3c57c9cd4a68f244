"""Waiting for entries by polling the store, with a backoff that bounds the idle cost.

A store has no way to push "something was published" to a client, so a
caller that waits polls. Polls back off exponentially from ``first`` to
``cap`` seconds: a queue that is busy is seen within milliseconds, and an
idle waiter costs at most ``1 / cap`` polls per second.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

FIRST_PAUSE = 0.005
MAX_PAUSE = 0.1


class Backoff:
    """Iterate to poll until ``deadline`` (monotonic): each step first sleeps the next pause.

    Example::

        for _ in Backoff(time.monotonic() + 5):
            if something_is_there():
                break
    """

    def __init__(self, deadline: float, *, first: float = FIRST_PAUSE, cap: float = MAX_PAUSE) -> None:
        self.deadline = deadline
        self.pause = first
        self.cap = cap

    def __iter__(self) -> Iterator[None]:
        while (remaining := self.deadline - time.monotonic()) > 0:
            time.sleep(min(self.pause, remaining))
            self.pause = min(self.cap, self.pause * 2)
            yield None


def next_pause(previous: float, cap: float = MAX_PAUSE) -> float:
    """The pause after ``previous`` (0: none yet) in the same backoff."""
    return min(cap, max(FIRST_PAUSE, previous * 2))


__all__ = ["FIRST_PAUSE", "MAX_PAUSE", "Backoff", "next_pause"]
