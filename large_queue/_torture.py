"""``large-queue torture``: producers and consumers in many processes, with faults.

Producers enqueue numbered values (single and batch), consumers dequeue
(single and batch), each recording its history. Meanwhile a coordinator
injects faults: it SIGSTOPs a worker for longer than the lock TTL and then
SIGCONTs it (its lock is broken meanwhile; whatever it does next must be
refused), and SIGKILLs workers mid-operation and starts replacements. On a
queue whose producers append without the lock (``appends="reserve"``) it
also stops a producer exactly between its reservation and its publish
(SIGUSR1 asks it to SIGSTOP itself there), then either kills it or resumes
it after the hole timeout: consumers must close the hole, and the late
publish must fail. At the end it drains the queue and hands every history
to the checker (:mod:`large_queue._history`). Every anomaly count must be zero.

With ``groups``, the consumers are nodes of that many consumer groups
(consumer ``i`` in group ``g{i % groups}``) that receive and ack; killing or
pausing one that owns its group hands the group to another node, which
delivers again what was not acked. The drain then acks what is left in every
group, and :mod:`large_queue._history_groups` judges each group apart.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import multiprocessing
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from large_queue import _torture_txn, errors
from large_queue._history import Call, HistoryWriter, Verdict, check, read_calls
from large_queue._history_groups import check_groups
from large_queue.backends import Backend, connect
from large_queue.lock import LockPolicy
from large_queue.queue import Queue

#: seconds between the progress lines of a run
PROGRESS_EVERY = 5.0
#: the shortest time without an acknowledged enqueue that fails a run as stalled (a quarter of
#: a longer run): pauses and kills of lock holders cost a lock TTL or a hole timeout each
STALL_SECONDS = 10.0
DEFINITE_FAILURES = (
    errors.LockLostError,
    errors.LockNotAcquiredError,
    errors.QueueFullError,
    errors.ReservationClosedError,
    errors.BackendTimeoutError,  # only where not in doubt (see _definite): a worker paused past the timeout
)


#: an ack that failed so: nothing acked, the entries come again
_ACK_FAILURES = (errors.OwnershipLostError, errors.DeliveryExpiredError, errors.BackendTimeoutError)


def _definite(exc: Exception) -> bool:
    """Whether ``exc`` says that nothing of the call was applied.

    A timeout in doubt must not reach a worker: the library settles it or
    says ``OutcomeUnknownError``; one that does ends the worker, and fails the run.
    """
    return not (isinstance(exc, errors.BackendTimeoutError) and exc.in_doubt)


#: set by SIGUSR1 in a producer: stop (SIGSTOP) right after the next reservation, before publishing
_park_requested = False


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
    appends: str = "lock"
    hole_timeout: float = 0.5
    groups: int = 0  #: consumers are nodes of this many consumer groups (0: they dequeue)
    #: every call carries a txn id and is made again with it until it succeeds; a worker's call
    #: left open by a kill is settled after the run the same way (see :mod:`large_queue._torture_txn`)
    txn_ids: bool = False

    @property
    def group_names(self) -> list[str]:
        """The names of the run's consumer groups."""
        return [f"g{index}" for index in range(self.groups)]

    @property
    def group_timing(self) -> dict[str, float]:
        """A group node's timing: a pause past the lock TTL may or may not outlast its timeout."""
        timeout = max(1.0, 2 * self.lock_ttl)
        return {
            "time_slice": 0.5,
            "timeout": timeout,
            "poll_interval": 0.05,
            "visibility_timeout": 2 * timeout,
        }


