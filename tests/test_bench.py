"""``large-queue bench`` measures what it claims: round trips per call and exact accounting.

Its rates depend on the machine and are not checked here; its round-trip
counts are exact and are the issue's targets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from large_queue import _bench, _bench_idle, _bench_persist, errors
from large_queue.backends import connect
from tests.fix_backends import Place, Store


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
    assert report.lines()[0].endswith("; entries stored as msgpack")  # the default encoding
    assert report.raw.round_trips_per_call == 1
    assert per_call["enqueue (single)"] == 3
    assert per_call["dequeue (single)"] == 3
    # 2 + the buffer records touched: batches of 20 in records of 100 slots touch one or two.
    assert 3 <= per_call["enqueue (batches of 20)"] <= 4
    assert 3 <= per_call["dequeue (batches of 20)"] <= 4
    # the owner write, and a read of 16 slots ahead at every 16th (the first with the metadata)
    assert 1 < per_call["owner dequeue (single, no lock)"] < 1.2
    for figure in report.figures:  # each operation's floor replays exactly its own commands
        assert figure.floor is not None and figure.floor.round_trips == figure.round_trips, figure.name
        assert figure.floor.rate > 0 and figure.cpu_seconds > 0
    # without the lock: 2 per single enqueue, 1 + the buffer records touched per batch
    assert per_call["enqueue (single), reserve"] == 2
    assert 2 <= per_call["enqueue (batches of 20), reserve"] <= 3
    # a dequeue's read of the head goes beside the lock's acquire where the store sends both at once
    # (elsewhere it is one more command). Single dequeues read ahead, and the others take what was
    # read in one command each (quick takes); a read is 2 or 3 commands, one in 16 or fewer
    with connect(place.url) as store:
        beside = store.reads_beside
    assert 1 < per_call["dequeue (single), reserve"] < 1.2
    # batches of 20 hold the lock (a record read beside the acquire or after it) until the reader
    # reads further ahead than 20; then they are quick takes too
    assert 1 < per_call["dequeue (batches of 20), reserve"] <= (3 if beside else 4)
    assert 1 < per_call["owner dequeue (single, no lock), reserve"] < 1.2
    assert [(s.appends, s.delay > 0) for s in report.scaling] == [
        ("lock", False),
        ("reserve", False),
        ("lock", True),
        ("reserve", True),
    ]
    for scaling in report.scaling:
        assert scaling.one.operations == scaling.many.operations
        assert scaling.one.round_trips_per_call == (3 if scaling.appends == "lock" else 2)
        assert scaling.exactly_once and len(scaling.ratios) == 1
        assert scaling.many_stats.enqueue_calls == scaling.many.operations  # the producers' own counters
    assert report.producer is not None and report.producer_exact
    assert report.producer.operations / report.producer.calls > 1  # entries were batched
    assert report.exactly_once
    assert any(line.startswith("  floor: the same commands") for line in report.lines())
    scaling_lines = [line for line in report.lines() if " producers vs 1 (" in line]
    assert scaling_lines[-1].startswith("2 producers vs 1 (reserve, 300 us round trip): ")
    assert scaling_lines[-1].endswith("every entry exactly once: True")
    assert [rate.name for rate in report.idle] == [
        "idle consumer iterator",
        "idle group consumer iterator",
        "idle Queue.dequeue(timeout=...)",
    ]
    assert all(0 < rate.rate <= _bench_idle.IDLE_COMMANDS_TARGET for rate in report.idle), report.idle
    assert report.idle[-1].line() in report.lines()
    if place.kind != "embedded":
        assert report.persist == [] and report.persist_note is None
    elif _bench_persist.available():  # the bench extra is part of the test install
        assert [(pair.synchronous, pair.ours) for pair in report.persist] == [
            (level, ours)
            for level in ("normal", "full")
            for ours in ("enqueue (single)", "dequeue (single)", "owner receive + ack (single)")
        ]
        assert all(pair.our_rate > 0 and pair.their_rate > 0 for pair in report.persist)
        assert report.lines()[-1] == report.persist[-1].line()


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
        encoding="native",
    )
    assert report.lines()[0].endswith("; entries stored as native")
    assert {figure.name for figure in report.figures} >= {"owner receive + ack (batches of 25)"}
    assert report.exactly_once


def test_the_persist_queue_comparison_refuses_to_time_an_empty_queue() -> None:
    # a side that found its queue empty would be timing nothing
    for empty in (None, []):
        with pytest.raises(errors.LargeQueueError, match="found a queue empty"):
            _bench_persist._got(empty)
    assert _bench_persist._got([1]) == [1]


def test_the_producer_objects_check_finds_an_entry_put_twice(store: Store) -> None:
    """The bench's "every entry exactly once" compares values with the offsets their futures gave,
    and looks for anything left after the expected count."""
    from large_queue._bench_producers import _fed_by_threads

    assert _fed_by_threads(store.new_queue(capacity=200, slots_per_record=50), 2, 10, 4)[1]
    queue = store.new_queue(capacity=200, slots_per_record=50)
    made = queue.producer

    def putting_one_twice(**options: Any) -> Any:
        producer = made(**options)
        flush = producer.flush

        def flush_and_put_again() -> None:
            flush()
            queue.enqueue({"t": 0, "n": 0})  # a value already sent, at an offset no future gave

        producer.flush = flush_and_put_again  # type: ignore[method-assign]
        return producer

    queue.producer = putting_one_twice  # type: ignore[method-assign]
    assert not _fed_by_threads(queue, 2, 10, 4)[1]
