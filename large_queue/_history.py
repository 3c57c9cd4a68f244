"""Operation histories of concurrent queue clients, and the checker that judges them.

Each client appends one JSON line per event to its own file: ``invoke``
before a call, then ``ok``, ``fail`` (definitely not applied) or ``unknown``
(may have been applied). A client killed mid-call leaves an ``invoke`` with
nothing after it: that call is in doubt too. Times are ``time.monotonic()``,
one clock for every process on the machine.

The checker reports, for a destructive-dequeue queue without overwriting:

- lost: an acknowledged enqueue whose entry was never dequeued, unless
  dequeues cut short by a kill could have removed it: a dequeue takes a run
  from the head, so a missing entry between the first and last offsets one
  call returned is lost, and the rest must form runs (no delivered offset
  inside) that the killed dequeues' ``max_entries`` can cover, each run
  taken by dequeues of its own;
- duplicated: an entry delivered more than once;
- unexpected: a delivered value that no client ever tried to enqueue;
- order violations: one producer's entries delivered out of its order;
- delivery order violations: a dequeue that began after another ended got
  an offset below one the other got (FIFO across calls), or one call's
  entries not in increasing offsets;
- false empties: a dequeue that returned nothing while an acknowledged entry
  stayed in the queue from before it started until after it ended (where
  producers append without the lock, also while no enqueue could have held
  an unpublished reservation: none was under way, and none had failed or
  died within ``hole_grace`` seconds, the time its hole may stay open);
- conflicting offsets: two different values delivered or acknowledged at one
  offset.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class HistoryWriter:
    """Appends events to one client's history file, one ``write`` per line."""

    def __init__(self, path: Path, client: str) -> None:
        self.client = client
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._op = 0

    def invoke(self, op: str, **fields: Any) -> int:
        """Record the start of a call; returns its id."""
        self._op += 1
        self._write({"type": "invoke", "op": op, "id": self._op, **fields})
        return self._op

    def complete(self, op_id: int, outcome: str, **fields: Any) -> None:
        """Record how call ``op_id`` ended: ``ok``, ``fail`` or ``unknown``."""
        self._write({"type": outcome, "id": op_id, **fields})

    def _write(self, event: dict[str, Any]) -> None:
        event.update(client=self.client, t=time.monotonic())
        os.write(self._fd, (json.dumps(event) + "\n").encode())

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


@dataclass
class Call:
    """An invoke and its completion (None if the client died first)."""

    client: str
    op: str
    invoked: float
    request: dict[str, Any]
    outcome: str | None = None
    completed: float | None = None
    response: dict[str, Any] = field(default_factory=dict)


