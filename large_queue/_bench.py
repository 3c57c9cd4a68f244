"""``large-queue bench``: throughput and round trips per operation.

Every figure is printed next to the raw single-record command rate of the
same store, measured in the same run, so the numbers compare across machines:
a ratio of 0.33 for single enqueues means the queue runs at one third of
the rate of bare commands, which is what 3 round trips per enqueue cost.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from large_queue._records import QueueKeys
from large_queue.backends import Backend, Increment, Read, WriteMode, connect
from large_queue.queue import Queue

CONCURRENT_ROUNDS = 3
CONCURRENT_OPERATIONS_FACTOR = 3


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One measured line of the report."""

    name: str
    operations: int
    calls: int
    seconds: float
    round_trips: int
    unit: str = "ops"

    @property
    def rate(self) -> float:
        """Operations (or entries) per second."""
        return self.operations / self.seconds if self.seconds else 0.0

    @property
    def round_trips_per_call(self) -> float:
        """Store commands per API call (one single operation or one whole batch)."""
        return self.round_trips / self.calls if self.calls else 0.0


def _timed(
    name: str,
    backend: Backend,
    count: int,
    step: Callable[[int], int],
    *,
    unit: str = "ops",
    progress: bool = True,
) -> Figure:
    """Run ``step(i)`` ``count`` times; each returns how many operations it did."""
    done = 0
    before = backend.commands
    start = time.perf_counter()
    for i in tqdm(range(count), desc=name, leave=False, disable=not progress, mininterval=0.5):
        done += step(i)
    seconds = time.perf_counter() - start
    return Figure(
        name=name,
        operations=done,
        calls=count,
        seconds=seconds,
        round_trips=backend.commands - before,
        unit=unit,
    )


def _raw_commands(backend: Backend, count: int, progress: bool) -> Figure:
    key = QueueKeys(
        name=f"bench-raw-{uuid.uuid4().hex[:8]}",
        metadata_namespace=backend.default_namespace,
        buffer_namespace=backend.default_namespace,
    ).metadata
    backend.put(key, {"n": 0}, mode=WriteMode.CREATE_ONLY)
    try:
        return _timed(
            "raw single-record command",
            backend,
            count,
            lambda i: len(backend.operate(key, [Increment("n", 1), Read("n")])),
            progress=progress,
        )
    finally:
        backend.remove(key)


def _owner_figures(
    queue: Queue, operations: int, batches: int, batch_size: int, progress: bool
) -> list[Figure]:
    """Dequeues by the owning node of the cluster shim: no queue lock per operation."""
    backend = queue.backend
    with queue.consumer("bench", time_slice=3600, timeout=3600, poll_interval=3600) as consumer:
        queue.enqueue_batch([{"n": n} for n in range(min(operations, queue.capacity))])
        single = _timed(
            "owner dequeue (single, no lock)",
            backend,
            operations,
            lambda i: len(consumer.dequeue(1)),
            progress=progress,
        )
        queue.enqueue_batch([{"n": n} for n in range(min(batches * batch_size, queue.capacity))])

        def receive_and_ack(i: int) -> int:
            messages = consumer.receive(batch_size)
            consumer.ack(messages)
            return len(messages)

        batch = _timed(
            f"owner receive + ack (batches of {batch_size})",
            backend,
            batches,
            receive_and_ack,
            unit="entries",
            progress=progress,
        )
    return [single, batch]


def _producer_process(url: str, name: str, count: int, start_event: Any, results: Any) -> None:
    queue = Queue.open(connect(url), name)
    producer = uuid.uuid4().hex[:6]
    opened = queue.backend.commands  # opening the queue read its metadata: not an enqueue's cost
    start_event.wait()
    began = time.perf_counter()
    for n in range(count):
        queue.enqueue(f"{producer}:{n}")
    results.put((time.perf_counter() - began, queue.backend.commands - opened))


