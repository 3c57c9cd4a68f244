"""The embedded store beside persist-queue, the disk queue Python users already reach for.

With the ``bench`` extra installed, ``large-queue bench`` on the embedded
store also times, in one run and on one disk, persist-queue's
``SQLiteQueue`` put and get and its ``SQLiteAckQueue`` get + ack against
this library's single enqueue, single dequeue and the cluster shim's
receive + ack, and prints each of ours as a ratio to its counterpart.

Both libraries keep their data in SQLite in write-ahead-log mode. They are
compared at each ``synchronous`` level this store offers, set alike on both
sides: ``normal`` (this store's default: survives the crash of any process)
and ``full`` (persist-queue's default, SQLite's own: also survives power
loss; every commit waits for the disk). persist-queue commits every put and
get (``auto_commit=True``); its ``synchronous`` is set on its connection,
which it does not otherwise expose. Both sides store the same entry, the one
a user's small event would be. The sides alternate in rounds, so that a slow
moment of the machine hits both alike.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from large_queue import errors
from large_queue._entries import DEFAULT_ENCODING
from large_queue.backends.embedded import EmbeddedBackend
from large_queue.queue import Queue

#: SQLite ``synchronous`` levels compared, each set alike on both sides
LEVELS = ("normal", "full")
#: rounds in which the two libraries alternate
ROUNDS = 3
#: the entry both sides store
ENTRY = {"o": 1, "v": "x" * 100}


@dataclass(frozen=True, kw_only=True)
class Pair:
    """One of our operations beside persist-queue's counterpart, at one durability level."""

    ours: str
    theirs: str
    synchronous: str
    our_rate: float  # operations per second
    their_rate: float

    @property
    def ratio(self) -> float:
        """Our rate over theirs."""
        return self.our_rate / self.their_rate if self.their_rate else 0.0

    def line(self) -> str:
        """One line of the report."""
        return (
            f"  synchronous={self.synchronous:6} {self.ours:32} {self.our_rate:>9,.0f} ops/s"
            f"  {self.theirs:28} {self.their_rate:>9,.0f} ops/s  = {self.ratio:.2f}x"
        )


def available() -> str | None:
    """persist-queue's version, or None when the ``bench`` extra is not installed."""
    try:
        return metadata.version("persist-queue")
    except metadata.PackageNotFoundError:
        return None


def compare(directory: str | Path, operations: int, encoding: str = DEFAULT_ENCODING) -> list[Pair]:
    """Time both libraries in fresh files under ``directory``, ``operations`` of each kind per level.

    Our queues store entries as ``encoding``.
    """
    pairs: list[Pair] = []
    per_round = max(1, operations // ROUNDS)
    count = per_round * ROUNDS
    for level in LEVELS:
        with tempfile.TemporaryDirectory(dir=directory, prefix=f"persist-{level}-") as place:
            spent = _alternating(Path(place), level, per_round, encoding)
        pairs += [
            Pair(
                ours=ours_name,
                theirs=theirs_name,
                synchronous=level,
                our_rate=count / spent[ours_key],
                their_rate=count / spent[theirs_key],
            )
            for ours_name, ours_key, theirs_name, theirs_key in (
                ("enqueue (single)", "enqueue", "SQLiteQueue.put", "put"),
                ("dequeue (single)", "dequeue", "SQLiteQueue.get", "get"),
                ("owner receive + ack (single)", "receive", "SQLiteAckQueue.get + ack", "ack get"),
            )
        ]
    return pairs


def _alternating(place: Path, level: str, per_round: int, encoding: str) -> dict[str, float]:
    """Seconds each operation took in all :data:`ROUNDS`, ``per_round`` calls a round."""
    import persistqueue

    spent: dict[str, float] = {}
    ours = EmbeddedBackend(place / "large_queue.db", synchronous=level)
    theirs = persistqueue.SQLiteQueue(str(place / "put-get"), auto_commit=True)
    acked = persistqueue.SQLiteAckQueue(str(place / "ack"), auto_commit=True)
    try:
        for connection in (theirs._conn, acked._conn):
            connection.execute(f"PRAGMA synchronous={level.upper()}")
        queue = Queue.create(ours, "compared", capacity=2 * per_round, encoding=encoding)
        shared = Queue.create(ours, "shared", capacity=2 * per_round, encoding=encoding)
        with shared.consumer("bench", time_slice=3600, timeout=3600, poll_interval=1800) as consumer:
            steps: list[tuple[str, Callable[[], Any]]] = [
                ("put", lambda: theirs.put(ENTRY)),
                ("enqueue", lambda: queue.enqueue(ENTRY)),
                ("get", lambda: _got(theirs.get(block=False))),
                ("dequeue", lambda: _got(queue.dequeue())),
                ("ack get", lambda: acked.ack(_got(acked.get(block=False)))),
                ("receive", lambda: consumer.ack(_got(consumer.receive(1)))),
            ]
            for _ in range(ROUNDS):
                shared.enqueue_batch([ENTRY] * per_round)
                for _ in range(per_round):
                    acked.put(ENTRY)
                for name, step in steps:
                    with _timed(spent, name):
                        for _ in range(per_round):
                            step()
    finally:
        theirs.close()
        acked.close()
        ours.close()
    return spent


def _got(value: Any) -> Any:
    """``value``, which must not be empty: a queue that came up empty would make the figure a lie."""
    if value is None or value == []:
        raise errors.LargeQueueError(
            "the comparison with persist-queue found a queue empty that should not be"
        )
    return value


@contextlib.contextmanager
def _timed(spent: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