def read_calls(paths: Iterable[Path]) -> list[Call]:
    """Pair up the invokes and completions of every history file."""
    calls: list[Call] = []
    for path in paths:
        open_calls: dict[int, Call] = {}
        for line in path.read_text().splitlines():
            if not line.endswith("}"):
                continue  # a line cut short by a kill
            event = json.loads(line)
            if event["type"] == "invoke":
                call = Call(event["client"], event["op"], event["t"], event)
                open_calls[event["id"]] = call
                calls.append(call)
            elif event["id"] in open_calls:
                call = open_calls.pop(event["id"])
                call.outcome, call.completed, call.response = event["type"], event["t"], event
    return calls


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What the checker found."""

    enqueues_acknowledged: int
    entries_delivered: int
    empty_dequeues: int
    in_doubt_calls: int
    in_doubt_entries: int
    anomalies: dict[str, int]
    #: entries delivered whose enqueue was in doubt or cut short (applied after all)
    delivered_in_doubt: int = 0
    examples: dict[str, list[Any]]

    @property
    def ok(self) -> bool:
        """True when every anomaly count is zero."""
        return not any(self.anomalies.values())


def _possible_holes(calls: list[Call], hole_grace: float | None) -> list[tuple[float, float]]:
    """(from, until) of each time an enqueue may have held an unpublished reservation, sorted."""
    if hole_grace is None:
        return []
    holes = []
    for call in calls:
        if call.op != "enqueue":
            continue
        if call.outcome == "ok":
            holes.append((call.invoked, call.completed or call.invoked))
        else:  # failed, unknown or killed: its reservation stays a hole until a reader closes it
            holes.append((call.invoked, (call.completed or call.invoked) + hole_grace))
    return sorted(holes)


def _lost(
    missing: list[tuple[int, str]],
    delivered: list[tuple[int, str, Call]],
    delivered_offsets: list[int],
    killed_takes: list[int],
) -> list[tuple[int, str]]:
    """The missing entries (offset, value) that no dequeue cut short by a kill can account for.

    A dequeue takes a run of entries from the head. So a missing entry
    between the lowest and highest offsets one call returned was passed
    over: lost. The others form runs of missing offsets with no delivered
    offset between them; a killed dequeue took at most its ``max_entries``
    of one run, and each run needs dequeues of its own. The largest runs
    are matched with the largest takes first; what no take covers is lost.
    """
    spans: dict[int, list[int]] = {}
    for offset, _, call in delivered:
        span = spans.setdefault(id(call), [offset, offset])
        span[0], span[1] = min(span[0], offset), max(span[1], offset)
    passed = sorted((low, high) for low, high in spans.values() if high > low)
    starts = [low for low, _ in passed]
    reach = list(itertools.accumulate((high for _, high in passed), max))
    lost: list[tuple[int, str]] = []
    runs: list[list[tuple[int, str]]] = []
    for offset, value in missing:
        inside = bisect.bisect_left(starts, offset)  # spans that begin below it
        if inside and reach[inside - 1] > offset:
            lost.append((offset, value))  # a call took entries on both sides of it
            continue
        if runs:
            previous = runs[-1][-1][0]
            between = bisect.bisect_right(delivered_offsets, previous)
            if between >= len(delivered_offsets) or delivered_offsets[between] > offset:
                runs[-1].append((offset, value))  # nothing delivered in between: the same run
                continue
        runs.append([(offset, value)])
    uncovered = _fewest_uncovered(sorted((len(run) for run in runs), reverse=True), killed_takes)
    if uncovered:  # that many are lost however the kills are matched: named from the longest runs' ends
        ends = sorted((entry for run in runs for entry in run[-uncovered:]), key=lambda e: -e[0])
        lost += ends[:uncovered]
    return sorted(lost)


#: searches past this many states are not made (a bound stands in): the checker answers in seconds
_MOST_STATES = 2_000_000
#: ... nor past this many runs and takes, which would recurse too deep
_MOST_STEPS = 100


def _fewest_uncovered(runs: list[int], takes: list[int]) -> int:
    """The fewest missing entries that no matching of killed dequeues to runs covers.

    Each killed dequeue takes up to its ``max_entries`` from one run; a run may need several.
    Searched exactly over how many dequeues of each ``max_entries`` are left; where that is too
    many states, a bound that no matching can beat (so never a loss that a matching explains).
    """
    values = sorted(set(takes), reverse=True)
    counts = tuple(takes.count(value) for value in values)
    states = math.prod(count + 1 for count in counts) * len(runs) * max(runs, default=1) * len(values)
    if states > _MOST_STATES or len(runs) + len(takes) > _MOST_STEPS:
        spare = len(takes) - len(runs)  # runs beyond the dequeues: the smallest go uncovered
        left_out = sum(sorted(runs)[: max(0, -spare)])
        return left_out + max(0, sum(runs) - left_out - sum(takes))

    @functools.cache
    def best(run: int, left: tuple[int, ...]) -> int:
        return 0 if run == len(runs) else cover(run, runs[run], 0, left)

    @functools.cache
    def cover(run: int, need: int, first: int, left: tuple[int, ...]) -> int:
        if need <= 0:
            return best(run + 1, left)
        fewest = need + best(run + 1, left)  # the rest of this run goes uncovered
        for kind in range(first, len(values)):
            if left[kind]:
                taken = (*left[:kind], left[kind] - 1, *left[kind + 1 :])
                fewest = min(fewest, cover(run, need - values[kind], kind, taken))
        return fewest

    return best(0, counts)


def _out_of_fifo(calls: list[Call]) -> list[tuple[str, list[int], str, list[int]]]:
    """Dequeues that broke FIFO: a call's own offsets not increasing, or a call that began after
    another ended holding an offset below one the other got (the other's entries left first)."""
    taken = sorted(
        (call.completed or 0.0, call.invoked, [offset for offset, _ in call.response["entries"]], call.client)
        for call in calls
        if call.op == "dequeue" and call.outcome == "ok" and call.response.get("entries")
    )
    violations: list[tuple[str, list[int], str, list[int]]] = []
    for _, _, offsets, client in taken:
        if offsets != sorted(offsets):
            violations.append((client, offsets, client, offsets))
    ended = [completed for completed, _, _, _ in taken]
    highest = list(itertools.accumulate((max(offsets) for _, _, offsets, _ in taken), max))
    for _, invoked, offsets, client in taken:
        before = bisect.bisect_left(ended, invoked)  # calls that ended before this one began
        if before and highest[before - 1] > min(offsets):
            earlier = next(
                (c, o) for done, _, o, c in taken[:before] if max(o) == highest[before - 1] and done < invoked
            )
            violations.append((earlier[0], earlier[1], client, offsets))
    return violations


def _producer_and_sequence(value: str) -> tuple[str, int]:
    producer, _, sequence = value.rpartition(":")
    return producer, int(sequence)


def check(calls: list[Call], *, hole_grace: float | None = None) -> Verdict:
    """Judge a history of enqueues (values ``producer:sequence``) and dequeues.

    ``hole_grace``: producers append without the lock, and a reservation left
    unpublished by a failed or killed enqueue may hide the queue's entries
    from dequeues for up to this many seconds after the call's last event.
    """
    attempted: set[str] = set()
    acknowledged: dict[str, tuple[int, float]] = {}  # value -> (offset, ack time)
    delivered: list[tuple[int, str, Call]] = []
    known_in_doubt: set[int] = set()  # offsets an unknown-outcome dequeue named
    empties: list[Call] = []
    in_doubt_calls = 0
    conflicts: list[Any] = []
    offset_values: dict[int, str] = {}

    def claim(offset: int, value: str) -> None:
        if offset_values.setdefault(offset, value) != value:
            conflicts.append((offset, offset_values[offset], value))

    for call in calls:
        if call.op == "enqueue":
            attempted.update(call.request["values"])
            if call.outcome == "ok":
                start = call.response["offsets"][0]
                for index, value in enumerate(call.request["values"]):
                    acknowledged[value] = (start + index, call.completed or 0.0)
                    claim(start + index, value)
            elif call.outcome != "fail":
                in_doubt_calls += 1
        elif call.op == "dequeue":
            if call.outcome == "ok":
                entries = call.response["entries"]
                if not entries:
                    empties.append(call)
                for offset, value in entries:
                    delivered.append((offset, value, call))
            elif call.outcome == "unknown":
                in_doubt_calls += 1
                known_in_doubt.update(offset for offset, _ in call.response.get("entries", []))
            elif call.outcome is None:  # cut short by a kill: it may have removed max_entries
                in_doubt_calls += 1

    counts = Counter(value for _, value, _ in delivered)
    duplicated = [value for value, count in counts.items() if count > 1]
    unexpected = [value for value in counts if value not in attempted]
    for offset, value, _ in delivered:
        claim(offset, value)

    delivered_offsets = {offset for offset, _, _ in delivered} | known_in_doubt
    missing = sorted(
        (offset, value) for value, (offset, _) in acknowledged.items() if offset not in delivered_offsets
    )
    killed_takes = [
        call.request["max_entries"] for call in calls if call.op == "dequeue" and call.outcome is None
    ]
    lost = _lost(missing, delivered, sorted(delivered_offsets), killed_takes)
    fifo_violations = _out_of_fifo(calls)

    order_violations = []
    last_sequence: dict[str, tuple[int, int]] = {}
    for offset, value, _ in sorted(delivered, key=lambda item: item[0]):
        producer, sequence = _producer_and_sequence(value)
        previous = last_sequence.get(producer)
        if previous is not None and sequence <= previous[1]:
            order_violations.append((producer, previous, (offset, sequence)))
        last_sequence[producer] = (offset, sequence)

    # A dequeue returned nothing falsely if some acknowledged entry was in the
    # queue for its whole span: acknowledged before it began, removed (by a
    # dequeue that began) after it ended. Entries a killed dequeue may have
    # taken have no known removal time and are left out.
    removed_at = {value: call.invoked for _, value, call in delivered}
    spans = sorted(
        (acked_at, removed_at[value]) for value, (_, acked_at) in acknowledged.items() if value in removed_at
    )
    acked_times = [acked_at for acked_at, _ in spans]
    latest_removal = list(itertools.accumulate((removed for _, removed in spans), max))
    holes = _possible_holes(calls, hole_grace)
    hole_starts = [start for start, _ in holes]
    latest_hole_end = list(itertools.accumulate((end for _, end in holes), max))
    false_empties = []
    for empty in empties:
        present_before = bisect.bisect_left(acked_times, empty.invoked)
        if present_before and latest_removal[present_before - 1] > (empty.completed or 0.0):
            opened_before = bisect.bisect_left(hole_starts, empty.completed or 0.0)
            if opened_before and latest_hole_end[opened_before - 1] > empty.invoked:
                continue  # an unpublished reservation may have hidden the entries
            false_empties.append((empty.client, empty.invoked))

    anomalies = {
        "lost": len(lost),
        "duplicated": len(duplicated),
        "unexpected": len(unexpected),
        "order violations": len(order_violations),
        "delivery order violations": len(fifo_violations),
        "false empties": len(false_empties),
        "conflicting offsets": len(conflicts),
    }
    examples: dict[str, list[Any]] = {
        "lost": lost[:5],
        "duplicated": duplicated[:5],
        "unexpected": unexpected[:5],
        "order violations": order_violations[:5],
        "delivery order violations": fifo_violations[:5],
        "false empties": false_empties[:5],
        "conflicting offsets": conflicts[:5],
    }
    return Verdict(
        enqueues_acknowledged=len(acknowledged),
        entries_delivered=len(delivered),
        empty_dequeues=len(empties),
        in_doubt_calls=in_doubt_calls,
        in_doubt_entries=len(missing) - len(lost),
        anomalies=anomalies,
        delivered_in_doubt=sum(1 for value in counts if value in attempted and value not in acknowledged),
        examples={name: items for name, items in examples.items() if items},
    )
