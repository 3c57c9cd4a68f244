"""Publishing queue handles' counters to Prometheus (``pip install 'large-queue[metrics]'``).

Example::

    from prometheus_client import start_http_server
    from large_queue.metrics import publish

    publish(queue)               # large_queue_entries_enqueued_total{queue="events", namespace="test"} ...
    publish(producer_side, consumer_side)   # handles of one queue: one series, their counts added
    publish(orders)              # later calls add to the same collector: one series per queue still
    start_http_server(9108)

The counters are read from ``queue.stats()`` when Prometheus scrapes, so
publishing costs the queue's operations nothing. A published handle is
kept (and counted) until :func:`unpublish`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from dataclasses import fields, replace
from typing import Any

from large_queue._stats import QueueStats, combined
from large_queue.queue import Queue

#: the one gauge among the counters (the others only grow)
_GAUGES = ("size",)


class QueueCollector:
    """A Prometheus collector of the counters of some queue handles."""

    def __init__(self, queues: list[Queue]) -> None:
        self.queues = queues
        self._changing = threading.Lock()

    def add(self, queues: tuple[Queue, ...]) -> None:
        """Publish ``queues`` too (a handle already published counts once)."""
        with self._changing:
            self.queues = [*self.queues, *queues]  # replaced whole: a scrape under way reads one list

    def remove(self, queues: tuple[Queue, ...]) -> None:
        """Stop publishing ``queues``."""
        gone = {id(queue) for queue in queues}
        with self._changing:
            self.queues = [queue for queue in self.queues if id(queue) not in gone]

    def collect(self) -> Iterator[Any]:
        """One metric family per counter, a sample per queue.

        Handles of one queue (a producer's and a consumer's, say) are one
        series, their counters added up, and ``size`` the one seen last by
        any of them: two samples of one series would leave Prometheus to keep
        either. A handle published twice counts once.
        """
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        handles: dict[tuple[str, str], dict[int, Queue]] = {}
        for queue in self.queues:
            handles.setdefault((queue.name, queue.keys.metadata_namespace), {})[id(queue)] = queue
        snapshots = {}
        for labels, same in handles.items():
            seen = sorted(same.values(), key=lambda queue: queue.counters.size_seen)
            each = [queue.stats() for queue in seen]  # one snapshot a handle; the last saw the size last
            snapshots[labels] = replace(combined(each), size=each[-1].size)
        for field in fields(QueueStats):
            name = f"large_queue_{field.name}"
            family = (GaugeMetricFamily if field.name in _GAUGES else CounterMetricFamily)(
                name, _description(field.name), labels=["queue", "namespace"]
            )
            for labels, stats in snapshots.items():
                family.add_metric(list(labels), getattr(stats, field.name))
            yield family


def _description(name: str) -> str:
    doc = {
        "size": "Entries in the queue when one of its handles last looked (the latest look)",
        "commands": "Store commands (round trips) the handle's enqueues, dequeues and their lock sent",
        "lock_waits": "Lock acquire attempts refused because another holder had the lock",
        "locks_broken": "Acquires that took over a lock whose holder was silent past the TTL",
        "fencing_refusals": "Buffer writes refused because a later lock holder had written the record",
        "locks_lost": "Writes that found this handle's lock lost (broken past its TTL, or taken by a call"
        " with the same txn id): LockLostError, unless the library's own step let it go",
        "outcomes_unknown": "Operations that ended with OutcomeUnknownError (a commit or publish timed out"
        " in doubt)",
        "timeouts_repeated": "Buffer commands that timed out and were sent again",
        "entries_overwritten": "Entries (and reserved offsets never published) dropped by overwriting"
        " appends",
        "entries_expired": "Entries dropped from the head for being older than the queue's max_age"
        " (each consumer group drops them from its own view, and counts them)",
        "entries_purged": "Entries (and reserved offsets not yet published) dropped by this handle's purges",
    }
    return doc.get(name, name.replace("_", " ").capitalize())


#: the one collector of each registry: a second would put out every family again, which
#: Prometheus's registry refuses and its parsers reject
_COLLECTORS: weakref.WeakKeyDictionary[Any, QueueCollector] = weakref.WeakKeyDictionary()
_REGISTERING = threading.Lock()


def publish(*queues: Queue, registry: Any = None) -> QueueCollector:
    """Publish ``queues``' counters in ``registry`` (default: Prometheus's); returns its collector.

    Each registry has one collector of the library's, made at the first
    call and added to by later ones, so queues opened later can be
    published as they come.
    """
    from prometheus_client import REGISTRY

    target = REGISTRY if registry is None else registry
    with _REGISTERING:
        collector = _COLLECTORS.get(target)
        if collector is None:
            collector = QueueCollector(list(queues))
            target.register(collector)
            _COLLECTORS[target] = collector
        else:
            collector.add(queues)
    return collector


def unpublish(*queues: Queue, registry: Any = None) -> None:
    """Stop publishing ``queues`` in ``registry`` (default: Prometheus's); their series leave it."""
    from prometheus_client import REGISTRY

    collector = _COLLECTORS.get(REGISTRY if registry is None else registry)
    if collector is not None:
        collector.remove(queues)
