"""What waiting costs: store commands per second of a consumer or dequeuer on an empty queue.

A store cannot tell a client that something was published, so waiting is
polling; its cost is bounded by the backoff cap of :mod:`large_queue._waiting`
plus an owner's heartbeats. Each figure counts every command of its own
connection (the watcher thread's heartbeats included) over a few seconds
after the first wait has begun.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from large_queue.backends import Backend, connect
from large_queue.cluster import Consumer
from large_queue.queue import Queue

#: the most store commands per second an idle waiter may cost
IDLE_COMMANDS_TARGET = 20.0


@dataclass(frozen=True, kw_only=True)
class IdleRate:
    """Commands sent while waiting on an empty queue, and for how long."""

    name: str
    commands: int
    seconds: float

    @property
    def rate(self) -> float:
        """Store commands per second."""
        return self.commands / self.seconds

    def line(self) -> str:
        """The figure as the bench prints it."""
        return (
            f"{self.name:46} {self.rate:>12.1f} store commands/s while idle"
            f" (target <= {IDLE_COMMANDS_TARGET:.0f})"
        )


def _counted(backend: Backend, seconds: float, run: Callable[[], None], stop: Callable[[], None]) -> IdleRate:
    """Commands ``backend`` sends in ``seconds`` while ``run`` waits in a thread (``stop`` ends it)."""
    failed: list[BaseException] = []

    def waiting() -> None:
        try:
            run()
        except BaseException as exc:  # reported by the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=waiting, daemon=True)
    thread.start()
    time.sleep(0.5)  # past start-up: joining, taking ownership
    before, started = backend.commands, time.monotonic()
    time.sleep(seconds)
    commands, spent = backend.commands - before, time.monotonic() - started
    stop()
    thread.join()
    if failed:
        raise failed[0]
    return IdleRate(name="", commands=commands, seconds=spent)


def idle_rates(url: str, *, seconds: float = 3.0) -> list[IdleRate]:
    """The idle cost of an ungrouped consumer, a group's consumer and a waiting dequeue, each alone."""
    name = f"bench-idle-{uuid.uuid4().hex[:8]}"
    setup = connect(url)
    Queue.create(setup, name, capacity=100, slots_per_record=10)
    rates = []
    try:
        for label, group in (("idle consumer iterator", None), ("idle group consumer iterator", "idle")):
            backend = connect(url)
            consumer = Queue.open(backend, name).consumer("bench-idle", group=group).start()

            def iterate(consumer: Consumer = consumer) -> None:
                for message in consumer:
                    raise AssertionError(f"nothing was enqueued, yet {message} came")

            try:
                rates.append(replace(_counted(backend, seconds, iterate, consumer.close), name=label))
            finally:
                consumer.close()
                backend.close()
            if group is not None:
                Queue.open(setup, name).delete_group(group)
        backend = connect(url)
        queue = Queue.open(backend, name)
        stop = threading.Event()

        def dequeue() -> None:
            while not stop.is_set():
                if queue.dequeue(timeout=0.5) is not None:
                    raise AssertionError("nothing was enqueued, yet an entry came")

        try:
            rates.append(
                replace(_counted(backend, seconds, dequeue, stop.set), name="idle Queue.dequeue(timeout=...)")
            )
        finally:
            backend.close()
    finally:
        Queue.delete(setup, name)
        setup.close()
    return rates


__all__ = ["IDLE_COMMANDS_TARGET", "IdleRate", "idle_rates"]
