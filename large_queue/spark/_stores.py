"""Connections of the Spark data source: one per worker process and URL, reused by its tasks.

Nothing unpicklable travels with a reader or a writer: each process opens
its own connection the first time a task there needs it.
"""

from __future__ import annotations

import os

from large_queue.backends import Backend, connect
from large_queue.queue import Queue
from large_queue.spark._options import SourceOptions

_stores: dict[tuple[int, str | None], Backend] = {}


def store(url: str | None, *, create: bool = False) -> Backend:
    """One connection per worker process and URL.

    An embedded store's file is made only with ``create`` (a write with
    ``createIfMissing``): a mistyped path is an error, not a new empty store.
    """
    key = (os.getpid(), url)
    if key not in _stores:
        _stores[key] = connect(url, create=create)
    return _stores[key]


def open_queue(options: SourceOptions) -> Queue:
    """The queue the options name, on this process's connection."""
    return Queue.open(
        store(options.url, create=options.create_if_missing), options.queue, namespace=options.namespace
    )


__all__ = ["open_queue", "store"]
