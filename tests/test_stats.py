"""Each queue handle counts what it did and met; the counters reach Prometheus."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from large_queue import LockLostError, LockNotAcquiredError, LockPolicy, Queue, QueueStats, _locked
from large_queue import _records as rec
from large_queue._stats import Counters
from large_queue.backends import ListSetRange
from large_queue.backends._delegating import Delegating
from tests.fix_backends import Place, Store

TTL = 0.3


def test_operations_entries_and_commands_are_counted(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    before = store.backend.commands
    for value in range(3):
        queue.enqueue(value)
    queue.enqueue_batch(range(5))
    queue.dequeue()
    queue.dequeue_batch(4)
    queue.get(5)
    queue.info()
    stats = queue.stats()
    assert (stats.enqueue_calls, stats.entries_enqueued, stats.dequeue_calls, stats.entries_dequeued) == (
        4,
        8,
        2,
        5,
    )
    assert stats.commands == store.backend.commands - before  # every command this handle sent, and only those
    assert stats.size == 8 - 1  # as the last dequeue_batch saw it when it took the lock
    assert (stats.lock_waits, stats.locks_broken, stats.locks_lost, stats.fencing_refusals) == (0, 0, 0, 0)


def test_a_lock_broken_by_a_call_with_its_holders_txn_id_is_counted_and_logged(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The reference API names every call's holder by one txn id: a restarted client breaks its dead
    predecessor's expired lock, which is a break like any other (not a take-back of its own)."""
    queue = store.new_queue(appends="lock", capacity=6, slots_per_record=3, lock_ttl=TTL)
    queue.lock.try_acquire("1")  # a client dies holding the lock
    store.advance(TTL * 2)
    restarted = Queue.open(store.backend, queue.name)
    with caplog.at_level("WARNING", logger="large_queue"):
        restarted._enqueue_as("x", "1", False)  # as LargeQueue.enqueue(entry, txn_id=1) does
    assert restarted.stats().locks_broken == 1
    assert "took over the lock from '1', silent past the lock TTL" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="large_queue"):
        restarted._enqueue_as("y", "1", False)  # the lock was free: nothing broken
    assert restarted.stats().locks_broken == 1 and "took over" not in caplog.text


def test_waits_breaks_and_fencing_refusals_are_counted(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=6, slots_per_record=3, lock_ttl=TTL)
    waiting = Queue.open(
        store.backend, queue.name, lock_policy=LockPolicy(acquire_timeout=0.05, max_wait=0.01)
    )
    stale = queue.lock.try_acquire("A")  # A holds the lock...
    with pytest.raises(LockNotAcquiredError):
        waiting.enqueue("blocked")
    assert waiting.stats().lock_waits >= 1
    store.advance(TTL * 2)  # ...and goes silent past the TTL
    waiting.enqueue("after A", txn_id="B")  # B breaks A's lock and writes record 0
    assert waiting.stats().locks_broken == 1
    with pytest.raises(LockLostError):
        _locked.fenced_command(queue, stale, 0, [ListSetRange(rec.SLOTS, 0, [[0, "A's", 0]])], read=None)
    assert (queue.stats().fencing_refusals, queue.stats().locks_lost) == (1, 1)
    with pytest.raises(LockLostError):
        queue.lock.commit(stale, tail=1)
    assert queue.stats().locks_lost == 2


def test_counters_are_published_to_prometheus(store: Store) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from large_queue.metrics import publish

    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.enqueue_batch(["a", "b", "c"])
    registry = CollectorRegistry()
    publish(queue, registry=registry)
    text = generate_latest(registry).decode()
    labels = f'{{namespace="test",queue="{queue.name}"}}'
    assert f"large_queue_entries_enqueued_total{labels} 3.0" in text
    assert f"large_queue_size{labels} 0.0" in text  # a gauge: the backlog the last operation saw
    assert f"large_queue_commands_total{labels} {float(queue.stats().commands)}" in text
    assert set(QueueStats.__dataclass_fields__) == {
        line.split("{")[0].removeprefix("large_queue_").removesuffix("_total")
        for line in text.splitlines()
        if line.startswith("large_queue_") and "_created" not in line
    }


def test_handles_of_one_queue_are_one_series_in_prometheus(store: Store) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from large_queue.metrics import publish

    producing = store.new_queue(capacity=6, slots_per_record=3)
    consuming = Queue.open(store.backend, producing.name)
    other = store.new_queue(capacity=6, slots_per_record=3)
    producing.enqueue_batch(["a", "b", "c"])
    consuming.dequeue()
    other.enqueue("x")
    registry = CollectorRegistry()
    publish(producing, consuming, other, producing, registry=registry)  # the same handle twice counts once
    samples = [
        line for line in generate_latest(registry).decode().splitlines() if line.startswith("large_queue_")
    ]
    enqueued = [line for line in samples if line.startswith("large_queue_entries_enqueued_total")]
    assert sorted(enqueued) == sorted(
        [
            f'large_queue_entries_enqueued_total{{namespace="test",queue="{producing.name}"}} 3.0',
            f'large_queue_entries_enqueued_total{{namespace="test",queue="{other.name}"}} 1.0',
        ]
    )
    assert f'large_queue_entries_dequeued_total{{namespace="test",queue="{producing.name}"}} 1.0' in samples
    labels = [line.split(" ")[0] for line in samples]
    assert len(labels) == len(set(labels))  # no series twice


