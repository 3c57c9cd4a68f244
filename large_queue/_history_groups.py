"""The checker of torture runs whose consumers are consumer groups.

Group consumers record one ``ack`` call per ack they send, naming the group
and the entries (offset and value); the drain at the end acks what is left in
every group. Per group, the checker reports:

- lost: an acknowledged enqueue never acked in the group, nor possibly acked
  by an ack that was cut short (its process killed) or in doubt;
- duplicated: an entry acked twice in the group by acks that both succeeded
  (redelivery is allowed; a second successful ack is not);
- unexpected: an acked value that no client ever tried to enqueue;
- conflicting offsets: two different values acked at one offset.

Order is not checked: a redelivered entry comes after later ones. Entries
a group acked only by acks in doubt are counted apart (in doubt), not as
delivered.
"""

from __future__ import annotations

from collections import Counter

from large_queue._history import Call, Verdict

ANOMALIES = ("lost", "duplicated", "unexpected", "conflicting offsets")


def check_groups(calls: list[Call], groups: list[str]) -> Verdict:
    """Judge the histories of a run consumed by ``groups`` (see the module docstring)."""
    acknowledged: set[str] = set()
    attempted: set[str] = set()
    in_doubt_calls = 0
    for call in calls:
        if call.op == "enqueue":
            attempted.update(call.request["values"])
            if call.outcome == "ok":
                acknowledged.update(call.request["values"])
            elif call.outcome != "fail":
                in_doubt_calls += 1
    anomalies = dict.fromkeys(ANOMALIES, 0)
    examples: dict[str, list[object]] = {}

    def found(kind: str, example: object) -> None:
        anomalies[kind] += 1
        examples.setdefault(kind, [])
        if len(examples[kind]) < 5:
            examples[kind].append(example)

    acked_total = 0
    maybe_total = 0  # acknowledged entries a group acked only by acks in doubt
    for group in groups:
        acked: Counter[str] = Counter()
        maybe: set[str] = set()
        at_offset: dict[int, str] = {}
        for call in calls:
            if call.op != "ack" or call.request.get("group") != group:
                continue
            for offset, value in call.request["entries"]:
                if at_offset.setdefault(offset, value) != value:
                    found("conflicting offsets", [group, offset, at_offset[offset], value])
                if value not in attempted:
                    found("unexpected", [group, value])
                if call.outcome == "ok":
                    acked[value] += 1
                elif call.outcome != "fail":
                    maybe.add(value)
                    in_doubt_calls += call.outcome is None
        acked_total += sum(acked.values())
        maybe_total += len(acknowledged & maybe - set(acked))
        for value, times in acked.items():
            if times > 1:
                found("duplicated", [group, value, times])
        for value in sorted(acknowledged - set(acked) - maybe):
            found("lost", [group, value])
    return Verdict(
        enqueues_acknowledged=len(acknowledged),
        entries_delivered=acked_total,
        empty_dequeues=0,
        in_doubt_calls=in_doubt_calls,
        in_doubt_entries=maybe_total,
        anomalies=anomalies,
        examples=examples,
    )


__all__ = ["ANOMALIES", "check_groups"]
