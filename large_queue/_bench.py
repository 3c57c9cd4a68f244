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
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm import tqdm

from large_queue import _bench_idle, _bench_persist, _bench_producers, _bench_receipts, _floor
from large_queue._bench_producers import Sample
from large_queue._entries import DEFAULT_ENCODING
from large_queue._stats import QueueStats
from large_queue.backends import Backend, Increment, Read, RecordKey, WriteMode, connect
from large_queue.backends.embedded import EmbeddedBackend
from large_queue.queue import Queue

CONCURRENT_ROUNDS = 3
#: the simulated network round trip of the producer measurements, in seconds
SIMULATED_ROUND_TRIP = 0.0003
#: how producers append, in the order the bench measures them
MODES = ("lock", "reserve")
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
        with queue.consumer("bench", time_slice=3600, timeout=3600, poll_interval=1800) as consumer:
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
            sent = _floor.command_count(replays)
            with _clock() as spent:
                _floor.run(replays)
            floor.add(spent, sent)
            with _clock() as spent:
                for _ in range(sent):
                    _raw_command(backend, twins.raw_key)
            raw.add(spent, sent)
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


@dataclass(frozen=True, kw_only=True)
class Scaling:
    """N producer processes against one, in interleaved rounds: the median round, and every round's ratio."""

    appends: str
    delay: float
    processes: int
    one: Figure
    many: Figure
    ratios: list[float]  # concurrent / single aggregate rate, every round, sorted
    exactly_once: bool
    many_stats: QueueStats

    def line(self) -> str:
        """One line of the report."""
        network = f"{self.delay * 1e6:.0f} us round trip" if self.delay else "store as is"
        ratios = ", ".join(f"{ratio:.2f}" for ratio in self.ratios)
        stats = self.many_stats
        locks = (
            f"; {stats.lock_waits / max(1, stats.enqueue_calls):.2f} refused lock attempts per enqueue"
            if self.appends == "lock"
            else ""
        )
        return (
            f"{self.processes} producers vs 1 ({self.appends}, {network}): {self.one.rate:,.0f} -> "
            f"{self.many.rate:,.0f} ops/s = {self.many.rate / self.one.rate:.2f}x (rounds: {ratios}),"
            f" {self.one.round_trips_per_call:.2f} round trips per enqueue{locks};"
            f" every entry exactly once: {self.exactly_once}"
        )


@dataclass(frozen=True, kw_only=True)
class Report:
    """Everything one bench run measured."""

    store: str
    processes: int
    raw: Figure
    figures: list[Figure]
    scaling: list[Scaling]
    producer: Figure | None  # the batching producer object, fed by threads
    producer_threads: int
    producer_exact: bool
    persist: list[_bench_persist.Pair]  # beside persist-queue (embedded store only)
    persist_note: str | None  # why that comparison is missing, or which persist-queue it was
    idle: list[_bench_idle.IdleRate]  # what waiting on an empty queue costs
    receipts: list[_bench_receipts.ReceiptCost] = field(default_factory=list)  # what receipts cost

    @property
    def exactly_once(self) -> bool:
        """Every concurrently produced entry arrived exactly once, in every measurement."""
        return all(scaling.exactly_once for scaling in self.scaling) and self.producer_exact

    def lines(self) -> list[str]:
        """The report as printed by ``large-queue bench``."""
        lines = [
            f"store: {self.store}",
            f"{'measure':46} {'rate':>20} {'round trips':>11} {'x raw':>6} {'CPU us':>8} {'x floor':>8}",
            f"{'':46} {'':>20} {'per call':>11} {'rate':>6} {'per call':>8} {'':>8}",
        ]
        for figure in [self.raw, *self.figures]:
            lines.append(self._line(figure, figure.floor))
            if figure.floor is not None:
                lines.append(self._line(figure.floor, None))
        if self.producer is not None:
            lines.append(self._line(self.producer, None))
            lines.append(
                f"{'':46} {self.producer.operations / max(1, self.producer.calls):,.1f} entries per"
                f" enqueue_batch; every entry exactly once: {self.producer_exact}"
            )
        lines += [scaling.line() for scaling in self.scaling]
        lines += [rate.line() for rate in self.idle]
        lines += [cost.line() for cost in self.receipts]
        if self.persist_note:
            lines.append(self.persist_note)
        lines += [pair.line() for pair in self.persist]
        return lines

    def _line(self, figure: Figure, floor: Figure | None) -> str:
        rate = f"{figure.rate:,.0f} {figure.unit}/s"
        versus_floor = f"{figure.rate / floor.rate:8.2f}" if floor is not None and floor.rate else f"{'':>8}"
        raw = figure.raw or self.raw
        return (
            f"{figure.name:46} {rate:>20} {figure.round_trips_per_call:>11.3f}"
            f" {figure.rate / raw.rate:>6.2f} {figure.cpu_us_per_call:>8.0f} {versus_floor}"
        )


def _figure(name: str, sample: Sample, unit: str = "ops") -> Figure:
    return Figure(
        name=name,
        operations=sample.entries,
        calls=sample.calls,
        seconds=sample.seconds,
        round_trips=sample.commands,
        cpu_seconds=sample.cpu_seconds,
        unit=unit,
    )


