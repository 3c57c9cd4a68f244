"""What one queue handle has done and met: counters for operating a queue in production.

Every :class:`large_queue.Queue` keeps a :class:`Counters`; ``queue.stats()``
takes a :class:`QueueStats` snapshot of it. The counters are this process's
view through this handle (other processes keep their own, and a forked child
starts from zero); the gauges of the
queue itself (size, head, tail) are in ``queue.info()``.
:mod:`large_queue.metrics` publishes the snapshots to Prometheus.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from dataclasses import dataclass, fields


@dataclass(frozen=True, kw_only=True)
class QueueStats:
    """A snapshot of a queue handle's counters (all count up from when the handle was opened)."""

    enqueue_calls: int = 0  #: enqueue and enqueue_batch calls that committed
    entries_enqueued: int = 0
    dequeue_calls: int = 0  #: dequeue and dequeue_batch calls that returned (empty ones too)
    entries_dequeued: int = 0
    commands: int = 0  #: store commands (round trips) its enqueues, dequeues and their lock sent
    lock_waits: int = 0  #: lock acquire attempts refused because another holder had the lock
    locks_broken: int = 0  #: acquires that took over a lock whose holder had gone silent past the TTL
    fencing_refusals: int = 0  #: buffer writes refused because a later holder had written the record
    #: writes that found the lock lost (broken past its TTL, or taken by a call with the same txn id):
    #: each a LockLostError, unless the library's own step (a release, a head move) let it go
    locks_lost: int = 0
    outcomes_unknown: int = 0  #: operations ended with OutcomeUnknownError (a commit timed out in doubt)
    timeouts_repeated: int = 0  #: buffer commands that timed out and were sent again (idempotent)
    #: entries its overwriting appends dropped (a dequeue under way may still deliver some of those
    #: it had read; reserved offsets never published count too); dequeues that meet them only log it
    entries_overwritten: int = 0
    entries_expired: int = 0  #: entries dropped from the head for being older than the queue's max_age
    entries_purged: int = 0  #: entries this handle's purges dropped
    reservations: int = 0  #: offsets ranges reserved by appends without the lock (formats 3 and 4)
    holes_closed: int = 0  #: unpublished reservations this handle closed after the hole timeout
    reservations_closed: int = 0  #: appends refused because a reader had closed their reservation
    repeats_answered: int = 0  #: calls whose txn id had a receipt: answered from it, nothing done twice
    #: entries in the queue when this handle last took the lock, or took entries it read ahead (its backlog)
    size: int = 0


class Counters:
    """The mutable counters behind :class:`QueueStats`; safe to share between threads.

    Each thread adds to counters of its own (no lock on the way of an
    operation); a snapshot adds them up. The counters of threads that have
    ended are folded into one total, so a handle used by a thread per
    request keeps one set per live thread, not one per thread it ever saw.
    """

    def __init__(self) -> None:
        self._start()
        _ALL.add(self)

    def _start(self) -> None:
        """Every counter at zero (also in a forked child: see :func:`_start_again_in_a_child`)."""
        self._lock = threading.Lock()
        self._local = threading.local()
        self._threads: list[tuple[threading.Thread, dict[str, int]]] = []
        self._ended = dict.fromkeys(_COUNTED, 0)  # the counters of threads that have ended
        self._size = 0
        self.size_seen = 0  #: when ``size`` was last set: a count across every handle of the process

    def _mine(self) -> dict[str, int]:
        try:
            values: dict[str, int] = self._local.values
        except AttributeError:
            values = self._local.values = dict.fromkeys(_COUNTED, 0)
            with self._lock:
                self._fold_ended()
                self._threads.append((threading.current_thread(), values))
        return values

    def _fold_ended(self) -> None:
        """(holding the lock) Add the counters of threads that have ended to one total."""
        live = []
        for thread, values in self._threads:
            if thread.is_alive():
                live.append((thread, values))
            else:  # it adds nothing more
                for name, amount in values.items():
                    self._ended[name] += amount
        self._threads = live

    def add(self, *, size: int | None = None, **amounts: int) -> None:
        """Add to counters by name; ``size`` is set, not added."""
        if size is not None:
            self._size = size
            self.size_seen = next(_SIZES_SEEN)
        if amounts:
            mine = self._mine()
            for name, amount in amounts.items():
                mine[name] += amount

    def bump(self, name: str) -> None:
        """Add one to the counter ``name``: :meth:`add` for one counter, at a quarter of its cost
        (it runs at every command)."""
        try:
            mine: dict[str, int] = self._local.values
        except AttributeError:
            mine = self._mine()
        mine[name] += 1

    def snapshot(self) -> QueueStats:
        """The counters now."""
        with self._lock:
            self._fold_ended()
            totals = {name: self._ended[name] + sum(v[name] for _, v in self._threads) for name in _COUNTED}
        return QueueStats(**totals, size=self._size)


#: orders the sizes handles saw, so that of several handles of one queue the latest is told
_SIZES_SEEN = itertools.count(1)

#: the counters of every handle of the process
_ALL: weakref.WeakSet[Counters] = weakref.WeakSet()


def _start_again_in_a_child() -> None:
    """A forked child counts from zero: what its handles did is its own, and a process that forks
    workers would otherwise have its counts published again by each of them. (Its lock is made
    anew too: a thread of the parent may have held it, a scrape say, at the fork.)"""
    for counters in list(_ALL):
        counters._start()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_start_again_in_a_child)

_COUNTED = tuple(field.name for field in fields(QueueStats) if field.name != "size")


def combined(snapshots: list[QueueStats]) -> QueueStats:
    """The counters of several handles added up (``size``: the largest seen)."""
    values = {
        field.name: (max if field.name == "size" else sum)(getattr(s, field.name) for s in snapshots)
        for field in fields(QueueStats)
    }
    return QueueStats(**values) if snapshots else QueueStats()
