"""The ownership shim: several node processes share one queue.

Each node process logs (as JSON lines) its ownership events with their epoch
and time, every delivery and every ack. The tests then check: never two
owners at once, every node owns the queue at some point, handover in
circular node-id order, every entry acked exactly once, redeliveries only of
unacked entries (marked), and a paused former owner's acks refused.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from large_queue import OwnershipLostError, Queue, QueueFullError, QueueNotFoundError
from large_queue import _records as rec
from large_queue._read_ahead import READ_AHEAD
from large_queue.backends import ListSet, connect
from large_queue.cluster import OwnershipEvent, ownership_info
from large_queue.cluster._ownership import Ownership, OwnerState
from tests.fix_backends import APPENDS, Place

TIMING = {"time_slice": 0.4, "timeout": 1.0, "poll_interval": 0.05}


def _node(
    url: str, name: str, node_id: str, log_path: str, ack_delay: float, batch: int, timing: dict[str, float]
) -> None:
    queue = Queue.open(connect(url), name)
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)

    def write(**event: Any) -> None:
        log.write(json.dumps({"node": node_id, "t": time.time_ns(), **event}) + "\n")

    def on_event(event: OwnershipEvent) -> None:
        write(kind=event.kind, epoch=event.epoch)

    with queue.consumer(node_id, on_event=on_event, **timing) as consumer:  # type: ignore[arg-type]
        while not os.path.exists(f"{log_path}.stop"):
            messages = consumer.receive(batch, timeout=0.1)
            for message in messages:
                write(
                    kind="delivered",
                    offset=message.offset,
                    value=message.value,
                    count=message.delivery_count,
                    epoch=message.epoch,
                )
            if messages:
                time.sleep(ack_delay)
                try:
                    consumer.ack(messages)
                    write(kind="acked", offsets=[m.offset for m in messages], epoch=messages[0].epoch)
                except OwnershipLostError:
                    write(kind="ack-refused", offsets=[m.offset for m in messages])


class Cluster:
    def __init__(
        self,
        place: Place,
        tmp_path: Path,
        nodes: str,
        *,
        ack_delay: float = 0.0,
        batch: int = 5,
        appends: str = "lock",
        timing: dict[str, float] = TIMING,
    ) -> None:
        self.logs = tmp_path
        name = place.name("shared")
        self.queue = Queue.create(place.connect(), name, capacity=120, slots_per_record=10, appends=appends)
        context = multiprocessing.get_context("spawn")
        self.processes = {
            node: context.Process(
                target=_node,
                args=(place.url, name, node, str(tmp_path / f"{node}.log"), ack_delay, batch, timing),
            )
            for node in nodes
        }
        self.nodes = list(nodes)
        for process in self.processes.values():
            process.start()

    def produce(self, count: int) -> None:
        for value in range(count):
            while True:
                try:
                    self.queue.enqueue(value)
                    break
                except QueueFullError:
                    time.sleep(0.01)

    def wait_until_acked(self, count: int, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.acked_offsets_total() >= count:
                return
            time.sleep(0.1)
        raise AssertionError(f"only {self.acked_offsets_total()} of {count} acked")

    def acked_offsets_total(self) -> int:
        return len({o for e in self.events() if e["kind"] == "acked" for o in e["offsets"]})

    def wait_until_every_node_owned(self, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if {e["node"] for e in self.events() if e["kind"] == "take"} >= set(self.processes):
                return
            time.sleep(0.1)

    def _unacked(self, node: str) -> set[int]:
        mine = [e for e in self.events() if e["node"] == node]
        delivered = {e["offset"] for e in mine if e["kind"] == "delivered"}
        return delivered - {o for e in mine if e["kind"] in ("acked", "ack-refused") for o in e["offsets"]}

    def owner(self) -> str | None:
        return ownership_info(self.queue).owner

    def wait_for_owner_holding_unacked(self, seconds: float = 30) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(QueueNotFoundError):  # no node has joined yet
                info = ownership_info(self.queue)
                if info.owner and info.in_flight and self._unacked(info.owner):
                    return info.owner
            time.sleep(0.02)
        raise AssertionError("no owner ever held unacked entries")

    def stop(self) -> None:
        for node in self.processes:
            Path(f"{self.logs / node}.log.stop").touch()
        for process in self.processes.values():
            process.join(30)

    def events(self) -> list[dict[str, Any]]:
        events = []
        for node in self.nodes:
            log = self.logs / f"{node}.log"
            if log.exists():
                events += [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]
        return sorted(events, key=lambda event: event["t"])


def _check_history(events: list[dict[str, Any]], produced: int) -> dict[str, int]:
    owners_by_epoch: dict[int, set[str]] = defaultdict(set)
    for event in events:
        if event["kind"] in ("take", "commit", "release"):
            owners_by_epoch[event["epoch"]].add(event["node"])
    assert all(len(nodes) == 1 for nodes in owners_by_epoch.values()), owners_by_epoch
    commits = [e["epoch"] for e in events if e["kind"] == "commit"]
    assert commits == sorted(commits), "an older epoch committed after a newer one"
    acked = Counter(o for e in events if e["kind"] == "acked" for o in e["offsets"])
    assert sorted(acked) == list(range(produced)), "an entry was never acked"
    assert max(acked.values()) == 1, "an entry was acked twice"
    # An event's time is when its node wrote it, which a pause can put long after the delivery
    # itself: a node stopped while logging a batch logs the rest once it resumes, after the new
    # owner has delivered and acked them. That late line carries the old epoch, whose acks are
    # refused; a delivery again is one under the epoch of the ack or a later one.
    acked_in: dict[int, int] = {}  # offset -> the epoch under which it was acked
    redeliveries = 0
    for event in events:
        if event["kind"] == "acked":
            acked_in.update(dict.fromkeys(event["offsets"], event["epoch"]))
        elif event["kind"] == "delivered":
            offset = event["offset"]
            assert offset not in acked_in or event["epoch"] < acked_in[offset], (
                f"acked offset {offset} delivered again"
            )
            redeliveries += event["count"] > 1
    figures = {"epochs": len(owners_by_epoch), "redeliveries": redeliveries, "acked": len(acked)}
    print(f"ownership history: {figures}")
    return figures


@pytest.mark.parametrize("appends", APPENDS)
def test_nodes_share_a_queue_one_owner_at_a_time(place: Place, tmp_path: Path, appends: str) -> None:
    # Nodes are judged gone after 5 s of silence here, not 1 s: a node starved of CPU for a second
    # (two cores, the suite beside it) is rightly passed over, which would break the order checked.
    cluster = Cluster(place, tmp_path, "abc", appends=appends, timing={**TIMING, "timeout": 5.0})
    try:
        cluster.produce(400)
        cluster.wait_until_acked(400)
        cluster.wait_until_every_node_owned()
    finally:
        cluster.stop()
    events = cluster.events()
    figures = _check_history(events, 400)
    takers = {e["node"] for e in events if e["kind"] == "take"}
    assert takers == {"a", "b", "c"}, f"not every node owned the queue: {takers}"
    assert figures["epochs"] >= 3
    takes = [e["node"] for e in events if e["kind"] == "take"]
    following = {"a": "b", "b": "c", "c": "a"}
    assert all(following[x] == y for x, y in itertools.pairwise(takes)), f"handover order broken: {takes}"


@pytest.mark.parametrize("appends", APPENDS)
def test_killed_owner_unacked_entries_are_redelivered(place: Place, tmp_path: Path, appends: str) -> None:
    cluster = Cluster(place, tmp_path, "abc", ack_delay=0.3, appends=appends)
    try:
        cluster.produce(100)
        victim = cluster.wait_for_owner_holding_unacked()
        os.kill(cluster.processes[victim].pid, signal.SIGKILL)  # type: ignore[arg-type]
        cluster.processes.pop(victim).join()
        cluster.wait_until_acked(100)
    finally:
        cluster.stop()
    events = cluster.events()
    figures = _check_history(events, 100)
    unacked_by_victim = {e["offset"] for e in events if e["kind"] == "delivered" and e["node"] == victim} - {
        o for e in events if e["kind"] == "acked" and e["node"] == victim for o in e["offsets"]
    }
    assert unacked_by_victim, "the owner was killed holding nothing"
    redelivered = {e["offset"] for e in events if e["kind"] == "delivered" and e["count"] > 1}
    assert unacked_by_victim <= redelivered
    assert figures["redeliveries"] >= len(unacked_by_victim)


def test_paused_owner_is_fenced_and_rejoins(place: Place, tmp_path: Path) -> None:
    cluster = Cluster(place, tmp_path, "ab", ack_delay=0.3)
    try:
        cluster.produce(60)
        paused = cluster.wait_for_owner_holding_unacked()
        process = cluster.processes[paused]
        os.kill(process.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        time.sleep(TIMING["timeout"] * 2.5)
        assert cluster.owner() not in (None, paused), "nobody took over from the paused owner"
        os.kill(process.pid, signal.SIGCONT)  # type: ignore[arg-type]
        cluster.produce(60)
        cluster.wait_until_acked(120)
    finally:
        cluster.stop()
    events = cluster.events()
    _check_history(events, 120)
    refused = [e for e in events if e["kind"] == "ack-refused" and e["node"] == paused]
    assert refused, "the paused owner's ack was not refused"
    after = [e for e in events if e["node"] == paused and e["t"] > refused[0]["t"]]
    assert any(e["kind"] == "take" for e in after) or process.is_alive(), "the paused node did not rejoin"


@pytest.mark.parametrize("appends", APPENDS)
def test_owner_needs_no_lock_and_few_round_trips(place: Place, appends: str) -> None:
    backend = place.connect()
    queue = Queue.create(backend, place.name("q"), capacity=400, slots_per_record=100, appends=appends)
    for start in range(0, 300, 100):  # a batch per buffer record: none spans records (see test_appends)
        queue.enqueue_batch(range(start, start + 100))
    with queue.consumer("solo", time_slice=60, timeout=60, poll_interval=30) as consumer:
        assert consumer.owning
        before = backend.commands
        assert [e.value for e in consumer.dequeue(1)] == [0]
        assert backend.commands - before == 2
        before = backend.commands
        messages = consumer.receive(10)  # offsets 1..10, in buffer record 0
        assert backend.commands - before == 2  # one batch get, one owner write; no lock
        before = backend.commands
        consumer.ack(messages)
        assert backend.commands - before == 1
        before = backend.commands
        messages = consumer.receive(100)  # offsets 11..110: buffer records 0 and 1, still one batch get
        assert backend.commands - before == 2
        assert queue.info().head_offset == 0  # producers' view of the head moves lazily...
        before = backend.commands
        consumer.ack(messages)
        assert backend.commands - before == 1 + 2  # ...here: a quarter of the capacity was acked
        assert queue.info().head_offset == ownership_info(queue).acked_offset == 111


def test_a_waiting_node_costs_two_commands_a_poll_while_the_owner_is_alive(place: Place) -> None:
    name = place.name("q")
    Queue.create(place.connect(), name, capacity=10)
    owner_side, waiting_side = place.connect(), place.connect()
    slow = {"time_slice": 60, "timeout": 60, "poll_interval": 30}  # each ticks once as it starts
    with Queue.open(owner_side, name).consumer("a", **slow) as owner:
        assert owner.owning
        with Queue.open(waiting_side, name).consumer("b", **slow) as waiting:
            assert not waiting.owning
            before = waiting_side.commands
            for _ in range(5):
                waiting._tick()  # what each poll does
            # its heartbeat and a read of the owner record: no scan of the nodes, no take tried
            assert waiting_side.commands - before == 2 * 5
            assert not waiting.owning and owner.owning


@pytest.mark.parametrize("appends", APPENDS)
def test_an_owner_reads_ahead_and_then_delivers_with_one_command_each(place: Place, appends: str) -> None:
    backend = place.connect()
    queue = Queue.create(backend, place.name("q"), capacity=200, slots_per_record=100, appends=appends)
    queue.enqueue_batch(range(100))
    with queue.consumer("solo", time_slice=60, timeout=60, poll_interval=30) as consumer:
        assert [e.value for e in consumer.dequeue(1)] == [0]  # its read takes the metadata record too
        before = backend.commands
        taken = [e.value for _ in range(2 * READ_AHEAD) for e in consumer.dequeue(1)]
        assert taken == list(range(1, 2 * READ_AHEAD + 1))
        # offsets 1..16 read at the first of them, and at the 17th (it took all it kept) twice as
        # many, 17..48: a commit each besides
        assert backend.commands - before == 2 + 2 * READ_AHEAD
        messages = consumer.receive(3)
        assert [m.value for m in messages] == [33, 34, 35]
        assert backend.commands - before == 2 + 2 * READ_AHEAD + 1  # read ahead too: a commit
        consumer.ack(messages)


def test_a_hole_ends_what_an_owner_reads_ahead_and_is_read_again(place: Place) -> None:
    backend = place.connect()
    queue = Queue.create(  # native: the test publishes a stored value as it is
        backend, place.name("q"), capacity=200, slots_per_record=100, appends="reserve", encoding="native"
    )
    queue.enqueue_batch(range(5))
    hole = queue.appender.reserve(1, overwrite=False)  # offset 5: reserved, not yet published
    queue.enqueue_batch([6, 7])
    with queue.consumer("solo", time_slice=60, timeout=60, poll_interval=30) as consumer:
        taken = [e.value for _ in range(5) for e in consumer.dequeue(1)]
        assert taken == list(range(5))  # 1..4 from one read, which found 5 unpublished
        assert consumer.dequeue(1) == []  # read again: still a hole, and not yet overdue
        queue.appender.publish(hole, [5], 0)
        assert [e.value for _ in range(3) for e in consumer.dequeue(1)] == [5, 6, 7]


def test_an_owner_never_delivers_a_slot_written_past_the_tail(place: Place) -> None:
    backend = place.connect()
    queue = Queue.create(  # native: the test writes a stored value as it is
        backend, place.name("q"), capacity=200, slots_per_record=100, appends="lock", encoding="native"
    )
    queue.enqueue_batch(range(3))
    # a stale writer's slot past the tail: written under a lock that was lost, never committed
    backend.operate(queue.keys.buffer(0), [ListSet(rec.SLOTS, 3, [3, "stale", 0])])
    with queue.consumer("solo", time_slice=60, timeout=60, poll_interval=30) as consumer:
        assert [e.value for _ in range(4) for e in consumer.dequeue(1)] == [0, 1, 2]
        queue.enqueue("three")  # overwrites slot 3 under the lock and commits tail 4
        assert [e.value for e in consumer.dequeue(1)] == ["three"]


def test_handover_follows_node_id_order_in_one_process(place: Place) -> None:
    backend = place.connect()
    queue = Queue.create(backend, place.name("q"), capacity=50, slots_per_record=5)
    events: list[OwnershipEvent] = []
    stop = threading.Event()

    def run(node: str) -> None:
        with queue.consumer(node, on_event=events.append, **TIMING) as consumer:  # type: ignore[arg-type]
            while not stop.is_set():
                consumer.receive(1, timeout=0.05)

    threads = [threading.Thread(target=run, args=(node,)) for node in ("n2", "n1", "n3")]
    for thread in threads:
        thread.start()
    time.sleep(3)
    stopping_ns = time.time_ns()
    stop.set()
    for thread in threads:
        thread.join()
    # While they stop, a leaving node is rightly skipped: judge the order before that.
    takes = [e.node_id for e in events if e.kind == "take" and e.at_ns < stopping_ns]
    assert len(takes) >= 4
    following = {"n1": "n2", "n2": "n3", "n3": "n1"}
    assert all(following[x] == y for x, y in itertools.pairwise(takes)), takes
    with pytest.raises(OwnershipLostError):
        stale = Queue.open(backend, queue.name).consumer("n1", **TIMING)  # type: ignore[arg-type]
        stale.ownership.commit(1, cursor=0, inflight={})


def test_handover_during_an_ownership_check_is_not_undone(place: Place) -> None:
    """A receive() hands over while the watcher is reading the owner record.

    The watcher must not act on what it read before the hand-over: it would
    report a second take of an epoch already passed on.
    """
    backend = place.connect()
    queue = Queue.create(backend, place.name("q"), capacity=50, slots_per_record=5)
    Ownership(queue, "n2", timeout=10).join()  # alive and interested for 10 s: the successor
    events: list[OwnershipEvent] = []
    consumer = queue.consumer("n1", time_slice=0.3, timeout=10, poll_interval=0.05, on_event=events.append)
    read = consumer.ownership.read
    started = time.monotonic()
    raced = threading.Event()

    def read_racing_a_receive() -> OwnerState:
        state = read()
        if time.monotonic() - started > 0.3 and not raced.is_set():
            raced.set()
            time.sleep(0.1)  # the slice is surely over: a receive() now hands over, this read in hand
            racer = threading.Thread(target=consumer.receive, kwargs={"timeout": 0})
            racer.start()
            racer.join(0.5)
        return state

    consumer.ownership.read = read_racing_a_receive  # type: ignore[method-assign]
    with consumer:
        assert raced.wait(5)
        time.sleep(1.5)  # the read waits up to 0.5 s on the racer; then a few more checks
        assert not consumer.owning
    assert [(e.kind, e.epoch) for e in events] == [("take", 1), ("release", 1)]
    assert ownership_info(queue).owner == "n2"


def test_deleting_a_queue_removes_the_shims_records(place: Place) -> None:
    backend = place.connect()
    name = place.name("q")
    queue = Queue.create(backend, name, capacity=10, slots_per_record=5)
    queue.enqueue_batch(range(5))
    with queue.consumer("n1", time_slice=60, timeout=60, poll_interval=30) as consumer:
        consumer.ack(consumer.receive(5))
    assert Queue.delete(backend, name)
    assert [backend.get(k) for k in (queue.keys.owner, queue.keys.nodes, queue.keys.node("n1"))] == [None] * 3
    again = Queue.create(backend, name, capacity=10, slots_per_record=5)
    again.enqueue("fresh")
    with again.consumer("n1", time_slice=60, timeout=60, poll_interval=30) as consumer:
        assert [m.value for m in consumer.receive(5)] == ["fresh"]  # not the old queue's cursor
