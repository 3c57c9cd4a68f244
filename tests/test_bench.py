"""``large-queue bench`` measures what it claims: round trips per call and exact accounting.

Its rates depend on the machine and are not checked here; its round-trip
counts are exact and are the issue's targets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from large_queue import _bench
from tests.fix_backends import Place


def test_bench_counts_round_trips_and_accounts_for_every_entry(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_bench, "CONCURRENT_ROUNDS", 1)
    report = _bench.measure(
        place.url,
        operations=50,
        batches=5,
        batch_size=20,
        processes=2,
        progress=False,
    )
    per_call = {figure.name: figure.round_trips_per_call for figure in report.figures}
    assert report.raw.round_trips_per_call == 1
    assert per_call["enqueue (single)"] == 3
    assert per_call["dequeue (single)"] == 3
    # 2 + the buffer records touched: batches of 20 in records of 100 slots touch one or two.
    assert 3 <= per_call["enqueue (batches of 20)"] <= 4
    assert 3 <= per_call["dequeue (batches of 20)"] <= 4
    assert 2 <= per_call["owner dequeue (single, no lock)"] < 2.1
    for figure in report.figures:  # each operation's floor replays exactly its own commands
        assert figure.floor is not None and figure.floor.round_trips == figure.round_trips, figure.name
        assert figure.floor.rate > 0 and figure.cpu_seconds > 0
    assert report.one.round_trips_per_call == 3
    assert report.one.operations == report.many.operations == 400
    assert report.many.round_trips_per_call >= 3  # plus refused lock attempts
    assert report.exactly_once
    assert len(report.ratios) == 1
    assert any(line.startswith("  floor: the same commands") for line in report.lines())
    assert report.lines()[-2].startswith("2 producers vs 1: aggregate")
    assert report.lines()[-2].endswith("every entry exactly once: True")
    assert report.many_stats.enqueue_calls == report.many.operations  # the producers' own counters
    assert report.lines()[-1].startswith("2 producers' locks: ")


def test_bench_runs_when_the_owner_leaves_acked_entries_below_the_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 60 owner dequeues move the head in steps of 25, to 50: 10 slots stay taken
    # when the owner's batches then refill the queue.
    monkeypatch.setattr(_bench, "CONCURRENT_ROUNDS", 1)
    report = _bench.measure(
        f"embedded://{tmp_path}/bench.db",
        operations=60,
        batches=4,
        batch_size=25,
        processes=2,
        progress=False,
    )
    assert {figure.name for figure in report.figures} >= {"owner receive + ack (batches of 25)"}
    assert report.exactly_once
