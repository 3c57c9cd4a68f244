"""Consumer groups shared by node processes, with one owner killed and one paused in each group.

Two groups of three node processes consume one queue that a producer
process keeps full (it waits on the slower group). Entries whose value is a
multiple of 37 are poison: their handler always fails, and after
``max_deliveries`` they go to a dead-letter queue. In each group one owner
holding deliveries is SIGKILLed, and later another is SIGSTOPped past the
timeout and continued. Every node logs (as JSON lines) its ownership events,
deliveries, acks and nacks. The test then checks, per group: never two
owners of one epoch; every other entry acked exactly once and never
delivered after its ack; each delivery of an entry with a new delivery
count; the paused owner's stale acks refused; and every poison entry in the
dead-letter queue exactly once.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from large_queue import DeliveryExpiredError, OwnershipLostError, Queue, QueueFullError
from large_queue.backends import connect
from large_queue.cluster import OwnershipEvent
from tests.fix_backends import Place
from tests.test_cluster import TIMING

GROUPS = ("g1", "g2")
NODES = ("a", "b", "c")
ENTRIES = 300  # more than the capacity: the producer waits on the slower group
POISON = {value for value in range(ENTRIES) if value % 37 == 0}
OPTIONS = {**TIMING, "visibility_timeout": 1.0, "max_deliveries": 3}
HANDLING = 0.05  # seconds a handler takes per batch: an owner is often caught holding deliveries
SETTLED = ("acked", "ack-refused", "nacked", "nack-refused")


def _produce(url: str, name: str) -> None:
    queue = Queue.open(connect(url), name)
    for value in range(ENTRIES):
        while True:
            try:
                queue.enqueue(value)
                break
            except QueueFullError:
                time.sleep(0.01)


def _node(url: str, name: str, dead_letter_name: str, group: str, node_id: str, log_path: str) -> None:
    backend = connect(url)
    queue, dead_letter = Queue.open(backend, name), Queue.open(backend, dead_letter_name)
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
    stop_path = Path(log_path).parent / "stop"

    def write(**event: Any) -> None:
        log.write(json.dumps({"group": group, "node": node_id, "t": time.time_ns(), **event}) + "\n")

    def on_event(event: OwnershipEvent) -> None:
        write(kind=event.kind, epoch=event.epoch)

    def settle(
        verb: str, values: list[int], epoch: int, action: Callable[..., None], *args: Any, **kw: Any
    ) -> None:
        try:
            action(*args, **kw)
        except (OwnershipLostError, DeliveryExpiredError) as exc:
            write(kind=f"{verb}-refused", values=values, epoch=epoch, error=type(exc).__name__)
        else:
            write(kind=f"{verb}ed", values=values, epoch=epoch)

    with queue.consumer(
        node_id, group=group, dead_letter=dead_letter, on_event=on_event, **OPTIONS
    ) as consumer:
        while not stop_path.exists():
            messages = consumer.receive(5, timeout=0.1)
            for message in messages:
                write(
                    kind="delivered",
                    value=message.value,
                    offset=message.offset,
                    count=message.delivery_count,
                    epoch=message.epoch,
                )
            if not messages:
                continue
            time.sleep(HANDLING)
            for message in messages:
                if message.value in POISON:
                    settle(
                        "nack", [message.value], message.epoch, message.nack, error=f"poison {message.value}"
                    )
            healthy = [message for message in messages if message.value not in POISON]
            if healthy:
                settle("ack", [m.value for m in healthy], healthy[0].epoch, consumer.ack, healthy)


def _signal(process: BaseProcess, number: signal.Signals) -> None:
    assert process.pid is not None
    os.kill(process.pid, number)


class Groups:
    """The queue, its dead-letter queue, a producer process and the node processes of every group."""

    def __init__(self, place: Place, tmp_path: Path) -> None:
        self.logs = tmp_path
        backend = place.connect()
        name, dead_letter_name = place.name("shared"), place.name("dead")
        self.queue = Queue.create(backend, name, capacity=120, slots_per_record=10)
        self.dead_letter = Queue.create(
            backend, dead_letter_name, capacity=60, slots_per_record=10, hole_timeout=0.5
        )
        for group in GROUPS:  # before any entry: each group sees them all
            self.queue.create_group(group)
        context = multiprocessing.get_context("spawn")
        self.processes: dict[tuple[str, str], BaseProcess] = {
            (group, node): context.Process(
                target=_node,
                args=(place.url, name, dead_letter_name, group, node, str(self.log(group, node))),
            )
            for group in GROUPS
            for node in NODES
        }
        self.producer = context.Process(target=_produce, args=(place.url, name))
        for process in [*self.processes.values(), self.producer]:
            process.start()

    def log(self, group: str, node: str) -> Path:
        return self.logs / f"{group}-{node}.log"

    def events(self, *nodes: tuple[str, str]) -> list[dict[str, Any]]:
        """The logged events of ``nodes`` (default: every node, killed ones too), in time order."""
        events = []
        for group, node in nodes or [(group, node) for group in GROUPS for node in NODES]:
            log = self.log(group, node)
            if log.exists():
                events += [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]
        return sorted(events, key=lambda event: event["t"])

    def owner_holding_deliveries(self, group: str, once_acked: int) -> str | None:
        """The group's owner, if it is alive and holds deliveries and the group acked ``once_acked``."""
        info = self.queue.group(group)
        if info.owner is None or (group, info.owner) not in self.processes or info.acked_offset < once_acked:
            return None
        mine = self.events((group, info.owner))
        delivered = {e["value"] for e in mine if e["kind"] == "delivered"}
        settled = {v for e in mine if e["kind"] in SETTLED for v in e["values"]}
        return info.owner if delivered - settled else None

    def signal_owners(
        self, number: signal.Signals, *, once_acked: int, seconds: float = 30
    ) -> dict[str, str]:
        """Send ``number`` to an owner holding deliveries in every group; return them by group."""
        victims: dict[str, str] = {}
        deadline = time.monotonic() + seconds
        while len(victims) < len(GROUPS) and time.monotonic() < deadline:
            for group in set(GROUPS) - set(victims):
                owner = self.owner_holding_deliveries(group, once_acked)
                if owner is not None:
                    _signal(self.processes[group, owner], number)
                    victims[group] = owner
            time.sleep(0.01)
        assert len(victims) == len(GROUPS), f"no owner held deliveries in time: {victims}"
        return victims

    def wait_until_consumed(self, seconds: float = 45) -> None:
        """Until every entry is produced and, in every group, acked or moved to the dead-letter queue."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            infos = [self.queue.group(group) for group in GROUPS]
            if not self.producer.is_alive() and all(i.lag == 0 and i.in_flight == 0 for i in infos):
                return
            time.sleep(0.1)
        raise AssertionError(
            f"not consumed in {seconds} s (producer alive: {self.producer.is_alive()}): {infos}"
        )

    def stop(self) -> None:
        (self.logs / "stop").touch()
        for process in [*self.processes.values(), self.producer]:
            if process.is_alive():
                _signal(process, signal.SIGCONT)  # a paused node left paused by a failed step
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()

    def dead_letters(self) -> list[dict[str, Any]]:
        letters = []
        while (entry := self.dead_letter.dequeue(timeout=1.0)) is not None:
            letters.append(entry.value)
        return letters


def _unsettled(events: list[dict[str, Any]], node: str) -> set[int]:
    """Values delivered to ``node`` that it never wrote an ack or nack of."""
    delivered = {e["value"] for e in events if e["node"] == node and e["kind"] == "delivered"}
    settled = {v for e in events if e["node"] == node and e["kind"] in SETTLED for v in e["values"]}
    return delivered - settled


def _check_group(events: list[dict[str, Any]], group: str, killed: str) -> dict[str, int]:
    """Check one group's history (see the module docstring); return its figures.

    The ``killed`` node's last ack may have been applied just before its
    SIGKILL and never written to its log (the kill waits for the group's
    acked offset, which that very ack moves): entries it was delivered and
    never logged settling count as acked by it, if nobody else acked them.
    """
    events = [e for e in events if e["group"] == group]
    owners_by_epoch: dict[int, set[str]] = defaultdict(set)
    for event in events:
        if event["kind"] in ("take", "commit", "release"):
            owners_by_epoch[event["epoch"]].add(event["node"])
    assert all(len(nodes) == 1 for nodes in owners_by_epoch.values()), (group, owners_by_epoch)
    acked = Counter(v for e in events if e["kind"] == "acked" for v in e["values"])
    expected = set(range(ENTRIES)) - POISON
    in_doubt = (expected - set(acked)) & _unsettled(events, killed)
    assert set(acked) | in_doubt == expected, (
        f"{group}: never acked {sorted(expected - set(acked) - in_doubt)},"
        f" poison acked {sorted(set(acked) - expected)}"
    )
    assert [v for v, n in acked.items() if n > 1] == [], f"{group}: acked twice"
    counts: dict[int, list[int]] = defaultdict(list)
    acked_so_far: set[int] = set()
    for event in events:
        if event["kind"] == "acked":
            acked_so_far.update(event["values"])
        elif event["kind"] == "delivered":
            assert event["value"] not in acked_so_far, f"{group}: acked {event['value']} delivered again"
            counts[event["value"]].append(event["count"])
    assert all(len(c) == len(set(c)) for c in counts.values()), (
        f"{group}: a delivery count repeated: {counts}"
    )
    return {
        "epochs": len(owners_by_epoch),
        "redeliveries": sum(c > 1 for value, cs in counts.items() if value not in POISON for c in cs),
        "refused": sum(e["kind"].endswith("-refused") for e in events),
        "acked by the killed node, unlogged": len(in_doubt),
    }


def test_groups_of_node_processes_survive_a_killed_and_a_paused_owner(place: Place, tmp_path: Path) -> None:
    groups = Groups(place, tmp_path)
    # by group: the paused node, the group's epoch once another node took over, when it was continued (ns)
    pauses: dict[str, tuple[str, int, int]] = {}
    try:
        killed = groups.signal_owners(signal.SIGKILL, once_acked=60)  # past a head sync
        for group, node in killed.items():
            groups.processes.pop((group, node)).join()
        paused = groups.signal_owners(signal.SIGSTOP, once_acked=150)  # producers held back
        time.sleep(OPTIONS["timeout"] * 2.5)
        for group, node in paused.items():
            info = groups.queue.group(group)
            assert info.owner not in (None, node), f"{group}: nobody took over from paused {node}"
            _signal(groups.processes[group, node], signal.SIGCONT)
            pauses[group] = (node, info.epoch, time.time_ns())
        groups.wait_until_consumed()
    finally:
        groups.stop()
    assert {key: p.exitcode for key, p in groups.processes.items() if p.exitcode} == {}
    assert groups.producer.exitcode == 0
    events = groups.events()
    for group in GROUPS:
        figures = _check_group(events, group, killed[group])
        print(f"{group}: killed {killed[group]}, paused {pauses[group][0]}: {figures}")
        node, epoch_after, continued_ns = pauses[group]
        stale = [
            e
            for e in events
            if (e["group"], e["node"], e["kind"]) == (group, node, "acked")
            and e["t"] > continued_ns
            and e["epoch"] <= epoch_after
        ]
        assert stale == [], f"{group}: acks of the paused owner's old deliveries were taken: {stale}"
        info = groups.queue.group(group)
        assert (info.dead_lettered, info.lost, info.in_flight) == (len(POISON), 0, 0), info
    letters = groups.dead_letters()
    assert all(letter["queue"] == groups.queue.name for letter in letters)
    placed = Counter((letter["group"], letter["value"]) for letter in letters)
    assert [key for key, n in placed.items() if n > 1] == [], "dead-lettered twice"
    assert sorted(placed) == sorted((group, value) for group in GROUPS for value in POISON)
    assert all(letter["offset"] == letter["value"] for letter in letters)  # one producer: offset = value
