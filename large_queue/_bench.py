"""``large-queue bench``: throughput, round trips and client CPU per operation.

Every figure is printed next to the raw single-record command rate of the
same store, measured in the same run, so the numbers compare across machines:
a ratio of 0.33 for single enqueues means the queue runs at one third of
the rate of bare commands, which is what 3 round trips per enqueue cost.

Each single-process operation also has a floor, measured in the same run:
the very store commands that the operation sent, recorded and replayed with
every argument prepared ahead and no library code around them
(:mod:`large_queue._floor`). The ratio to the floor is what the library's
own work costs; the ratio to the raw rate is what the protocol's round
trips cost. Client CPU time (``time.process_time``) per call is printed
beside each rate.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from large_queue import _floor
from large_queue._stats import QueueStats, combined
from large_queue.backends import Backend, Increment, Read, RecordKey, WriteMode, connect
from large_queue.queue import Queue

CONCURRENT_ROUNDS = 3
#: rounds in which each operation alternates with its floor
PHASE_ROUNDS = 6
CONCURRENT_OPERATIONS_FACTOR = 3


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One measured line of the report."""

    name: str
    operations: int
    calls: int
    seconds: float
    round_trips: int
    cpu_seconds: float
    unit: str = "ops"
    floor: Figure | None = None
    raw: Figure | None = None  # raw commands timed in the same rounds

    @property
    def rate(self) -> float:
        """Operations (or entries) per second."""
        return self.operations / self.seconds if self.seconds else 0.0

    @property
    def round_trips_per_call(self) -> float:
        """Store commands per API call (one single operation or one whole batch)."""
        return self.round_trips / self.calls if self.calls else 0.0

    @property
    def cpu_us_per_call(self) -> float:
        """Client CPU time per API call, in microseconds."""
        return self.cpu_seconds / self.calls * 1e6 if self.calls else 0.0


@contextlib.contextmanager
def _clock() -> Iterator[list[float]]:
    """Wall and CPU seconds of the body: ``[wall, cpu]``, filled in when it ends."""
    spent = [0.0, 0.0]
    wall, cpu = time.perf_counter(), time.process_time()
    yield spent
    spent[0], spent[1] = time.perf_counter() - wall, time.process_time() - cpu


def _raw_command(backend: Backend, key: RecordKey) -> int:
    """The raw single-record command: increment a counter and read it back."""
    return len(backend.operate(key, [Increment("n", 1), Read("n")]))


@dataclass(frozen=True, kw_only=True)
class Phase:
    """One measured operation: ``step(handle, i)`` returns how many operations it did.

    ``opened(queue)`` is entered before the clock starts and gives the
    handle (the queue itself, or a consumer of it); it is left after.
    """

    name: str
    count: int
    step: Callable[[Any, int], int]
    opened: Callable[[Queue], contextlib.AbstractContextManager[Any]]
    unit: str = "ops"


@contextlib.contextmanager
def _as_is(queue: Queue) -> Iterator[Queue]:
    yield queue


def _owning(fill: int) -> Callable[[Queue], contextlib.AbstractContextManager[Any]]:
    """A consumer that owns the queue (slices and timeouts far longer than the run), after a fill."""

    @contextlib.contextmanager
    def opened(queue: Queue) -> Iterator[Any]:
        with queue.consumer("bench", time_slice=3600, timeout=3600, poll_interval=3600) as consumer:
            queue.enqueue_batch([{"n": n} for n in range(fill)])
            yield consumer

    return opened


def _receive_and_ack(consumer: Any, batch_size: int) -> int:
    messages = consumer.receive(batch_size)
    consumer.ack(messages)
    return len(messages)


