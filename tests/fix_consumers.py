"""What the consumer tests share: quick turns, and a receive that waits until it has what it asked for."""

from __future__ import annotations

import time

from large_queue.cluster import Consumer, Message

#: turns short enough for a test: an owner found silent after 5 s, a node looking every 50 ms
FAST = {"time_slice": 30.0, "timeout": 5.0, "poll_interval": 0.05}


def receive_all(consumer: Consumer, count: int, timeout: float = 5.0) -> list[Message]:
    """Receive until ``count`` messages came or ``timeout`` passed; what came."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.receive(count - len(got), timeout=0.1)
    return got
