"""Several processes enqueue and dequeue one queue at once; every entry is accounted for."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

from large_queue import Queue, QueueFullError, connect
from tests.fix_backends import Place

PRODUCERS = 3
CONSUMERS = 2
PER_PRODUCER = 240


def _producer(url: str, name: str, producer: int) -> None:
    queue = Queue.open(connect(url), name)
    sequence = 0
    while sequence < PER_PRODUCER:
        batch = [
            {"p": producer, "n": n} for n in range(sequence, min(sequence + 1 + sequence % 5, PER_PRODUCER))
        ]
        try:
            if len(batch) == 1:
                queue.enqueue(batch[0])
            else:
                queue.enqueue_batch(batch)
            sequence += len(batch)
        except QueueFullError:
            time.sleep(0.001)


def _consumer(url: str, name: str, results: Any, done: Any) -> None:
    queue = Queue.open(connect(url), name)
    received: list[tuple[int, int, int]] = []
    turn = 0
    while True:
        turn += 1
        taken = queue.dequeue_batch(1 + turn % 7) if turn % 2 else [e for e in [queue.dequeue()] if e]
        received.extend((e.offset, e.value["p"], e.value["n"]) for e in taken)
        if not taken:
            if done.is_set() and queue.info().size == 0:
                break
            time.sleep(0.001)
    results.put((os.getpid(), received))


def test_producers_and_consumers_lose_and_duplicate_nothing(place: Place) -> None:
    name = place.name("shared")
    Queue.create(place.connect(), name, capacity=50, slots_per_record=7)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    done = context.Event()
    producers = [context.Process(target=_producer, args=(place.url, name, p)) for p in range(PRODUCERS)]
    consumers = [
        context.Process(target=_consumer, args=(place.url, name, results, done)) for _ in range(CONSUMERS)
    ]
    for process in producers + consumers:
        process.start()
    for process in producers:
        process.join(120)
        assert process.exitcode == 0
    done.set()
    received = [results.get(timeout=120) for _ in consumers]
    for process in consumers:
        process.join(30)
        assert process.exitcode == 0

    everything = sorted(item for _, items in received for item in items)
    offsets = [offset for offset, _, _ in everything]
    assert offsets == list(range(PRODUCERS * PER_PRODUCER)), "an offset was lost or delivered twice"
    for producer in range(PRODUCERS):
        sequence = [n for _, p, n in everything if p == producer]
        assert sequence == list(range(PER_PRODUCER)), f"producer {producer}: lost, duplicated or reordered"
    for _, items in received:
        assert [o for o, _, _ in items] == sorted(o for o, _, _ in items)  # each consumer sees FIFO order
