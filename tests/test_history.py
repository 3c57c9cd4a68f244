"""The history checker finds each anomaly it claims to find, and nothing in a clean history."""

from __future__ import annotations

from pathlib import Path

from large_queue._history import Call, HistoryWriter, check, read_calls
from large_queue._history_groups import check_groups


def enqueue(client: str, values: list[str], offset: int | None, t: float, outcome: str | None = "ok") -> Call:
    call = Call(client, "enqueue", t, {"values": values})
    if outcome:
        call.outcome, call.completed = outcome, t + 0.1
        call.response = {"offsets": [offset, offset + len(values)]} if outcome == "ok" else {}
    return call


def dequeue(client: str, entries: list[list[object]] | None, t: float, max_entries: int = 5) -> Call:
    call = Call(client, "dequeue", t, {"max_entries": max_entries})
    if entries is not None:
        call.outcome, call.completed, call.response = "ok", t + 0.1, {"entries": entries}
    return call


def clean() -> list[Call]:
    return [
        enqueue("p", ["p:0", "p:1"], 0, 1.0),
        enqueue("q", ["q:0"], 2, 2.0),
        dequeue("c", [[0, "p:0"], [1, "p:1"]], 3.0),
        dequeue("c", [[2, "q:0"]], 4.0),
        dequeue("c", [], 5.0),
    ]


def test_a_clean_history_passes() -> None:
    verdict = check(clean())
    assert verdict.ok, verdict
    assert (verdict.enqueues_acknowledged, verdict.entries_delivered, verdict.empty_dequeues) == (3, 3, 1)


def test_each_anomaly_is_found() -> None:
    cases = {
        "lost": clean()[:3] + clean()[4:],
        "duplicated": [*clean(), dequeue("d", [[2, "q:0"]], 4.5)],
        "unexpected": [*clean(), dequeue("d", [[3, "x:0"]], 6.0)],
        "order violations": [
            enqueue("p", ["p:1"], 0, 1.0),
            enqueue("p", ["p:0"], 1, 1.5),
            dequeue("c", [[0, "p:1"], [1, "p:0"]], 2.0),
        ],
        "false empties": [
            enqueue("p", ["p:0"], 0, 1.0),
            dequeue("c", [], 2.0),
            dequeue("c", [[0, "p:0"]], 3.0),
        ],
        "conflicting offsets": [*clean()[:4], dequeue("d", [[1, "p:9"]], 4.5)],
    }
    for anomaly, calls in cases.items():
        verdict = check(calls)
        assert verdict.anomalies[anomaly] >= 1, (anomaly, verdict)
        assert anomaly in verdict.examples


def test_kills_explain_missing_entries_but_not_more() -> None:
    killed = dequeue("c", None, 3.0, max_entries=2)  # invoked, never completed
    calls = [enqueue("p", ["p:0", "p:1", "p:2"], 0, 1.0), killed, dequeue("d", [[2, "p:2"]], 4.0)]
    verdict = check(calls)
    assert verdict.ok and (verdict.in_doubt_calls, verdict.in_doubt_entries) == (1, 2)
    killed.request["max_entries"] = 1
    assert check(calls).anomalies["lost"] == 1  # one entry more is missing than the kill could take


def test_a_kill_does_not_excuse_an_entry_a_call_passed_over_nor_runs_it_cannot_have_taken() -> None:
    """A dequeue takes a run from the head: what it skipped between offsets it returned is lost,
    however many dequeues were killed; and one killed dequeue takes at most one run."""
    killed = [dequeue("k", None, 0.5, max_entries=8), dequeue("l", None, 0.6, max_entries=8)]
    produced = enqueue("p", [f"p:{i}" for i in range(6)], 0, 1.0)
    skipped = [produced, *killed, dequeue("c", [[0, "p:0"], [2, "p:2"]], 3.0)]  # 1 passed over
    skipped += [dequeue("c", [[3, "p:3"], [4, "p:4"], [5, "p:5"]], 4.0)]
    assert check(skipped).anomalies["lost"] == 1 and check(skipped).examples["lost"] == [(1, "p:1")]
    runs = [produced, killed[0], dequeue("c", [[1, "p:1"]], 3.0), dequeue("c", [[3, "p:3"], [5, "p:5"]], 4.0)]
    verdict = check(runs)  # 0, 2 and 4 missing: three runs apart, one killed dequeue (and 4 passed over)
    assert verdict.anomalies["lost"] == 2, verdict
    two_kills = [produced, *killed, dequeue("c", [[1, "p:1"]], 3.0)]
    rest = dequeue("c", [[3, "p:3"], [4, "p:4"], [5, "p:5"]], 4.0)
    assert check([*two_kills, rest]).ok  # 0 and 2 missing: a run each, a kill each
    three_runs = check([*two_kills, dequeue("c", [[3, "p:3"], [4, "p:4"]], 4.0)])  # and 5: a third run
    assert three_runs.anomalies["lost"] == 1, three_runs


def test_delivery_order_across_calls_is_first_in_first_out() -> None:
    produced = enqueue("p", ["p:0", "q:0", "p:1"], 0, 1.0)
    in_order = [produced, dequeue("c", [[0, "p:0"]], 2.0), dequeue("d", [[1, "q:0"], [2, "p:1"]], 3.0)]
    assert check(in_order).ok
    overlapping = [produced, dequeue("c", [[1, "q:0"]], 2.0), dequeue("d", [[0, "p:0"]], 2.05)]
    overlapping += [dequeue("c", [[2, "p:1"]], 3.0)]
    assert check(overlapping).ok  # the calls overlap in time: either may have committed first
    later_lower = [produced, dequeue("c", [[1, "q:0"]], 2.0), dequeue("d", [[0, "p:0"], [2, "p:1"]], 3.0)]
    verdict = check(later_lower)  # each producer's order holds; FIFO across calls does not
    assert verdict.anomalies["order violations"] == 0
    assert verdict.anomalies["delivery order violations"] == 1, verdict
    swapped = [produced, dequeue("c", [[1, "q:0"], [0, "p:0"]], 2.0), dequeue("c", [[2, "p:1"]], 3.0)]
    assert check(swapped).anomalies["delivery order violations"] == 1