@dataclass(frozen=True, kw_only=True)
class TortureReport:
    """What a run did and what the checker found."""

    operations: int
    pauses: int
    kills: int
    verdict: Verdict
    parked_pauses: int = 0  #: producers stopped between reserve and publish, then resumed
    parked_kills: int = 0  #: producers killed between reserve and publish
    held_pauses: int = 0  #: consumers stopped holding the lock just before their commit, past its TTL
    fenced: int = 0  #: dequeues that failed with LockLostError: their lock broken, their commit refused
    holes_closed: int = 0  #: unpublished reservations the consumers closed
    calls_settled: int = 0  #: calls of killed workers settled after the run by their txn ids
    #: workers that ended with an error of their own (not killed by the run): each printed its traceback
    workers_failed: tuple[str, ...] = ()

    #: faults were asked for (pauses or kills)
    faults_asked: bool = False
    #: the longest time (seconds) while producers ran that no enqueue was acknowledged, and the
    #: longest a healthy run's can be (a pause or kill of a lock holder costs a lock TTL or so)
    stalled: float = 0.0
    stall_limit: float = float("inf")

    @property
    def untested(self) -> list[str]:
        """Why the run proves nothing, if it does not: nothing acknowledged, or no fault injected."""
        why = []
        if not self.verdict.enqueues_acknowledged:
            why.append("no enqueue was acknowledged")
        injected = self.pauses + self.kills + self.parked_pauses + self.parked_kills + self.held_pauses
        if self.faults_asked and not injected:
            why.append("no fault was injected")
        return why

    @property
    def stall(self) -> str | None:
        """Why the run counts as stalled, if it does: producers went on with nothing acknowledged."""
        if self.stalled <= self.stall_limit:
            return None
        return (
            f"no enqueue was acknowledged for {self.stalled:.1f} s while producers ran (more than"
            f" {self.stall_limit:.1f} s): the queue stopped taking entries"
        )

    @property
    def ok(self) -> bool:
        """No anomaly in the history, no worker failed, no stall, and the run tested something."""
        return self.verdict.ok and not self.workers_failed and not self.untested and self.stall is None

    def lines(self) -> list[str]:
        """The report as printable lines."""
        verdict = self.verdict
        lines = [
            f"operations completed: {self.operations}",
            f"faults injected: {self.pauses} pauses past the lock TTL, {self.kills} kills",
            f"between reserve and publish: {self.parked_pauses} pauses past the hole timeout,"
            f" {self.parked_kills} kills; holes closed by consumers: {self.holes_closed}",
            f"consumers stopped holding the lock past its TTL: {self.held_pauses}; dequeues fenced off"
            f" (LockLostError): {self.fenced}",
            f"enqueues acknowledged: {verdict.enqueues_acknowledged}, entries delivered:"
            f" {verdict.entries_delivered}, empty dequeues: {verdict.empty_dequeues}",
            f"in doubt (reported apart): {verdict.in_doubt_calls} calls, {verdict.in_doubt_entries} entries"
            f" missing; {verdict.delivered_in_doubt} delivered entries came from enqueues in doubt",
        ]
        if self.calls_settled:
            lines.insert(-1, f"calls of killed workers settled by txn id: {self.calls_settled}")
        lines += [f"{name}: {count}" for name, count in verdict.anomalies.items()]
        lines += [f"  e.g. {name}: {items}" for name, items in verdict.examples.items()]
        lines.append(f"workers ended by an error: {len(self.workers_failed)} {list(self.workers_failed)}")
        lines += [f"nothing was tested: {why}" for why in self.untested]
        lines += [f"stalled: {self.stall}"] if self.stall else []
        lines.append("verdict: OK" if self.ok else "verdict: ANOMALIES FOUND")
        return lines


def _open(url: str, name: str) -> Queue:
    return Queue.open(connect(url), name, lock_policy=LockPolicy(acquire_timeout=30.0))


def _park_next(signum: int, frame: object) -> None:
    global _park_requested
    _park_requested = True


def _park_cancelled(signum: int, frame: object) -> None:
    global _park_requested
    _park_requested = False