def _concurrent(url: str, processes: int, per_process: int) -> tuple[Figure, bool]:
    """``processes`` producers enqueue at once; then check every entry arrived exactly once."""
    backend = connect(url)
    name = f"bench-conc-{uuid.uuid4().hex[:8]}"
    queue = Queue.create(backend, name, capacity=processes * per_process, slots_per_record=100)
    context = multiprocessing.get_context("spawn")
    start_event, results = context.Event(), context.Queue()
    workers = [
        context.Process(target=_producer_process, args=(url, name, per_process, start_event, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    time.sleep(0.5)  # let every interpreter start before the clock does
    began = time.perf_counter()
    start_event.set()
    reports = [results.get() for _ in workers]
    seconds = time.perf_counter() - began
    for worker in workers:
        worker.join()
    values = [e.value for e in queue.dequeue_batch(processes * per_process)]
    exact = len(values) == len(set(values)) == processes * per_process
    Queue.delete(backend, name)
    figure = Figure(
        name=f"{processes} producer process(es), single enqueue",
        operations=processes * per_process,
        calls=processes * per_process,
        seconds=seconds,
        round_trips=sum(commands for _, commands in reports),
    )
    return figure, exact


@dataclass(frozen=True, kw_only=True)
class Report:
    """Everything one bench run measured."""

    store: str
    processes: int
    raw: Figure
    figures: list[Figure]
    one: Figure  # the median round's single producer
    many: Figure  # ... and its concurrent producers
    ratios: list[float]  # concurrent / single aggregate rate, every round, sorted
    exactly_once: bool  # every concurrently produced entry arrived exactly once, in every round

    def lines(self) -> list[str]:
        """The report as printed by ``large-queue bench``."""
        lines = [
            f"store: {self.store}",
            f"{'measure':44} {'rate':>20} {'round trips/call':>17} {'x raw rate':>11}",
        ]
        for figure in [self.raw, *self.figures, self.one, self.many]:
            rate = f"{figure.rate:,.0f} {figure.unit}/s"
            lines.append(
                f"{figure.name:44} {rate:>20} {figure.round_trips_per_call:>17.3f}"
                f" {figure.rate / self.raw.rate:>11.2f}"
            )
        ratios = ", ".join(f"{ratio:.2f}" for ratio in self.ratios)
        lines.append(
            f"{self.processes} producers vs 1: aggregate {self.many.rate / self.one.rate:.2f}x (median of"
            f" {len(self.ratios)} rounds: {ratios}); every entry exactly once: {self.exactly_once}"
        )
        return lines


def measure(
    url: str,
    *,
    operations: int = 3000,
    batches: int = 300,
    batch_size: int = 100,
    processes: int = 4,
    progress: bool = True,
) -> Report:
    """Run every measurement on the store at ``url``."""
    backend = connect(url)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    # Room for the largest fill, plus the owner's acked entries still below the
    # queue's head (the shim moves the head in steps, not at every ack).
    capacity = max(operations, batches * batch_size) + operations
    queue = Queue.create(backend, name, capacity=capacity, slots_per_record=100)
    try:
        raw = _raw_commands(backend, operations, progress)
        figures = [
            _timed(
                "enqueue (single)",
                backend,
                operations,
                lambda i: len([queue.enqueue({"n": i})]),
                progress=progress,
            ),
            _timed(
                "dequeue (single)",
                backend,
                operations,
                lambda i: 1 if queue.dequeue() else 0,
                progress=progress,
            ),
            _timed(
                f"enqueue (batches of {batch_size})",
                backend,
                batches,
                lambda i: len(queue.enqueue_batch([{"n": i, "k": k} for k in range(batch_size)])),
                unit="entries",
                progress=progress,
            ),
            _timed(
                f"dequeue (batches of {batch_size})",
                backend,
                batches,
                lambda i: len(queue.dequeue_batch(batch_size)),
                unit="entries",
                progress=progress,
            ),
        ]
        figures += _owner_figures(queue, operations, batches, batch_size, progress)
    finally:
        Queue.delete(backend, name)
    # The same number of entries either way (enough that starting and finishing
    # are a small part of a round), in interleaved rounds so that a slow moment
    # of the machine hits both sides; the median round counts.
    total = max(200 * processes, CONCURRENT_OPERATIONS_FACTOR * operations)
    rounds = []
    for _ in range(CONCURRENT_ROUNDS):
        one, one_exact = _concurrent(url, 1, total)
        many, many_exact = _concurrent(url, processes, total // processes)
        rounds.append((many.rate / one.rate, one, many, one_exact and many_exact))
    rounds.sort(key=lambda round_: round_[0])
    _, one, many, _ = rounds[len(rounds) // 2]
    return Report(
        store=repr(backend),
        processes=processes,
        raw=raw,
        figures=figures,
        one=one,
        many=many,
        ratios=[ratio for ratio, *_ in rounds],
        exactly_once=all(exact for *_, exact in rounds),
    )