def test_in_doubt_enqueues_are_neither_lost_nor_unexpected() -> None:
    calls = [
        enqueue("p", ["p:0"], None, 1.0, outcome=None),
        enqueue("p", ["p:1"], None, 2.0, outcome="unknown"),
        dequeue("c", [[0, "p:1"]], 3.0),
    ]
    verdict = check(calls)
    assert verdict.ok and verdict.in_doubt_calls == 2


def test_histories_round_trip_through_files(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path / "p.jsonl", "p")
    op = writer.invoke("enqueue", values=["p:0"])
    writer.complete(op, "ok", offsets=[0, 1])
    writer.invoke("enqueue", values=["p:1"])  # then "killed"
    writer.close()
    with (tmp_path / "p.jsonl").open("a") as history:
        history.write('{"type": "ok", "id": 2, "cut sh')  # a torn last line
    calls = read_calls([tmp_path / "p.jsonl"])
    assert [(c.op, c.outcome) for c in calls] == [("enqueue", "ok"), ("enqueue", None)]


def test_a_reservation_left_unpublished_excuses_empty_dequeues_only_for_the_hole_grace() -> None:
    history = [
        enqueue("p", ["p:0"], 0, 1.0),
        enqueue("q", ["q:0"], None, 1.5, outcome=None),  # killed between reserve and publish
        dequeue("c", [], 2.0),  # the hole at offset 1 hides nothing yet... but p:0 is there
        dequeue("c", [], 9.0),  # long after the hole should have been closed
        dequeue("c", [[0, "p:0"]], 10.0),
    ]
    under_the_lock = check(history)
    assert under_the_lock.anomalies["false empties"] == 2
    reserving = check(history, hole_grace=2.0)
    assert reserving.anomalies["false empties"] == 1
    assert reserving.examples["false empties"] == [("c", 9.0)]


def ack(client: str, group: str, entries: list[list[object]], t: float, outcome: str | None = "ok") -> Call:
    call = Call(client, "ack", t, {"group": group, "entries": entries})
    if outcome:
        call.outcome, call.completed = outcome, t + 0.1
    return call


def test_a_group_entry_acked_only_in_doubt_is_counted_apart_not_lost_nor_delivered() -> None:
    calls = [
        enqueue("p", ["p:0", "p:1"], 0, 1.0),
        ack("a", "g1", [[0, "p:0"], [1, "p:1"]], 2.0),
        ack("b", "g2", [[0, "p:0"]], 2.0),
        ack("c", "g2", [[1, "p:1"]], 3.0, outcome=None),  # c was killed before it heard back
    ]
    verdict = check_groups(calls, ["g1", "g2"])
    assert verdict.ok, verdict
    assert (verdict.entries_delivered, verdict.in_doubt_entries, verdict.in_doubt_calls) == (3, 1, 1)
    verdict = check_groups(calls[:3], ["g1", "g2"])  # without the ack in doubt, p:1 is lost in g2
    assert verdict.anomalies["lost"] == 1 and verdict.in_doubt_entries == 0


def test_entries_delivered_from_enqueues_in_doubt_are_counted_apart() -> None:
    """The report's lines add up: acknowledged - lost - missing in doubt + delivered in doubt = delivered."""
    calls = [
        enqueue("p", ["p:0"], 0, 1.0),
        enqueue("p", ["p:1"], None, 2.0, outcome=None),  # killed, and applied after all
        dequeue("c", [[0, "p:0"], [1, "p:1"]], 3.0),
    ]
    verdict = check(calls)
    assert verdict.ok and verdict.delivered_in_doubt == 1
    assert verdict.enqueues_acknowledged + verdict.delivered_in_doubt == verdict.entries_delivered


def test_killed_dequeues_are_matched_to_runs_in_the_way_that_explains_the_most() -> None:
    """Runs of 4 and 3 missing entries, killed dequeues of 3, 2 and 2: 2 + 2 and 3 explain them all
    (giving 3 + 2 to the run of 4 would leave one unexplained and cry loss)."""
    killed = [dequeue(c, None, t, max_entries=m) for c, t, m in [("k", 2.0, 2), ("l", 2.1, 2), ("m", 3.5, 3)]]
    calls = [enqueue("p", [f"p:{i}" for i in range(9)], 0, 1.0), *killed]
    calls += [dequeue("c", [[4, "p:4"]], 3.0), dequeue("c", [[8, "p:8"]], 4.0)]
    verdict = check(calls)
    assert verdict.ok, verdict
    killed[2].request["max_entries"] = 2  # now 2 + 2 + 2 for runs of 4 and 3: one is lost
    assert check(calls).anomalies["lost"] == 1


def test_many_runs_of_missing_entries_are_judged_not_a_crash() -> None:
    """Every other entry missing, 300 runs apart, no kill: 300 lost (a bound stands in for the search)."""
    calls = [enqueue("p", [f"p:{i}" for i in range(600)], 0, 1.0)]
    calls += [dequeue("c", [[i, f"p:{i}"]], 2.0 + i) for i in range(0, 600, 2)]
    assert check(calls).anomalies["lost"] == 300
    killed = [dequeue("k", None, 2.5 + i, max_entries=1) for i in range(1, 600, 2)]
    assert check(calls + killed).ok  # a kill for each: all explained
