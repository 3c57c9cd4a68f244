"""The torture run (processes, pauses past the lock TTL, kills) in the suite: a short one.

``LARGE_QUEUE_TORTURE_SECONDS`` lengthens it; ``large-queue torture`` runs it
by hand with every parameter. It runs on both stores (see ``place``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from large_queue._history import Verdict
from large_queue._torture import TortureConfig, TortureReport, run
from tests.fix_backends import APPENDS, Place

SECONDS = float(os.environ.get("LARGE_QUEUE_TORTURE_SECONDS", "8"))


@pytest.mark.torture
@pytest.mark.parametrize("appends", APPENDS)
def test_torture_finds_no_anomaly(place: Place, tmp_path: Path, appends: str) -> None:
    lines: list[str] = []
    report = run(
        TortureConfig(url=place.url, duration=SECONDS, fault_interval=0.5, seed=7, appends=appends),
        directory=str(tmp_path / "histories"),
        log=lines.append,
    )
    print("\n".join(lines))
    assert report.pauses >= 1 and report.kills >= 1, "faults were not injected"
    if appends == "reserve":
        assert report.parked_pauses >= 1 and report.parked_kills >= 1, "no producer stopped mid-append"
        assert report.holes_closed >= 1, "no consumer closed a hole"
    assert report.verdict.enqueues_acknowledged > 1000
    assert report.ok, "\n".join(lines)


@pytest.mark.torture
@pytest.mark.torture
@pytest.mark.parametrize("appends", ["reserve", "lock"])
def test_torture_with_txn_ids_leaves_nothing_in_doubt(place: Place, tmp_path: Path, appends: str) -> None:
    """Every call is made again with its txn id until it succeeds, and a killed worker's open call after."""
    lines: list[str] = []
    config = TortureConfig(
        url=place.url, duration=SECONDS, fault_interval=0.5, seed=5, appends=appends, txn_ids=True
    )
    report = run(config, directory=str(tmp_path / "histories"), log=lines.append)
    print("\n".join(lines))
    assert report.pauses >= 1 and report.kills >= 1, "faults were not injected"
    assert report.calls_settled >= 1, "no killed worker's call was settled"
    assert report.verdict.enqueues_acknowledged > 1000
    assert (report.verdict.in_doubt_calls, report.verdict.in_doubt_entries) == (0, 0), "\n".join(lines)
    assert report.ok, "\n".join(lines)


def test_torture_of_consumer_groups_finds_no_anomaly(place: Place, tmp_path: Path) -> None:
    lines: list[str] = []
    config = TortureConfig(
        url=place.url, duration=SECONDS, fault_interval=0.5, seed=11, appends="reserve", consumers=4, groups=2
    )
    report = run(config, directory=str(tmp_path / "histories"), log=lines.append)
    print("\n".join(lines))
    assert report.pauses >= 1 and report.kills >= 1, "faults were not injected"
    assert report.verdict.enqueues_acknowledged > 1000
    # both groups: each acknowledged entry acked in each, or possibly acked by an ack in doubt (its
    # consumer killed between sending it and hearing back)
    delivered = report.verdict.entries_delivered + report.verdict.in_doubt_entries
    assert delivered >= 2 * report.verdict.enqueues_acknowledged
    assert report.ok, "\n".join(lines)


@pytest.mark.torture
def test_torture_says_how_it_goes_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    run_ = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "large_queue.cli",
            "--url",
            f"embedded://{tmp_path}/t.db",
            "torture",
            "--duration",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: Ctrl-C reaches the coordinator and its workers
    )
    deadline = time.monotonic() + 30
    assert run_.stdout is not None
    first = run_.stdout.readline()  # a progress line, after 5 s of load
    assert "pauses" in first and "workers running" in first, first
    os.killpg(run_.pid, signal.SIGINT)
    time.sleep(0.01)
    os.killpg(run_.pid, signal.SIGINT)  # pressed twice: the clean-up is not cut short
    _, err = run_.communicate(timeout=max(1, deadline - time.monotonic()))
    assert run_.returncode == 130
    assert err.strip().splitlines() == [
        "large-queue: torture interrupted; its workers were stopped and its queue deleted"
    ], err
    from large_queue import Queue, connect

    assert Queue.names(connect(f"embedded://{tmp_path}/t.db")) == []


def test_a_worker_ended_by_an_error_fails_the_run_whatever_the_history_says() -> None:
    clean = Verdict(
        enqueues_acknowledged=10,
        entries_delivered=10,
        empty_dequeues=0,
        in_doubt_calls=0,
        in_doubt_entries=0,
        anomalies={"lost": 0, "duplicated": 0},
        examples={},
    )
    assert TortureReport(operations=20, pauses=1, kills=1, verdict=clean).ok
    # a consumer died of an exception: its calls look like a killed worker's, so only its exit tells
    failed = TortureReport(operations=20, pauses=1, kills=1, verdict=clean, workers_failed=("c0.3",))
    assert not failed.ok
    assert failed.lines()[-2:] == ["workers ended by an error: 1 ['c0.3']", "verdict: ANOMALIES FOUND"]


