"""``large-queue torture``: producers and consumers in many processes, with faults.

Producers enqueue numbered values (single and batch), consumers dequeue
(single and batch), each recording its history. Meanwhile a coordinator
injects faults: it SIGSTOPs a worker for longer than the lock TTL and then
SIGCONTs it (its lock is broken meanwhile; whatever it does next must be
refused), and SIGKILLs workers mid-operation and starts replacements. At the
end it drains the queue and hands every history to the checker
(:mod:`large_queue._history`). Every anomaly count must be zero.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import os
import random
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from large_queue import errors
from large_queue._history import HistoryWriter, Verdict, check, read_calls
from large_queue.backends import connect
from large_queue.lock import LockPolicy
from large_queue.queue import Queue

#: seconds between the progress lines of a run
PROGRESS_EVERY = 5.0
DEFINITE_FAILURES = (errors.LockLostError, errors.LockNotAcquiredError, errors.QueueFullError)


@dataclass(frozen=True, kw_only=True)
class TortureConfig:
    """Parameters of one run."""

    url: str
    producers: int = 3
    consumers: int = 2
    duration: float = 10.0
    lock_ttl: float = 0.5
    capacity: int = 300
    slots_per_record: int = 10
    fault_interval: float = 1.0
    pauses: bool = True
    kills: bool = True
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class TortureReport:
    """What a run did and what the checker found."""

    operations: int
    pauses: int
    kills: int
    verdict: Verdict

    def lines(self) -> list[str]:
        """The report as printable lines."""
        verdict = self.verdict
        lines = [
            f"operations completed: {self.operations}",
            f"faults injected: {self.pauses} pauses past the lock TTL, {self.kills} kills",
            f"enqueues acknowledged: {verdict.enqueues_acknowledged}, entries delivered:"
            f" {verdict.entries_delivered}, empty dequeues: {verdict.empty_dequeues}",
            f"in doubt (reported apart): {verdict.in_doubt_calls} calls, {verdict.in_doubt_entries} entries",
        ]
        lines += [f"{name}: {count}" for name, count in verdict.anomalies.items()]
        lines += [f"  e.g. {name}: {items}" for name, items in verdict.examples.items()]
        lines.append("verdict: OK" if verdict.ok else "verdict: ANOMALIES FOUND")
        return lines


def _open(url: str, name: str) -> Queue:
    return Queue.open(connect(url), name, lock_policy=LockPolicy(acquire_timeout=30.0))


def _producer(url: str, name: str, history: str, tag: str, deadline: float, seed: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    queue = _open(url, name)
    writer = HistoryWriter(Path(history), tag)
    rng = random.Random(seed)
    sequence = 0
    while time.monotonic() < deadline:
        count = 1 if rng.random() < 0.5 else rng.randint(2, 6)
        values = [f"{tag}:{n}" for n in range(sequence, sequence + count)]
        op = writer.invoke("enqueue", values=values)
        try:
            offsets = queue.enqueue_batch(values)
        except DEFINITE_FAILURES as exc:
            writer.complete(op, "fail", error=type(exc).__name__)
            time.sleep(0.002)
            continue  # not applied: the same values go again, keeping the order
        except errors.OutcomeUnknownError as exc:
            writer.complete(op, "unknown", error=str(exc))
        else:
            writer.complete(op, "ok", offsets=[offsets.start, offsets.stop])
        sequence += count


def _consumer(url: str, name: str, history: str, tag: str, deadline: float, seed: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    queue = _open(url, name)
    writer = HistoryWriter(Path(history), tag)
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        count = 1 if rng.random() < 0.5 else rng.randint(2, 8)
        op = writer.invoke("dequeue", max_entries=count)
        try:
            entries = queue.dequeue_batch(count)
        except DEFINITE_FAILURES as exc:
            writer.complete(op, "fail", error=type(exc).__name__)
            continue
        except errors.OutcomeUnknownError as exc:
            writer.complete(op, "unknown", entries=[[e.offset, e.value] for e in exc.entries])
            continue
        writer.complete(op, "ok", entries=[[e.offset, e.value] for e in entries])
        if not entries:
            time.sleep(0.002)


def run(config: TortureConfig, *, directory: str | None = None, log: Any = None) -> TortureReport:
    """One torture run; histories go to ``directory`` (a temporary one by default).

    ``log`` takes each line of progress and of the report (default: printed at once).
    """
    if log is None:
        log = functools.partial(print, flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        histories = Path(directory or scratch)
        histories.mkdir(parents=True, exist_ok=True)
        return _run(config, histories, log)


def _run(config: TortureConfig, histories: Path, log: Any) -> TortureReport:
    rng = random.Random(config.seed)
    store = connect(config.url)
    name = f"torture-{os.getpid()}-{rng.randrange(10**6)}"
    Queue.create(
        store,
        name,
        capacity=config.capacity,
        slots_per_record=config.slots_per_record,
        lock_ttl=config.lock_ttl,
    )
    context = multiprocessing.get_context("spawn")
    deadline = time.monotonic() + config.duration + 3.0  # + interpreter start-up
    workers: dict[str, Any] = {}
    generation = 0

    def start(role: str, index: int) -> None:
        nonlocal generation
        generation += 1
        tag = f"{role}{index}.{generation}"
        target = _producer if role == "p" else _consumer
        process = context.Process(
            target=target,
            args=(config.url, name, str(histories / f"{tag}.jsonl"), tag, deadline, rng.randrange(2**32)),
            daemon=True,
        )
        process.start()
        workers[tag] = (role, index, process)

    for index in range(config.producers):
        start("p", index)
    for index in range(config.consumers):
        start("c", index)
    try:
        pauses, kills = _inject_faults(config, rng, workers, start, deadline, log)
    except BaseException:  # Ctrl-C, say: no worker outlives the run, and the queue goes
        for _, _, process in workers.values():
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
            process.join()
        Queue.delete(store, name)
        raise
    for _, _, process in workers.values():
        process.join(60)
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
            process.join()
    _drain(config.url, name, histories / "drain.jsonl")
    Queue.delete(store, name)
    calls = read_calls(sorted(histories.glob("*.jsonl")))
    operations = sum(1 for call in calls if call.outcome == "ok")
    report = TortureReport(operations=operations, pauses=pauses, kills=kills, verdict=check(calls))
    for line in report.lines():
        log(line)
    return report


def _inject_faults(
    config: TortureConfig,
    rng: random.Random,
    workers: dict[str, Any],
    start: Any,
    deadline: float,
    log: Any,
) -> tuple[int, int]:
    """Pause and kill workers until the deadline, saying how it goes every few seconds."""
    enabled = [kind for kind, on in (("pause", config.pauses), ("kill", config.kills)) if on]
    faults = itertools.cycle(enabled or ["none"])  # alternate, so a short run sees every kind
    pauses = kills = 0
    began = time.monotonic()
    said = began
    time.sleep(3.0)
    while time.monotonic() < deadline - config.fault_interval:
        if time.monotonic() - said >= PROGRESS_EVERY:
            said = time.monotonic()
            alive = sum(process.is_alive() for _, _, process in workers.values())
            log(f"{said - began:4.0f} s: {pauses} pauses, {kills} kills so far; {alive} workers running")
        time.sleep(config.fault_interval * rng.uniform(0.5, 1.5))
        live = [tag for tag, (_, _, process) in workers.items() if process.is_alive()]
        if not live:
            break
        tag = rng.choice(live)
        role, index, process = workers[tag]
        fault = next(faults)
        if fault == "pause":
            os.kill(process.pid, signal.SIGSTOP)
            time.sleep(config.lock_ttl * rng.uniform(1.5, 3.0))
            os.kill(process.pid, signal.SIGCONT)
            pauses += 1
        elif fault == "kill":
            os.kill(process.pid, signal.SIGKILL)
            process.join()
            kills += 1
            start(role, index)
    return pauses, kills


def _drain(url: str, name: str, history: Path) -> None:
    """Take everything left, after every worker has stopped."""
    queue = _open(url, name)
    writer = HistoryWriter(history, "drain")
    while True:
        op = writer.invoke("dequeue", max_entries=100)
        entries = queue.dequeue_batch(100)
        writer.complete(op, "ok", entries=[[e.offset, e.value] for e in entries])
        if not entries:
            break
    writer.close()