@contextlib.contextmanager
def _park_requests_ignored() -> Iterator[None]:
    """SIGUSR1 ignored in this process meanwhile, so that a worker started now inherits it ignored.

    A producer is asked to park with SIGUSR1, whose default ends the process: one
    asked while it starts up, before it sets its handler, would otherwise die of it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; a run elsewhere keeps the race
        return
    before = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    cancel = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, before)
        signal.signal(signal.SIGUSR2, cancel)


def _parking(queue: Queue) -> None:
    """Make the producer stop itself between its next reservation and its publish when asked."""
    reserve = queue.appender.reserve_stamped

    def reserve_then_park(count: int, *, overwrite: bool, receipt: Any = None) -> tuple[int, int]:
        global _park_requested
        reserved = reserve(count, overwrite=overwrite, receipt=receipt)
        if _park_requested:
            _park_requested = False
            os.kill(os.getpid(), signal.SIGSTOP)  # the coordinator resumes or kills us
        return reserved

    queue.appender.reserve_stamped = reserve_then_park  # type: ignore[method-assign]
    # Reserve and publish go as separate commands, as they do across a network: in one
    # group (one transaction on the embedded store) a parked producer would hold the
    # store's writer lock, and every process would stop with it.
    queue.backend.grouped = contextlib.nullcontext  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, _park_next)
    signal.signal(signal.SIGUSR2, _park_cancelled)


def _commands_alone(backend: Backend) -> bool:
    """Whether the store sends each command of an operation on its own (no transaction around them)."""
    return type(backend).grouped is Backend.grouped


def _holding_parks(queue: Queue) -> None:
    """Make the consumer stop itself holding the queue lock, just before its next commit, when asked.

    The coordinator resumes it past the lock's TTL, once another consumer may have broken the lock:
    its commit must then be fenced off. (Only where each command goes on its own, as on Aerospike:
    the embedded store runs a dequeue in one transaction, whose writer lock would stop everyone.)
    """
    commit = queue.lock.commit

    def park_then_commit(grant: Any, **changes: Any) -> Any:
        global _park_requested
        if _park_requested:
            _park_requested = False
            os.kill(os.getpid(), signal.SIGSTOP)  # the coordinator resumes us
        return commit(grant, **changes)

    queue.lock.commit = park_then_commit  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, _park_next)
    signal.signal(signal.SIGUSR2, _park_cancelled)


def _producer(
    url: str, name: str, history: str, tag: str, deadline: float, seed: int, txn_ids: bool = False
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    queue = _open(url, name)
    _parking(queue)
    writer = HistoryWriter(Path(history), tag)
    rng = random.Random(seed)
    sequence = 0
    while time.monotonic() < deadline:
        count = 1 if rng.random() < 0.5 else rng.randint(2, 6)
        values = [f"{tag}:{n}" for n in range(sequence, sequence + count)]
        if txn_ids:
            txn = f"{tag}:{sequence}"
            op = writer.invoke("enqueue", values=values, txn=txn)
            offsets = _torture_txn.answer(
                functools.partial(queue.enqueue_batch, values, txn_id=txn), deadline
            )
            if offsets is None:
                break  # left open: settled after the run
            writer.complete(op, "ok", offsets=[offsets.start, offsets.stop])
            sequence += count
            continue
        op = writer.invoke("enqueue", values=values)
        try:
            offsets = queue.enqueue_batch(values)
        except DEFINITE_FAILURES as exc:
            if not _definite(exc):
                raise
            writer.complete(op, "fail", error=type(exc).__name__)
            time.sleep(0.002)
            continue  # not applied: the same values go again, keeping the order
        except errors.OutcomeUnknownError as exc:
            writer.complete(op, "unknown", error=str(exc))
        else:
            writer.complete(op, "ok", offsets=[offsets.start, offsets.stop])
        sequence += count
    # A park asked for now finds no reservation to stop at; the interpreter's shutdown would also
    # put SIGUSR1's (and SIGUSR2's) default back, which ends the process: late ones are ignored instead.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def _say_holes(queue: Queue, history: str, said: int) -> int:
    """Write how many holes this consumer has closed, when it changed since ``said``; return the count.

    Said as it happens: a consumer may be killed.
    """
    closed = queue.stats().holes_closed
    if closed != said:
        Path(f"{history}.holes").write_text(str(closed))
    return closed


def _consumer(
    url: str, name: str, history: str, tag: str, deadline: float, seed: int, txn_ids: bool = False
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    queue = _open(url, name)
    if _commands_alone(queue.backend):
        _holding_parks(queue)
    writer = HistoryWriter(Path(history), tag)
    rng = random.Random(seed)
    closed = 0
    calls = itertools.count()
    while time.monotonic() < deadline:
        closed = _say_holes(queue, history, closed)
        count = 1 if rng.random() < 0.5 else rng.randint(2, 8)
        if txn_ids:
            txn = f"{tag}:d{next(calls)}"
            op = writer.invoke("dequeue", max_entries=count, txn=txn)
            entries = _torture_txn.answer(functools.partial(queue.dequeue_batch, count, txn_id=txn), deadline)
            if entries is None:
                break  # left open: settled after the run
            writer.complete(op, "ok", entries=[[e.offset, e.value] for e in entries])
            if not entries:
                time.sleep(0.002)
            continue
        op = writer.invoke("dequeue", max_entries=count)
        try:
            entries = queue.dequeue_batch(count)
        except DEFINITE_FAILURES as exc:
            if not _definite(exc):
                raise
            writer.complete(op, "fail", error=type(exc).__name__)
            continue
        except errors.OutcomeUnknownError as exc:
            writer.complete(op, "unknown", entries=[[e.offset, e.value] for e in exc.entries])
            continue
        writer.complete(op, "ok", entries=[[e.offset, e.value] for e in entries])
        if not entries:
            time.sleep(0.002)


def _group_consumer(
    url: str,
    name: str,
    history: str,
    tag: str,
    deadline: float,
    seed: int,
    group: str,
    timing: dict[str, float],
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    queue = _open(url, name)
    writer = HistoryWriter(Path(history), tag)
    rng = random.Random(seed)
    closed = 0
    with queue.consumer(tag, group=group, **timing) as consumer:
        while time.monotonic() < deadline:
            closed = _say_holes(queue, history, closed)
            try:
                messages = consumer.receive(1 if rng.random() < 0.5 else rng.randint(2, 8), timeout=0.2)
            except errors.BackendTimeoutError as exc:  # nothing delivered: the entries come again
                if not _definite(exc):
                    raise
                continue
            if not messages:
                continue
            op = writer.invoke("ack", group=group, entries=[[m.offset, m.value] for m in messages])
            try:
                consumer.ack(messages)
            except _ACK_FAILURES as exc:
                if not _definite(exc):
                    raise
                writer.complete(op, "fail", error=type(exc).__name__)
            except errors.OutcomeUnknownError as exc:
                writer.complete(op, "unknown", error=str(exc))
            else:
                writer.complete(op, "ok")


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
    queue = Queue.create(
        store,
        name,
        capacity=config.capacity,
        slots_per_record=config.slots_per_record,
        lock_ttl=config.lock_ttl,
        appends=config.appends,
        hole_timeout=config.hole_timeout,
        receipts=_torture_txn.RECEIPTS if config.txn_ids else None,
    )
    for group in config.group_names:  # before any entry: every group sees them all
        queue.create_group(group)
    context = multiprocessing.get_context("spawn")
    deadline = time.monotonic() + config.duration + 3.0  # + interpreter start-up
    workers: dict[str, Any] = {}
    generation = 0

    def start(role: str, index: int) -> None:
        nonlocal generation
        generation += 1
        tag = f"{role}{index}.{generation}"
        args: tuple[Any, ...] = (config.url, name, str(histories / f"{tag}.jsonl"), tag, deadline)
        args += (rng.randrange(2**32),)
        target: Any = _producer if role == "p" else _consumer
        if role == "c" and config.groups:
            target = _group_consumer
            args += (config.group_names[index % config.groups], config.group_timing)
        elif config.txn_ids:
            args += (True,)
        process = context.Process(target=target, args=args, daemon=True)
        with _park_requests_ignored():  # until the worker's own handler is in place
            process.start()
        workers[tag] = (role, index, process)

    settled = 0
    settling = _torture_txn.settling_queue(config.url, name) if config.txn_ids else None

    def killed(tag: str) -> None:
        """A worker was killed: settle its open call by txn id at once, as a restarted application would."""
        nonlocal settled
        if settling is not None:
            settled += _torture_txn.settle_open_calls(settling, [histories / f"{tag}.jsonl"])

    for index in range(config.producers):
        start("p", index)
    for index in range(config.consumers):
        start("c", index)
    try:
        holding = not config.groups and _commands_alone(store)
        faults = _inject_faults(config, rng, workers, start, killed, deadline, log, holding=holding)
    except BaseException:  # Ctrl-C, say: no worker outlives the run, and the queue goes
        with _deaf_to_interrupts():  # a second Ctrl-C must not cut this short (and leave the queue)
            for _, _, process in workers.values():
                if process.is_alive():
                    os.kill(process.pid, signal.SIGKILL)
                process.join()
            Queue.delete(store, name)
        raise
    hung = []
    for tag, (_, _, process) in workers.items():
        if process.is_alive():  # a park taken back too late may have stopped it: it runs to its end
            os.kill(process.pid, signal.SIGCONT)
        process.join(60)
        if process.is_alive():  # a minute past the deadline: stuck in a call, which is a failure too
            os.kill(process.pid, signal.SIGKILL)
            process.join()
            hung.append(tag)
            log(f"worker {tag} was still running a minute after the end of the run: killed, it fails the run")
    # killed by the run (-SIGKILL) or done (0); anything else ended by an error of its own
    ended = {tag: process.exitcode for tag, (_, _, process) in workers.items()}
    failed = tuple(tag for tag, code in ended.items() if code not in (0, -signal.SIGKILL) or tag in hung)
    for round_ in ("", "-settled") if config.txn_ids else ("",):
        if round_:  # workers killed at the end: their open calls are settled once the queue has room
            assert settling is not None
            settled += _torture_txn.settle_open_calls(settling, sorted(histories.glob("[pc]*.jsonl")))
        if config.groups:
            for group in config.group_names:
                _drain_group(config, name, group, histories / f"drain-{group}{round_}.jsonl")
        else:
            wait = 3 * config.hole_timeout if config.appends == "reserve" else None
            _drain(config.url, name, histories / f"drain{round_}.jsonl", wait=wait)
    Queue.delete(store, name)
    calls = read_calls(sorted(histories.glob("*.jsonl")))
    operations = sum(1 for call in calls if call.outcome == "ok")
    holes = sum(int(path.read_text()) for path in histories.glob("*.holes"))
    report = TortureReport(
        operations=operations,
        pauses=faults["pause"],
        kills=faults["kill"],
        parked_pauses=faults["park-pause"],
        parked_kills=faults["park-kill"],
        held_pauses=faults["hold-pause"],
        fenced=sum(
            1
            for call in calls
            if call.op == "dequeue"
            and call.outcome == "fail"
            and call.response.get("error") == "LockLostError"
        ),
        holes_closed=holes,
        calls_settled=settled,
        workers_failed=failed,
        faults_asked=config.pauses or config.kills,
        stalled=_longest_stall(calls),
        stall_limit=max(STALL_SECONDS, config.duration / 4),
        # a reservation killed or paused before its publish hides entries until consumers close it
        verdict=check_groups(calls, config.group_names)
        if config.groups
        else check(calls, hole_grace=3 * config.hole_timeout + 1.0 if config.appends == "reserve" else None),
    )
    for line in report.lines():
        log(line)
    return report


@contextlib.contextmanager
def _deaf_to_interrupts() -> Iterator[None]:
    """SIGINT ignored inside (in the main thread; elsewhere signals cannot be set, nor arrive)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _longest_stall(calls: list[Call]) -> float:
    """The longest time, from the first enqueue's invoke to the last's, that none was acknowledged."""
    enqueues = [call for call in calls if call.op == "enqueue"]
    if not enqueues:
        return 0.0
    acked = sorted(call.completed for call in enqueues if call.outcome == "ok" and call.completed is not None)
    times = [min(call.invoked for call in enqueues), *acked, max(call.invoked for call in enqueues)]
    return max(later - earlier for earlier, later in itertools.pairwise(times))