def test_a_run_that_acknowledged_nothing_or_injected_no_fault_asked_for_proves_nothing() -> None:
    def verdict(acknowledged: int) -> Verdict:
        return Verdict(
            enqueues_acknowledged=acknowledged,
            entries_delivered=acknowledged,
            empty_dequeues=0,
            in_doubt_calls=0,
            in_doubt_entries=0,
            anomalies={"lost": 0},
            examples={},
        )

    assert TortureReport(operations=20, pauses=0, kills=0, verdict=verdict(10)).ok  # --no-pauses --no-kills
    idle = TortureReport(operations=0, pauses=1, kills=1, verdict=verdict(0), faults_asked=True)
    assert not idle.ok and "nothing was tested: no enqueue was acknowledged" in idle.lines()
    spared = TortureReport(operations=20, pauses=0, kills=0, verdict=verdict(10), faults_asked=True)
    assert not spared.ok and "nothing was tested: no fault was injected" in spared.lines()
    assert TortureReport(
        operations=20, pauses=0, kills=0, parked_kills=1, verdict=verdict(10), faults_asked=True
    ).ok
    # producers went on for 50 s with nothing acknowledged: the queue stopped taking entries
    stuck = TortureReport(
        operations=20, pauses=1, kills=1, verdict=verdict(10), stalled=50.0, stall_limit=15.0
    )
    assert not stuck.ok and any(
        line.startswith("stalled: no enqueue was acknowledged for 50.0 s") for line in stuck.lines()
    )
    assert TortureReport(
        operations=20, pauses=1, kills=1, verdict=verdict(10), stalled=2.0, stall_limit=15.0
    ).ok


def test_the_longest_stall_is_the_longest_time_producers_went_on_with_nothing_acknowledged() -> None:
    from large_queue._history import Call
    from large_queue._torture import _longest_stall

    def enqueue(invoked: float, completed: float | None, outcome: str | None) -> Call:
        return Call("p0", "enqueue", invoked, {}, outcome, completed)

    calls = [
        enqueue(1.0, 1.1, "ok"),
        enqueue(1.2, 1.3, "ok"),
        enqueue(2.0, 2.1, "fail"),  # refused (a full queue, say): not an acknowledgement
        Call("c0", "dequeue", 3.0, {}, "ok", 30.0),  # not an enqueue
        enqueue(9.0, None, None),  # killed: the last invoke still counts as producers running
    ]
    assert _longest_stall(calls) == pytest.approx(9.0 - 1.3)
    assert _longest_stall([enqueue(5.0, 5.1, "ok")]) == pytest.approx(0.1)
    assert _longest_stall([]) == 0.0


def _parked_producer(path: str, go: str) -> None:
    from large_queue import Queue
    from large_queue._torture import _parking

    queue = Queue.open(f"embedded://{path}", "q")
    _parking(queue)
    while not os.path.exists(go):  # a file, not a lock a process killed by a signal might hold
        time.sleep(0.01)
    queue.enqueue("after")  # a park asked for and taken back: it must not stop here


def test_a_park_the_coordinator_took_back_does_not_stop_the_producer_later(tmp_path: Path) -> None:
    """The coordinator gives up on a producer that did not reserve in time (blocked on a full queue)
    and takes its request back; the producer, reserving later, must not stop with nobody to resume it."""
    import multiprocessing

    from large_queue import Queue

    Queue.create(f"embedded://{tmp_path}/s.db", "q", capacity=4)
    context = multiprocessing.get_context("fork")
    go = tmp_path / "go"
    producer = context.Process(target=_parked_producer, args=(str(tmp_path / "s.db"), str(go)))
    producer.start()
    try:
        time.sleep(1.0)  # its handlers are in place
        os.kill(producer.pid, signal.SIGUSR1)  # type: ignore[arg-type]
        time.sleep(0.2)
        os.kill(producer.pid, signal.SIGUSR2)  # type: ignore[arg-type]
        time.sleep(0.2)
        go.touch()
        producer.join(20)
        assert producer.exitcode == 0
    finally:
        if producer.is_alive():
            os.kill(producer.pid, signal.SIGKILL)  # type: ignore[arg-type]
            producer.join()
    assert [entry.value for entry in Queue.open(f"embedded://{tmp_path}/s.db", "q").peek()] == ["after"]
