"""Publishing queue handles' counters to Prometheus (``pip install 'large-queue[metrics]'``).

Example::

    from prometheus_client import start_http_server
    from large_queue.metrics import publish

    publish(queue)               # large_queue_entries_enqueued_total{queue="events", namespace="test"} ...
    publish(producer_side, consumer_side)   # handles of one queue: one series, their counts added
    start_http_server(9108)

The counters are read from ``queue.stats()`` when Prometheus scrapes, so
publishing costs the queue's operations nothing.
"""

from __future__ import annotations

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
        "commands": "Store commands (round trips) the handle's operations sent",
        "lock_waits": "Lock acquire attempts refused because another holder had the lock",
        "locks_broken": "Acquires that took over a lock whose holder was silent past the TTL",
        "fencing_refusals": "Buffer writes refused because a later lock holder had written the record",
        "locks_lost": "Writes that found this handle's lock lost (broken past its TTL, or taken by a call"
        " with the same txn id): LockLostError, unless the library's own step let it go",
        "outcomes_unknown": "Operations that ended with OutcomeUnknownError (a commit timed out in doubt)",
        "timeouts_repeated": "Buffer commands that timed out and were sent again",
        "entries_overwritten": "Entries dropped by overwriting appends, or found overwritten by dequeues",
        "entries_expired": "Entries dropped from the head for being older than the queue's max_age",
        "entries_purged": "Entries dropped by this handle's purges",
    }
    return doc.get(name, name.replace("_", " ").capitalize())


def publish(*queues: Queue, registry: Any = None) -> QueueCollector:
    """Register a collector of ``queues``' counters with ``registry`` (default: Prometheus's)."""
    from prometheus_client import REGISTRY

    collector = QueueCollector(list(queues))
    (registry or REGISTRY).register(collector)
    return collector