def _phases(queue_capacity: int, operations: int, batches: int, batch_size: int) -> list[Phase]:
    return [
        Phase(
            name="enqueue (single)",
            count=operations,
            step=lambda queue, i: len([queue.enqueue({"n": i})]),
            opened=_as_is,
        ),
        Phase(
            name="dequeue (single)",
            count=operations,
            step=lambda queue, i: 1 if queue.dequeue() else 0,
            opened=_as_is,
        ),
        Phase(
            name=f"enqueue (batches of {batch_size})",
            count=batches,
            step=lambda queue, i: len(queue.enqueue_batch([{"n": i, "k": k} for k in range(batch_size)])),
            opened=_as_is,
            unit="entries",
        ),
        Phase(
            name=f"dequeue (batches of {batch_size})",
            count=batches,
            step=lambda queue, i: len(queue.dequeue_batch(batch_size)),
            opened=_as_is,
            unit="entries",
        ),
        Phase(
            name="owner dequeue (single, no lock)",
            count=operations,
            step=lambda consumer, i: len(consumer.dequeue(1)),
            opened=_owning(min(operations, queue_capacity)),
        ),
        Phase(
            name=f"owner receive + ack (batches of {batch_size})",
            count=batches,
            step=lambda consumer, i: _receive_and_ack(consumer, batch_size),
            opened=_owning(min(batches * batch_size, queue_capacity)),
            unit="entries",
        ),
    ]


@dataclass(frozen=True, kw_only=True)
class _Twins:
    """Three queues that start alike: timed through the library, recorded, and replayed."""

    timed: Queue
    recorded: Queue
    recording: _floor.Recording
    replayed: Queue
    raw_key: RecordKey  # the record of the raw commands timed beside each phase


