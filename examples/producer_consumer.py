"""Producers and consumers in separate processes sharing one queue.

Each producer numbers its messages; each consumer records what it got. At the
end every message must have been consumed exactly once, in each producer's
order. Runs on LARGE_QUEUE_URL, else on a temporary embedded store.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
from typing import Any

from large_queue import Queue, QueueFullError, connect

PRODUCERS, CONSUMERS, MESSAGES = 2, 2, 3000


def produce(url: str, producer: int) -> None:
    queue = Queue.open(connect(url), "orders")
    sent = 0
    while sent < MESSAGES:
        batch = [{"producer": producer, "seq": n} for n in range(sent, min(sent + 10, MESSAGES))]
        try:
            queue.enqueue_batch(batch)
            sent += len(batch)
        except QueueFullError:
            time.sleep(0.005)  # consumers are behind: wait for room


def consume(url: str, results: Any, producers_done: Any) -> None:
    queue = Queue.open(connect(url), "orders")
    got = []
    while True:
        batch = queue.dequeue_batch(10)
        got.extend((entry.value["producer"], entry.value["seq"]) for entry in batch)
        if not batch:
            if producers_done.is_set() and queue.info().size == 0:
                break
            time.sleep(0.002)
    results.put(got)


def main() -> int:
    with tempfile.TemporaryDirectory() as directory:
        url = os.environ.get("LARGE_QUEUE_URL") or f"embedded://{directory}/orders.db"
        store = connect(url)
        if "orders" in Queue.names(store):  # someone's queue: this example makes and deletes its own
            print(
                f"producer_consumer: a queue 'orders' exists on {url}; delete it (large-queue delete orders)"
            )
            return 1
        Queue.create(store, "orders", capacity=200, slots_per_record=50)
        context = multiprocessing.get_context("spawn")
        results, done = context.Queue(), context.Event()
        producers = [context.Process(target=produce, args=(url, p)) for p in range(PRODUCERS)]
        consumers = [context.Process(target=consume, args=(url, results, done)) for _ in range(CONSUMERS)]
        started = time.perf_counter()
        for process in producers + consumers:
            process.start()
        for process in producers:
            process.join()
        done.set()
        received = [results.get() for _ in consumers]
        for process in consumers:
            process.join()
        elapsed = time.perf_counter() - started
        Queue.delete(store, "orders")

    everything = [item for got in received for item in got]
    exact = sorted(everything) == sorted((p, n) for p in range(PRODUCERS) for n in range(MESSAGES))
    ordered = all(
        [n for p, n in got if p == producer] == sorted(n for p, n in got if p == producer)
        for got in received
        for producer in range(PRODUCERS)
    )
    print(f"{PRODUCERS} producers x {MESSAGES} messages, {CONSUMERS} consumers, {elapsed:.2f} s")
    print(f"consumed per consumer: {[len(got) for got in received]}")
    print(f"every message exactly once: {exact}; each producer's order kept: {ordered}")
    return 0 if exact and ordered else 1


if __name__ == "__main__":
    sys.exit(main())
