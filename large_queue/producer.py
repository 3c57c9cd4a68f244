"""A producer in the style of Kafka's: many threads send single entries, one thread appends them in batches.

An append costs the same round trips for one entry as for a whole buffer
record of them (a reservation, then one publish per buffer record touched),
so a program whose threads each enqueue one entry at a time spends its time
waiting on the store. A :class:`Producer` takes those single entries, lets
them wait a little, and appends them together::

    with queue.producer(linger=0.005) as producer:
        futures = [producer.send({"n": n}) for n in range(1000)]
    offsets = [future.result() for future in futures]

``send`` checks the entry at once (a bad entry raises in the caller and is
never queued) and returns an :class:`OffsetFuture` (``result``,
``exception``, ``done``, ``add_done_callback``, as a
:class:`concurrent.futures.Future` has them; it cannot be cancelled). The
futures of one batch share its outcome, so a future costs a small object,
not a lock of its own: a sent entry costs about what checking it costs. One
background thread takes the waiting entries, in the order they were sent,
into one ``queue.enqueue_batch`` call as soon as ``max_batch`` of them wait,
``linger`` seconds after the oldest of them was sent, or at once when
someone flushes or closes. Batches are appended one after the other, so the
entries are in the queue in the order ``send`` accepted them: each thread's
entries keep its call order. A batch is all or nothing, like
``enqueue_batch``: its futures all resolve to their offsets, or all to the
error that failed it (``OutcomeUnknownError`` says, as it does for
``enqueue_batch``, that the batch may be in the queue). Nothing is retried
but a batch whose reservation a reader closed (``ReservationClosedError``:
nothing of it is visible, and appending it again takes new offsets): it is
sent again, at most :data:`RESERVATION_ATTEMPTS` times in all.

The failure story, as a timeline (a queue of capacity 1,000 holding 990)::

    t=0.000  threads A and B send 8 entries each; each gets its futures.
    t=0.005  the oldest has waited ``linger``: the producer thread appends
             all 16 in one enqueue_batch. The reservation is refused (10
             free slots): QueueFullError, nothing written.
    t=0.005  the 16 futures fail with that QueueFullError; A and B see it in
             future.result() or exception() and decide (wait, drop, retry).
    t=0.006  A sends 1 more entry: it waits for a batch of its own, which
             fits (offset 990), whatever happened to the batch before.

A batch is reserved whole, so under load, when batches fill to
``max_batch``, a queue with fewer free slots than that refuses the whole
batch although part of it would fit: a producer for a queue that runs
nearly full is better made with a smaller ``max_batch``.

Back-pressure: when ``max_pending`` entries are sent and not yet resolved,
``send`` blocks until a batch resolves (there is no send timeout: a batch
resolves, with offsets or with an error, within the store's own timeouts).
Futures' callbacks run in the producer's thread: they must not block, nor
send to a full producer, flush it or close it. An entry is written as it is
when its batch goes, so do not change it after sending it. Close the
producer (or use it as a context manager): if the program's main thread
ends first, the producer writes what was sent, then refuses any further send.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from large_queue import errors
from large_queue._entries import check_entry
from large_queue._lifecycle import positive_int

if TYPE_CHECKING:
    from large_queue.queue import Queue

#: appends of one batch, in all, while readers keep closing its reservation
RESERVATION_ATTEMPTS = 3
#: entries of one batch at most, unless the producer is made with another ``max_batch``. Under load
#: a batch fills to it; larger batches spread a reservation's and a publish's round trips over more
#: entries (8 threads sending through one producer: about 25% more entries/s at 2,000 than at 500,
#: on Aerospike and on the embedded store)
DEFAULT_MAX_BATCH = 2000
#: held while a batch is resolved or a callback is added to one, so that each callback runs once
_RESOLVING = threading.Lock()
#: seconds between the idle producer thread's looks at whether the main thread has ended
_IDLE_CHECK_SECONDS = 0.25


class _Batch:
    """Entries sent together, and the outcome they share: their offsets, or the error that failed them."""

    __slots__ = ("born", "callbacks", "error", "offsets", "resolved", "values")

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.born = 0.0  # monotonic time of its first entry
        self.resolved = threading.Event()
        self.offsets: range | None = None
        self.error: BaseException | None = None
        self.callbacks: list[Callable[[], object]] = []


class OffsetFuture:
    """The offset one sent entry gets, once its batch is appended (or the error that failed the batch)."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self._batch = batch
        self._index = index

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._batch.error else "done")
        return f"<OffsetFuture {state}>"

    def done(self) -> bool:
        """True once the entry's batch is appended or has failed."""
        return self._batch.resolved.is_set()

    def result(self, timeout: float | None = None) -> int:
        """The entry's offset; raises the batch's error, or ``TimeoutError`` after ``timeout`` seconds."""
        batch = self._batch
        error = batch.error if batch.resolved.is_set() else self.exception(timeout)
        if error is not None:
            raise error
        assert batch.offsets is not None
        return batch.offsets[self._index]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error that failed the entry's batch, or None; ``TimeoutError`` after ``timeout`` seconds."""
        if not self._batch.resolved.wait(timeout):
            raise TimeoutError(f"the entry was not appended within {timeout} s")
        return self._batch.error

    def add_done_callback(self, callback: Callable[[OffsetFuture], object]) -> None:
        """Call ``callback(future)`` when the entry's batch is resolved (at once if it is)."""
        with _RESOLVING:
            if not self._batch.resolved.is_set():
                self._batch.callbacks.append(lambda: callback(self))  # the producer thread calls it
                return
        callback(self)


