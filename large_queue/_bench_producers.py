"""The benchmark's producer measurements: many producer processes at once, and the batching producer.

Producer processes each enqueue single entries; the figure that matters is
the aggregate rate of N processes over that of one, in interleaved rounds
(the median round counts), with every entry then checked to have arrived
exactly once. Run as well with a simulated network round trip: every store
command is delayed by a fixed time before it is sent (the store's own work
is unchanged), which is what producers on other machines see and what
makes waiting on a lock cost what it costs in production.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from large_queue._entries import DEFAULT_ENCODING
from large_queue._stats import QueueStats, combined
from large_queue.backends import Backend, connect
from large_queue.backends._delegating import Delegating
from large_queue.producer import DEFAULT_MAX_BATCH
from large_queue.queue import Entry, Queue


@dataclass(frozen=True, kw_only=True)
class Sample:
    """Producers' work in one round: entries, seconds, commands and CPU seconds, and their counters."""

    entries: int
    calls: int
    seconds: float
    commands: int
    cpu_seconds: float
    stats: QueueStats | None = None

    @property
    def rate(self) -> float:
        """Entries per second."""
        return self.entries / self.seconds if self.seconds else 0.0


class Delayed(Delegating):
    """Sleeps ``delay`` seconds before each command: a network round trip the store does not see."""

    def __init__(self, inner: Backend, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay

    def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Wait, then send the command."""
        time.sleep(self.delay)
        return super().relay(method, *args, **kwargs)

    def grouped(self) -> contextlib.AbstractContextManager[None]:
        """No group: across a network each command goes alone (a group would hold the store while waiting)."""
        return contextlib.nullcontext()


#: slots per buffer record of the producers' queues
SLOTS_PER_RECORD = 100
#: slots beyond the entries sent: a reservation that timed out in doubt and was made again leaves
#: its first try as a hole, which holds slots until a reader closes it (a queue sized exactly
#: could then refuse the last entries as full)
HOLE_ROOM = 10 * SLOTS_PER_RECORD


def _store(url: str, delay: float) -> Backend:
    backend = connect(url)
    return Delayed(backend, delay) if delay else backend


def _producer_process(url: str, name: str, count: int, delay: float, start_event: Any, results: Any) -> None:
    queue = Queue.open(_store(url, delay), name)
    producer = uuid.uuid4().hex[:6]
    opened = queue.backend.commands  # opening the queue read its metadata: not an enqueue's cost
    start_event.wait()
    began, cpu = time.perf_counter(), time.process_time()
    for n in range(count):
        queue.enqueue(f"{producer}:{n}")
    results.put(
        (
            time.perf_counter() - began,
            queue.backend.commands - opened,
            time.process_time() - cpu,
            queue.stats(),
        )
    )


def concurrent(
    url: str,
    processes: int,
    per_process: int,
    *,
    appends: str,
    delay: float = 0.0,
    encoding: str = DEFAULT_ENCODING,
) -> tuple[Sample, bool]:
    """``processes`` producers enqueue at once; then check every entry arrived exactly once."""
    backend = connect(url)
    name = f"bench-conc-{uuid.uuid4().hex[:8]}"
    queue = Queue.create(
        backend,
        name,
        capacity=processes * per_process + HOLE_ROOM,
        slots_per_record=SLOTS_PER_RECORD,
        appends=appends,
        encoding=encoding,
    )
    context = multiprocessing.get_context("spawn")
    start_event, results = context.Event(), context.Queue()
    workers = [
        context.Process(target=_producer_process, args=(url, name, per_process, delay, start_event, results))
        for _ in range(processes)
    ]
    try:
        _start_deaf_to_interrupts(workers)
        time.sleep(0.5)  # let every interpreter start before the clock does
        began = time.perf_counter()
        start_event.set()
        reports = [results.get() for _ in workers]
        seconds = time.perf_counter() - began
        for worker in workers:
            worker.join()
        values = [e.value for e in drain(queue, processes * per_process)]
        left = queue.dequeue_batch(10)  # an entry twice would be left after the expected count
    finally:  # also on Ctrl-C: no worker left running, no queue left behind
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join()
        Queue.delete(backend, name)
    # every value once, each producer's values 0..n-1 in its order, and nothing more in the queue
    sequences: dict[str, list[int]] = {}
    for value in values:
        producer, _, sequence = value.partition(":")
        sequences.setdefault(producer, []).append(int(sequence))
    exact = (
        len(values) == processes * per_process
        and not left
        and len(sequences) == processes
        and all(sequence == list(range(per_process)) for sequence in sequences.values())
    )
    sample = Sample(
        entries=processes * per_process,
        calls=processes * per_process,
        seconds=seconds,
        commands=sum(commands for _, commands, _, _ in reports),
        cpu_seconds=sum(cpu for _, _, cpu, _ in reports),
        stats=combined([stats for *_, stats in reports]),
    )
    return sample, exact


def _start_deaf_to_interrupts(workers: list[Any]) -> None:
    """Start ``workers`` with Ctrl-C ignored: it is the parent's to handle (it stops them).

    Set before they start, so that a Ctrl-C while they import (when a
    handler set by the worker itself is not there yet) prints no traceback
    of theirs: an interpreter that starts with SIGINT ignored keeps it so.
    """
    if threading.current_thread() is not threading.main_thread():
        for worker in workers:
            worker.start()
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for worker in workers:
            worker.start()
    finally:
        signal.signal(signal.SIGINT, before)


def drain(queue: Queue, expected: int) -> list[Entry]:
    """Dequeue until ``expected`` entries came, or for the hole timeout and a little more.

    A reservation that timed out in doubt and was made again leaves a hole,
    which hides what follows it until a reader closes it.
    """
    entries: list[Entry] = []
    deadline = time.monotonic() + queue.hole_timeout * 2 + 5
    while len(entries) < expected and time.monotonic() < deadline:
        taken = queue.dequeue_batch(expected - len(entries))
        entries += taken
        if not taken:
            time.sleep(0.05)
    return entries


def producer_object(
    url: str,
    threads: int,
    per_thread: int,
    *,
    max_batch: int = DEFAULT_MAX_BATCH,
    encoding: str = DEFAULT_ENCODING,
) -> tuple[Sample, bool]:
    """``threads`` application threads send single entries through one producer object."""
    backend = connect(url)
    name = f"bench-producer-{uuid.uuid4().hex[:8]}"
    total = threads * per_thread
    capacity = total + max(HOLE_ROOM, 3 * max_batch)  # a timed-out batch's hole is up to max_batch long
    queue = Queue.create(
        backend,
        name,
        capacity=capacity,
        slots_per_record=SLOTS_PER_RECORD,
        appends="reserve",
        encoding=encoding,
    )
    try:
        return _fed_by_threads(queue, threads, per_thread, max_batch)
    finally:  # also on Ctrl-C: no queue left behind
        Queue.delete(backend, name)


def _fed_by_threads(queue: Queue, threads: int, per_thread: int, max_batch: int) -> tuple[Sample, bool]:
    """:func:`producer_object`'s run on its queue."""
    backend = queue.backend
    total = threads * per_thread
    offsets: list[list[int]] = [[] for _ in range(threads)]
    opened = backend.commands
    with queue.producer(max_batch=max_batch) as producer:

        def send(index: int) -> None:
            futures = [producer.send({"t": index, "n": n}) for n in range(per_thread)]
            offsets[index] = [future.result() for future in futures]

        workers = [threading.Thread(target=send, args=(index,)) for index in range(threads)]
        began, cpu = time.perf_counter(), time.process_time()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        producer.flush()
        seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu
    commands = backend.commands - opened
    stats = queue.stats()
    entries = drain(queue, total)
    sent = {
        offset: {"t": index, "n": n} for index, each in enumerate(offsets) for n, offset in enumerate(each)
    }
    # each future's offset holds the value sent with it, every value once, and nothing more is queued
    exact = (
        len(entries) == total == len(sent)
        and all(sent.get(entry.offset) == entry.value for entry in entries)
        and not queue.dequeue_batch(10)
    )
    return Sample(
        entries=total,
        calls=stats.enqueue_calls,
        seconds=seconds,
        commands=commands,
        cpu_seconds=cpu_seconds,
        stats=stats,
    ), exact