def _hole_grace(config: TortureConfig) -> float | None:
    """How long a reservation killed or paused before its publish may hide entries (until closed)."""
    return 3 * config.hole_timeout + 1.0 if config.appends == "reserve" else None


def _inject_faults(
    config: TortureConfig,
    rng: random.Random,
    workers: dict[str, Any],
    start: Any,
    killed: Any,
    deadline: float,
    log: Any,
    *,
    holding: bool = False,
) -> dict[str, int]:
    """Pause and kill workers until the deadline, saying how it goes every few seconds; counts by kind.

    ``holding``: consumers can also be stopped holding the queue lock, just before their commit
    (``hold-pause``; where each command goes on its own, see :func:`_holding_parks`).
    """
    enabled = [kind for kind, on in (("pause", config.pauses), ("kill", config.kills)) if on]
    if config.appends == "reserve":
        enabled += [f"park-{kind}" for kind in enabled]
    if holding and config.pauses:
        enabled.append("hold-pause")
    faults = itertools.cycle(enabled or ["none"])  # alternate, so a short run sees every kind
    counts = dict.fromkeys(("pause", "kill", "park-pause", "park-kill", "hold-pause", "none"), 0)
    began = time.monotonic()
    said = began
    time.sleep(3.0)
    while time.monotonic() < deadline - config.fault_interval:
        if time.monotonic() - said >= PROGRESS_EVERY:
            said = time.monotonic()
            alive = sum(process.is_alive() for _, _, process in workers.values())
            paused = counts["pause"] + counts["park-pause"] + counts["hold-pause"]
            log(
                f"{said - began:4.0f} s: {paused} pauses,"
                f" {counts['kill'] + counts['park-kill']} kills so far; {alive} workers running"
            )
        time.sleep(config.fault_interval * rng.uniform(0.5, 1.5))
        fault = next(faults)
        parking = fault.startswith("park-")
        held = fault == "hold-pause"
        live = [
            tag
            for tag, (role, _, process) in workers.items()
            if process.is_alive() and (role == "p" if parking else role == "c" if held else True)
        ]
        if not live:
            break
        tag = rng.choice(live)
        role, index, process = workers[tag]
        if parking or held:
            os.kill(process.pid, signal.SIGUSR1)
            if not _wait_stopped(process.pid, timeout=2.0):
                # it did not reserve meanwhile (blocked on a full queue, say): the request is taken
                # back, and should it have stopped itself in between, it is resumed
                os.kill(process.pid, signal.SIGUSR2)
                if _wait_stopped(process.pid, timeout=0.5):
                    os.kill(process.pid, signal.SIGCONT)
                continue
        if fault.endswith("pause"):
            if not (parking or held):
                os.kill(process.pid, signal.SIGSTOP)
            pause = (config.hole_timeout if parking else config.lock_ttl) * rng.uniform(1.5, 3.0)
            time.sleep(pause)
            os.kill(process.pid, signal.SIGCONT)
        elif fault.endswith("kill"):
            os.kill(process.pid, signal.SIGKILL)
            process.join()
            killed(tag)
            start(role, index)
        counts[fault] += 1
    return counts