class Producer:
    """Sends single entries to a queue in batches, from any number of threads (see the module).

    Made by :meth:`large_queue.Queue.producer`. ``max_batch`` is at most the
    queue's capacity. Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        queue: Queue,
        *,
        linger: float = 0.005,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_pending: int = 10_000,
        overwrite_if_full: bool = False,
    ) -> None:
        if type(linger) not in (int, float) or not 0 <= linger < float("inf"):
            raise errors.InvalidArgumentError(f"linger must be a number of seconds >= 0, got {linger!r}")
        self.queue = queue
        self.linger = float(linger)
        self.max_batch = min(positive_int("max_batch", max_batch), queue.capacity)
        self.max_pending = positive_int("max_pending", max_pending)
        self.overwrite_if_full = bool(overwrite_if_full)
        self._entry_limit = queue.max_entry_bytes  # fixed for the queue handle's life
        self._encoding = queue.encoding
        lock = self._lock = threading.Lock()  # taken directly where no one waits (a send's common path)
        self._work = threading.Condition(lock)  # the producer thread waits for entries
        self._room = threading.Condition(lock)  # senders wait for fewer than max_pending unresolved
        self._done = threading.Condition(lock)  # flushers wait for their entries to resolve
        self._open = _Batch()  # where sends go until the producer thread takes it
        self._full: deque[_Batch] = deque()  # batches of max_batch entries, in the order they filled
        self._sent = 0  # entries accepted by send, ever
        self._resolved = 0  # of those, whose futures are resolved (in the order sent)
        self._flush_upto = 0  # entries before this one go at once, without lingering
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"large_queue producer {queue.name}")
        self._thread.start()

    def __repr__(self) -> str:
        return f"Producer({self.queue!r}, linger={self.linger}, max_batch={self.max_batch})"

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def send(self, value: Any) -> OffsetFuture:
        """Queue ``value`` for the next batch; the future resolves to its offset or to the batch's error.

        Raises at once, queueing nothing, if the entry cannot be stored
        (``UnsupportedEntryError``, ``EntryTooLargeError``) or the producer is
        closed (``InvalidArgumentError``). Blocks while ``max_pending`` entries
        are unresolved.
        """
        checked = check_entry(value, self._entry_limit, self._encoding)
        with self._lock:
            if self._closed or self._sent - self._resolved >= self.max_pending:
                self._wait_for_room()
            batch = self._open
            values = batch.values
            values.append(checked)
            index = len(values) - 1  # taken under the lock: other senders append to the same batch
            self._sent += 1
            if index + 1 >= self.max_batch:  # full: it goes next, and sends start another
                self._full.append(batch)
                self._open = _Batch()
                self._work.notify()
            elif not index:  # the first of a batch: it lingers from now
                batch.born = time.monotonic()
                self._work.notify()
        return OffsetFuture(batch, index)

    def _wait_for_room(self) -> None:
        """(holding the lock) Wait while ``max_pending`` entries are unresolved; raise if closed."""
        while not self._closed and self._sent - self._resolved >= self.max_pending:
            self._room.wait()
        if self._closed:
            raise errors.InvalidArgumentError(f"{self!r} is closed: it sends nothing more")

    def flush(self, timeout: float | None = None) -> bool:
        """Send what waits at once and wait until every entry sent before this call is resolved.

        True when they all are; False if ``timeout`` seconds passed first.
        """
        with self._work:
            target = self._flush_upto = max(self._flush_upto, self._sent)
            self._work.notify()
            return self._done.wait_for(lambda: self._resolved >= target, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Refuse further sends, write what was sent, and stop the producer thread.

        True when the thread has stopped (every future resolved); False if
        ``timeout`` seconds passed first: the thread then goes on until it
        has resolved them all. Closing again does no harm.
        """
        with self._work:
            self._close()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _close(self) -> None:
        """(holding the lock) Stop accepting entries; send those waiting at once."""
        self._closed = True
        self._flush_upto = self._sent
        self._work.notify()
        self._room.notify_all()  # blocked senders raise

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._append(batch)

    def _next_batch(self) -> _Batch | None:
        """The next batch, when it is due; None when the producer is closed and nothing waits."""
        with self._work:
            while True:
                if self._full:
                    return self._full.popleft()
                batch = self._open
                if batch.values:
                    wait = batch.born + self.linger - time.monotonic()
                    if wait <= 0 or self._flush_upto > self._resolved:
                        self._open = _Batch()
                        return batch
                elif self._closed:
                    return None
                elif not threading.main_thread().is_alive():
                    self._close()
                    continue
                else:
                    wait = _IDLE_CHECK_SECONDS
                self._work.wait(wait)

    def _append(self, batch: _Batch) -> None:
        """One append of the batch's entries, then resolve it (every future of it at once)."""
        outcome = self._enqueue(batch.values)
        if isinstance(outcome, BaseException):
            batch.error = outcome
        else:
            batch.offsets = outcome
        with _RESOLVING:
            batch.resolved.set()
        for callback in batch.callbacks:
            callback()
        count = len(batch.values)
        batch.values = []  # the entries are stored: let them go
        with self._work:
            self._resolved += count
            self._room.notify_all()
            self._done.notify_all()

    def _enqueue(self, values: list[Any]) -> range | Exception:
        """``enqueue_batch``, again while readers close its reservation; its offsets or its error."""
        for attempt in range(1, RESERVATION_ATTEMPTS + 1):
            try:
                return self.queue._append_checked(values, overwrite_if_full=self.overwrite_if_full)
            except errors.ReservationClosedError as exc:
                if attempt == RESERVATION_ATTEMPTS:
                    return exc
            except Exception as exc:  # whatever failed the batch is its futures' outcome
                return exc
        raise AssertionError("RESERVATION_ATTEMPTS must be positive")
