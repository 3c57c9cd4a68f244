"""What receipts cost: enqueues with and without a txn id, and the metadata record with a full log.

For each way of appending, on a fresh queue: single enqueues without a txn
id and with a new one each (so each leaves a receipt), in interleaved rounds
so that a slow moment of the machine hits both sides, then the same once the
log is full (``receipts`` of them, after twice as many calls: the bound holds
under load), with the metadata record's size and the rate of reading it
(what every waiting poll and ``info()`` does) beside an empty log's.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import msgspec

from large_queue import _records as rec
from large_queue.backends import Backend
from large_queue.queue import Queue

ROUNDS = 4


@dataclass(frozen=True, kw_only=True)
class ReceiptCost:
    """One append mode's figures."""

    appends: str
    keep: int
    with_txn: float  #: enqueue rate with a txn id / without, log filling
    with_txn_full: float  #: the same with the log full
    round_trips_plain: float
    round_trips_txn: float
    log_entries: int  #: receipts in the log after ``calls`` calls with txn ids
    calls: int
    metadata_bytes_empty: int
    metadata_bytes_full: int
    metadata_read_full: float  #: metadata reads/s with the log full / with none

    def line(self) -> str:
        """The figures as the bench prints them."""
        return (
            f"receipts, {self.appends}: enqueue with a txn id {self.with_txn:.2f}x of without"
            f" ({self.round_trips_txn:.2f} vs {self.round_trips_plain:.2f} round trips),"
            f" {self.with_txn_full:.2f}x with the log full; log {self.log_entries:,} of {self.keep:,}"
            f" after {self.calls:,} calls;"
            f" metadata record {self.metadata_bytes_empty:,} -> {self.metadata_bytes_full:,} bytes,"
            f" read at {self.metadata_read_full:.2f}x"
        )


def _paired(queue: Queue, calls: int) -> tuple[float, float, float]:
    """(rate with txn / without, round trips without, with), over interleaved rounds."""
    plain = txn = 0.0
    commands = {"plain": 0, "txn": 0}
    per_round = max(1, calls // ROUNDS)
    for _ in range(ROUNDS):
        before = queue.stats().commands
        started = time.perf_counter()
        for index in range(per_round):
            queue.enqueue({"n": index})
        plain += time.perf_counter() - started
        commands["plain"] += queue.stats().commands - before
        before = queue.stats().commands
        started = time.perf_counter()
        for index in range(per_round):
            queue.enqueue({"n": index}, txn_id=str(uuid.uuid4()))
        txn += time.perf_counter() - started
        commands["txn"] += queue.stats().commands - before
        queue.dequeue_batch(2 * per_round)
    total = per_round * ROUNDS
    return plain / txn, commands["plain"] / total, commands["txn"] / total


def _metadata_bytes(backend: Backend, queue: Queue) -> int:
    record = backend.get(queue.keys.metadata)
    return len(msgspec.msgpack.encode(record.bins if record else {}))


def _metadata_reads(queue: Queue, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        queue.current_metadata()
    return calls / (time.perf_counter() - started)


def receipt_costs(backend: Backend, operations: int, modes: tuple[str, ...]) -> list[ReceiptCost]:
    """Measure each append mode on a fresh queue (deleted after)."""
    costs = []
    for appends in modes:
        name = f"bench-receipts-{uuid.uuid4().hex[:8]}"
        queue = Queue.create(
            backend, name, capacity=4 * operations + 4000, slots_per_record=100, appends=appends
        )
        try:
            empty_bytes = _metadata_bytes(backend, queue)
            reads_empty = _metadata_reads(queue, operations)
            ratio, plain_trips, txn_trips = _paired(queue, operations)
            calls = 2 * queue.receipts.keep
            for index in range(calls):
                queue.enqueue(index, txn_id=str(uuid.uuid4()))
                if index % 1000 == 999:
                    queue.dequeue_batch(1000)
            log = backend.get(queue.keys.metadata).bins.get(rec.RECEIPTS) or {}  # type: ignore[union-attr]
            full_ratio, _, _ = _paired(queue, operations)
            costs.append(
                ReceiptCost(
                    appends=appends,
                    keep=queue.receipts.keep,
                    with_txn=ratio,
                    with_txn_full=full_ratio,
                    round_trips_plain=plain_trips,
                    round_trips_txn=txn_trips,
                    log_entries=len(log),
                    calls=calls + 2 * operations,
                    metadata_bytes_empty=empty_bytes,
                    metadata_bytes_full=_metadata_bytes(backend, queue),
                    metadata_read_full=_metadata_reads(queue, operations) / reads_empty,
                )
            )
        finally:
            Queue.delete(backend, name)
    return costs