def _scaling(url: str, processes: int, total: int, *, appends: str, delay: float, encoding: str) -> Scaling:
    """One producer against ``processes``, in :data:`CONCURRENT_ROUNDS` interleaved rounds."""
    rounds = []
    for _ in range(CONCURRENT_ROUNDS):
        one, one_exact = _bench_producers.concurrent(
            url, 1, total, appends=appends, delay=delay, encoding=encoding
        )
        many, many_exact = _bench_producers.concurrent(
            url, processes, total // processes, appends=appends, delay=delay, encoding=encoding
        )
        rounds.append((many.rate / one.rate, one, many, one_exact and many_exact))
    rounds.sort(key=lambda round_: round_[0])
    _, one, many, _ = rounds[len(rounds) // 2]
    assert many.stats is not None
    return Scaling(
        appends=appends,
        delay=delay,
        processes=processes,
        one=_figure("1 producer process, single enqueue", one),
        many=_figure(f"{processes} producer processes, single enqueue", many),
        ratios=[ratio for ratio, *_ in rounds],
        exactly_once=all(exact for *_, exact in rounds),
        many_stats=many.stats,
    )


def measure(
    url: str,
    *,
    operations: int = 3000,
    batches: int = 300,
    batch_size: int = 100,
    processes: int = 4,
    threads: int = 8,
    progress: bool = True,
    encoding: str = DEFAULT_ENCODING,
) -> Report:
    """Run every measurement on the store at ``url``, on queues that store entries as ``encoding``.

    The single-process phases run for each way of appending (:data:`MODES`);
    producer scaling runs for each, on the store as it is and with a
    simulated network round trip of :data:`SIMULATED_ROUND_TRIP`.
    """
    backend = connect(url)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    # Room for the largest fill, plus the owner's acked entries still below the
    # queue's head (the shim moves the head in steps, not at every ack).
    capacity = max(operations, batches * batch_size) + operations
    recording = _floor.Recording(backend)
    raw_key = RecordKey(backend.default_namespace, f"{name}-raw", "raw")
    figures: list[Figure] = []
    backend.put(raw_key, {"n": 0}, mode=WriteMode.CREATE_ONLY)
    try:
        for appends in MODES:
            names = [f"{name}-{appends}-{role}" for role in ("timed", "rec", "floor")]
            try:
                queues = [
                    Queue.create(
                        backend,
                        twin,
                        capacity=capacity,
                        slots_per_record=100,
                        appends=appends,
                        encoding=encoding,
                    )
                    for twin in names
                ]
                twins = _Twins(
                    timed=queues[0],
                    recorded=Queue.open(recording, names[1]),
                    recording=recording,
                    replayed=queues[2],
                    raw_key=raw_key,
                )
                for phase in _phases(capacity, operations, batches, batch_size):
                    figure = _run_phase(phase, twins, progress)
                    if appends != MODES[0]:
                        figure = replace(figure, name=f"{figure.name}, {appends}")
                    figures.append(figure)
            finally:
                for twin in names:
                    Queue.delete(backend, twin)
    finally:
        backend.remove(raw_key)
    every_round = _Tally()
    for timed in (figure.raw for figure in figures if figure.raw is not None):
        every_round.add([timed.seconds, timed.cpu_seconds], timed.round_trips)
    raw = every_round.figure(
        "raw single-record command (all rounds)", every_round.commands, every_round.commands
    )
    # The same number of entries either way (enough that starting and finishing
    # are a small part of a round), in interleaved rounds so that a slow moment
    # of the machine hits both sides; the median round counts. With the
    # simulated round trip each command costs more: fewer entries suffice.
    total = max(200 * processes, CONCURRENT_OPERATIONS_FACTOR * operations)
    scaling = [
        _scaling(
            url,
            processes,
            total if not delay else max(200 * processes, total // 3),
            appends=appends,
            delay=delay,
            encoding=encoding,
        )
        for delay in (0.0, SIMULATED_ROUND_TRIP)
        for appends in MODES
    ]
    per_thread = max(50, CONCURRENT_OPERATIONS_FACTOR * operations * 10 // threads)
    # The producer's raw rate is timed just before and just after it: this machine's
    # raw rate moves by a factor of two from one minute to the next.
    beside = _Tally()
    backend.put(raw_key, {"n": 0})
    try:
        with _clock() as spent:
            for _ in range(operations):
                _raw_command(backend, raw_key)
        beside.add(spent, operations)
        produced, producer_exact = _bench_producers.producer_object(
            url, threads, per_thread, encoding=encoding
        )
        with _clock() as spent:
            for _ in range(operations):
                _raw_command(backend, raw_key)
        beside.add(spent, operations)
    finally:
        backend.remove(raw_key)
    producer = replace(
        _figure(f"producer object, {threads} threads, reserve", produced, unit="entries"),
        raw=beside.figure("raw single-record command (beside)", beside.commands, beside.commands),
    )
    persist: list[_bench_persist.Pair] = []
    version = _bench_persist.available()
    if not isinstance(backend, EmbeddedBackend):
        persist_note = None
    elif version is None:
        persist_note = "beside persist-queue: not installed (pip install 'large-queue[bench]')"
    else:
        persist_note = (
            f"beside persist-queue {version} (same disk, write-ahead log on both sides,"
            " synchronous set alike):"
        )
        persist = _bench_persist.compare(backend.path.parent, operations, encoding)
    return Report(
        store=f"{backend!r}; entries stored as {encoding}",
        processes=processes,
        raw=raw,
        figures=figures,
        scaling=scaling,
        producer=producer,
        producer_threads=threads,
        producer_exact=producer_exact,
        persist=persist,
        persist_note=persist_note,
        idle=_bench_idle.idle_rates(url),
        receipts=_bench_receipts.receipt_costs(backend, min(operations, 2000), MODES),
    )