def test_queues_published_by_later_calls_join_the_same_series_and_can_leave(store: Store) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as open_metrics
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from large_queue.metrics import publish, unpublish

    first, second = store.new_queue(capacity=6), store.new_queue(capacity=6)
    again = Queue.open(store.backend, first.name)
    for queue in (first, second, again):
        queue.enqueue("x")
    registry = CollectorRegistry(auto_describe=True)  # as Prometheus's own registry is
    assert publish(first, registry=registry) is publish(second, again, registry=registry)
    families = list(text_string_to_metric_families(open_metrics(registry).decode()))  # one of each name
    assert len({family.name for family in families}) == len(families)
    enqueued = {
        sample.labels["queue"]: sample.value
        for family in families
        if family.name == "large_queue_entries_enqueued"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert enqueued == {first.name: 2, second.name: 1}  # the handles of one queue added up
    unpublish(second, registry=registry)
    assert second.name not in generate_latest(registry).decode()
    assert first.name in generate_latest(registry).decode()


def test_the_size_of_handles_of_one_queue_is_the_latest_any_saw(store: Store) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from large_queue.metrics import publish

    producing = store.new_queue(capacity=6, slots_per_record=3, appends="lock")
    consuming = Queue.open(store.backend, producing.name)
    for n in range(4):
        producing.enqueue(n)  # under the lock: it sees the size
    assert len(consuming.dequeue_batch(10)) == 4
    assert consuming.dequeue() is None and consuming.stats().size == 0  # the backlog its lock saw
    assert producing.stats().size > 0  # its view is older: the queue is empty now
    registry = CollectorRegistry()
    publish(producing, consuming, registry=registry)
    text = generate_latest(registry).decode()
    assert f'large_queue_size{{namespace="test",queue="{producing.name}"}} 0.0' in text


def test_the_stats_command_shows_backlog_and_consumer_lag(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    from large_queue.cli import main

    name = place.name("q")
    queue = Queue.create(place.connect(), name, capacity=10, slots_per_record=5)
    queue.enqueue_batch(range(6))
    with queue.consumer("n1", time_slice=60, timeout=60, poll_interval=30) as consumer:
        consumer.ack(consumer.receive(2))
        consumer.receive(1)  # delivered, not acked
        assert main(["--url", place.url, "stats", name]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["size"], printed["free"], printed["tail_offset"]) == (4, 6, 6)  # the acked 2 freed
    assert printed["consumers"]["not_delivered"] == 3 and printed["consumers"]["delivered_not_acked"] == 1


def test_counters_of_threads_that_ended_are_kept_in_one_total() -> None:
    """A handle used by a thread per request keeps counters per live thread, not per thread it saw."""
    counters = Counters()

    def enqueue_once() -> None:
        counters.add(enqueue_calls=1, entries_enqueued=2)

    for _ in range(300):
        thread = threading.Thread(target=enqueue_once)
        thread.start()
        thread.join()
    enqueue_once()  # this thread's own
    stats = counters.snapshot()
    assert (stats.enqueue_calls, stats.entries_enqueued) == (301, 602)
    assert len(counters._threads) <= 2


def test_stats_never_shows_a_negative_backlog_when_consumers_move_on_while_it_reads(place: Place) -> None:
    """``info()`` is read first, the shim's records after: a busy consumer may be past the tail it read."""
    from large_queue.cli import _stored_stats

    queue = Queue.create(place.connect(), place.name("q"), capacity=100)
    with queue.consumer("n1", time_slice=60, timeout=60) as consumer:
        consumer.ack(consumer.receive(1, timeout=0.1) or [])
        info = queue.info()
        queue.enqueue_batch(range(5))
        consumer.ack(consumer.receive(5, timeout=1))
        assert _stored_stats(queue, info)["consumers"]["not_delivered"] == 0  # was -5


def test_entries_a_dequeue_under_way_finds_overwritten_are_counted_once(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """An overwriting producer drops 2 entries while a consumer holds the lock and then reads their
    slots: the producer counts them; the consumer only says so (the two handles publish as one series)."""
    if store.kind == "embedded":
        pytest.skip("the embedded store runs the acquire and the reads in one transaction: no append between")

    class BeforeBufferReads(Delegating):
        hook: Callable[[], object] | None = None

        def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
            if self.hook and method == "operate" and args[0].user_key.startswith(rec.BUFFER_KEY_PREFIX):
                hook, self.hook = self.hook, None
                hook()
            return super().relay(method, *args, **kwargs)

    producer = store.new_queue(capacity=6, slots_per_record=6)
    producer.enqueue_batch(range(6))
    hooked = BeforeBufferReads(store.backend)
    consumer = Queue.open(hooked, producer.name)
    consumer.head_guess.read = lambda n: None  # type: ignore[method-assign]  (no read beside the acquire)
    hooked.hook = lambda: producer.enqueue_batch(["x", "y"], overwrite_if_full=True)
    with caplog.at_level("WARNING", logger="large_queue"):
        assert [entry.offset for entry in consumer.dequeue_batch(6)] == [2, 3, 4, 5]
    assert "2 entries were overwritten before they were dequeued" in caplog.text
    assert (producer.stats().entries_overwritten, consumer.stats().entries_overwritten) == (2, 0)


def test_a_forked_childs_handle_counts_from_zero(store: Store) -> None:
    """A server that forks workers after opening its queue: each worker publishes its own counts."""
    import multiprocessing

    queue = store.new_queue(capacity=6)
    queue.enqueue_batch([1, 2, 3])
    assert queue.stats().entries_enqueued == 3
    results = multiprocessing.get_context("fork").SimpleQueue()

    def child() -> None:
        before = queue.stats().entries_enqueued
        queue.enqueue(4)
        results.put((before, queue.stats().entries_enqueued))

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert results.get() == (0, 1)
    assert queue.stats().entries_enqueued == 3  # the parent's own, untouched