def _shares(count: int, rounds: int) -> list[int]:
    """``count`` split into at most ``rounds`` near-equal positive parts."""
    return [part for part in (count * (r + 1) // rounds - count * r // rounds for r in range(rounds)) if part]


def _prepared(twins: _Twins) -> list[_floor.Replay]:
    """What the recorded twin was sent since the log was last cleared, prepared for the floor's twin."""
    log = twins.recording.log
    replays = _floor.prepare(log, twins.replayed.backend, source=twins.recorded, target=twins.replayed)
    log.clear()
    return replays


def _run_phase(phase: Phase, twins: _Twins, progress: bool) -> Figure:
    """Time ``phase`` through the library and as its floor, in alternating rounds.

    Each round runs a share of the operations on the timed twin, the same
    share on the recorded twin (untimed), and then replays what was recorded
    on the third twin, prepared ahead: a slow moment of the machine hits
    both sides alike.
    """
    backend = twins.timed.backend
    library, floor, raw = _Tally(), _Tally(), _Tally()
    operations = 0
    twins.recording.log.clear()
    with phase.opened(twins.timed) as timed, phase.opened(twins.recorded) as recorded:
        _floor.run(_prepared(twins))  # the floor's twin is opened alike, untimed
        done = 0
        for share in tqdm(
            _shares(phase.count, PHASE_ROUNDS), desc=phase.name, leave=False, disable=not progress
        ):
            commands = backend.commands
            with _clock() as spent:
                for i in range(done, done + share):
                    operations += phase.step(timed, i)
            library.add(spent, backend.commands - commands)
            for i in range(done, done + share):
                phase.step(recorded, i)
            replays = _prepared(twins)
            with _clock() as spent:
                _floor.run(replays)
            floor.add(spent, len(replays))
            with _clock() as spent:
                for _ in replays:
                    _raw_command(backend, twins.raw_key)
            raw.add(spent, len(replays))
            done += share
    _floor.run(_prepared(twins))  # and closed alike
    raw_figure = raw.figure("raw single-record command", raw.commands, raw.commands)
    return library.figure(
        phase.name,
        operations,
        phase.count,
        unit=phase.unit,
        raw=raw_figure,
        floor=floor.figure(
            "  floor: the same commands, prepared", operations, phase.count, unit=phase.unit, raw=raw_figure
        ),
    )


@dataclass
class _Tally:
    """Wall time, CPU time and commands, summed over rounds."""

    seconds: float = 0.0
    cpu_seconds: float = 0.0
    commands: int = 0

    def add(self, spent: list[float], commands: int) -> None:
        self.seconds += spent[0]
        self.cpu_seconds += spent[1]
        self.commands += commands

    def figure(self, name: str, operations: int, calls: int, *, unit: str = "ops", **links: Figure) -> Figure:
        return Figure(
            name=name,
            operations=operations,
            calls=calls,
            seconds=self.seconds,
            round_trips=self.commands,
            cpu_seconds=self.cpu_seconds,
            unit=unit,
            **links,
        )


def _producer_process(url: str, name: str, count: int, start_event: Any, results: Any) -> None:
    queue = Queue.open(connect(url), name)
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


def _concurrent(url: str, processes: int, per_process: int) -> tuple[Figure, bool, QueueStats]:
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
        round_trips=sum(commands for _, commands, _, _ in reports),
        cpu_seconds=sum(cpu for _, _, cpu, _ in reports),
    )
    return figure, exact, combined([stats for *_, stats in reports])


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
    many_stats: QueueStats  # the median round's concurrent producers' counters, added up

    def lines(self) -> list[str]:
        """The report as printed by ``large-queue bench``."""
        lines = [
            f"store: {self.store}",
            f"{'measure':46} {'rate':>20} {'round trips':>11} {'x raw':>6} {'CPU us':>8} {'x floor':>8}",
            f"{'':46} {'':>20} {'per call':>11} {'rate':>6} {'per call':>8} {'':>8}",
        ]
        for figure in [self.raw, *self.figures, self.one, self.many]:
            lines.append(self._line(figure, figure.floor))
            if figure.floor is not None:
                lines.append(self._line(figure.floor, None))
        ratios = ", ".join(f"{ratio:.2f}" for ratio in self.ratios)
        lines.append(
            f"{self.processes} producers vs 1: aggregate {self.many.rate / self.one.rate:.2f}x (median of"
            f" {len(self.ratios)} rounds: {ratios}); every entry exactly once: {self.exactly_once}"
        )
        stats = self.many_stats
        lines.append(
            f"{self.processes} producers' locks: {stats.lock_waits / max(1, stats.enqueue_calls):.2f} refused"
            f" attempts per enqueue, {stats.locks_broken} broken, {stats.locks_lost} lost,"
            f" {stats.outcomes_unknown} in doubt"
        )
        return lines

    def _line(self, figure: Figure, floor: Figure | None) -> str:
        rate = f"{figure.rate:,.0f} {figure.unit}/s"
        versus_floor = f"{figure.rate / floor.rate:8.2f}" if floor is not None and floor.rate else f"{'':>8}"
        raw = figure.raw or self.raw
        return (
            f"{figure.name:46} {rate:>20} {figure.round_trips_per_call:>11.3f}"
            f" {figure.rate / raw.rate:>6.2f} {figure.cpu_us_per_call:>8.0f} {versus_floor}"
        )


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
    recording = _floor.Recording(backend)
    names = [f"{name}-{role}" for role in ("timed", "rec", "floor")]
    raw_key = RecordKey(backend.default_namespace, f"{name}-raw", "raw")
    try:
        queues = [Queue.create(backend, twin, capacity=capacity, slots_per_record=100) for twin in names]
        twins = _Twins(
            timed=queues[0],
            recorded=Queue.open(recording, names[1]),
            recording=recording,
            replayed=queues[2],
            raw_key=raw_key,
        )
        backend.put(twins.raw_key, {"n": 0}, mode=WriteMode.CREATE_ONLY)
        figures = [
            _run_phase(phase, twins, progress) for phase in _phases(capacity, operations, batches, batch_size)
        ]
    finally:
        backend.remove(raw_key)
        for twin in names:
            Queue.delete(backend, twin)
    every_round = _Tally()
    for sample in (figure.raw for figure in figures if figure.raw is not None):
        every_round.add([sample.seconds, sample.cpu_seconds], sample.round_trips)
    raw = every_round.figure(
        "raw single-record command (all rounds)", every_round.commands, every_round.commands
    )
    # The same number of entries either way (enough that starting and finishing
    # are a small part of a round), in interleaved rounds so that a slow moment
    # of the machine hits both sides; the median round counts.
    total = max(200 * processes, CONCURRENT_OPERATIONS_FACTOR * operations)
    rounds = []
    for _ in range(CONCURRENT_ROUNDS):
        one, one_exact, _ = _concurrent(url, 1, total)
        many, many_exact, many_stats = _concurrent(url, processes, total // processes)
        rounds.append((many.rate / one.rate, one, many, one_exact and many_exact, many_stats))
    rounds.sort(key=lambda round_: round_[0])
    _, one, many, _, many_stats = rounds[len(rounds) // 2]
    return Report(
        store=repr(backend),
        processes=processes,
        raw=raw,
        figures=figures,
        one=one,
        many=many,
        ratios=[ratio for ratio, *_ in rounds],
        exactly_once=all(exact for *_, exact, _ in rounds),
        many_stats=many_stats,
    )