def _wait_stopped(pid: int, *, timeout: float) -> bool:
    """True once process ``pid`` is stopped (state T), within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state in ("T", "t"):
            return True
        time.sleep(0.005)
    return False


def _drain(url: str, name: str, history: Path, *, wait: float | None) -> None:
    """Take everything left, after every worker has stopped.

    ``wait``: how long a dequeue waits for entries. A producer killed between
    its reservation and its publish just before the end leaves a hole that
    hides what follows it; a waiting dequeue closes it once it has been open
    past the hole timeout, and goes on.
    """
    queue = _open(url, name)
    writer = HistoryWriter(history, "drain")
    while True:
        op = writer.invoke("dequeue", max_entries=100)
        entries = queue.dequeue_batch(100, timeout=wait)
        writer.complete(op, "ok", entries=[[e.offset, e.value] for e in entries])
        if not entries:
            break
    writer.close()


def _drain_group(config: TortureConfig, name: str, group: str, history: Path) -> None:
    """Ack everything left in ``group``, after every worker has stopped (its owner may be a dead node)."""
    queue = _open(config.url, name)
    writer = HistoryWriter(history, f"drain-{group}")
    deadline = time.monotonic() + 60
    with queue.consumer(f"drain-{group}", group=group, **config.group_timing) as consumer:
        while time.monotonic() < deadline:
            messages = consumer.receive(100, timeout=0.5)
            if messages:
                op = writer.invoke("ack", group=group, entries=[[m.offset, m.value] for m in messages])
                consumer.ack(messages)
                writer.complete(op, "ok")
                continue
            # Done when nothing is left to ack and no reservation is still open: a producer
            # killed between reserve and publish leaves a hole that hides what follows it
            # until the drain, waiting on it past the hole timeout, closes it.
            info = queue.info()
            (state,) = [g for g in info.groups if g.name == group]
            settled = state.in_flight == 0 and state.lag == 0 and info.reserved_tail == info.tail_offset
            if consumer.owning and settled:
                break
    writer.close()
