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
not a lock of its own: a sent entry costs about what checking it costs.

A send takes no lock on its common path: it appends the entry to a deque,
whose append is atomic, and so takes its place in the order of the queue.
Senders that shared a lock queued up behind it: with eight busy threads,
one holding it when the interpreter switched threads sent the others to
sleep, and they went on handing it over through the kernel (a convoy:
batches a third as large at three times the CPU an entry, about one run in
eight). A send takes the lock only to wake the producer thread (the first
entry, or a full batch), to wait for room, or when the producer is closed.

One background thread takes the waiting entries, in the order they were sent,
into one ``queue.enqueue_batch`` call as soon as ``max_batch`` of them wait,
``linger`` seconds after the oldest of them was sent, or at once when
someone flushes or closes. Batches are appended one after the other, so the
entries are in the queue in the order ``send`` accepted them: each thread's
entries keep its call order. A batch is all or nothing, like
``enqueue_batch``: its futures all resolve to their offsets, or all to the
error that failed it (``OutcomeUnknownError`` says, as it does for
``enqueue_batch``, that the batch may be in the queue). Nothing is retried
but a batch whose reservation a reader closed (``ReservationClosedError``:
nothing of it is visible, and appending it again takes new offsets), or
that timed out with nothing of it applied (a ``BackendTimeoutError`` not in
doubt): it is sent again, at most :data:`RESERVATION_ATTEMPTS` times in all.

An idempotent producer (``idempotent=True``, as Kafka's) gives each batch a
txn id of its own (see ``enqueue_batch``'s ``txn_id`` and the README's
Receipts), so that a batch whose append timed out or failed in doubt (any
error with ``in_doubt``) can be sent again without a duplicate, up to
:data:`IN_DOUBT_ATTEMPTS` times in all. Before each new attempt it asks the
queue's receipts (``queue.outcome``, one read) what became of the attempts
so far, within the time since the first began: committed, and the batch
resolves to the receipt's offsets; not committed or pending, and it is sent
again with its txn id (a pending one is then finished, not repeated);
unknown, because later calls with txn ids have pushed its receipt out of
the log, and the batch fails with ``OutcomeUnknownError`` rather than risk
being enqueued twice. A batch that fails keeps its txn id
(``future.txn_id``), so ``queue.outcome`` can still be asked about it. Each
batch costs what a call with a txn id costs (its receipt is written by the
same reservation or commit; see the bench's "calls with a txn id"); keep
enough receipts (``Queue.create(..., receipts=N)``) for every batch and call
with a txn id that all producers send while a batch may be retried (a few
seconds, as long as the store's timeouts make it).

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
``send`` blocks until a batch resolves. There is no send timeout: a batch
resolves, with offsets or with an error, within the store's own timeouts.
Threads that send at the same moment can each pass the check, so the
producer may hold up to one entry more than ``max_pending`` per sending
thread. A send that races ``close`` either gets a future that resolves or
raises ``InvalidArgumentError``, as a send after ``close`` does.
Futures' callbacks run in the producer's thread (one added to a future
already resolved runs at once, in the caller's): they must not block. A
callback that flushes or closes its producer, waits for one of its futures
not yet resolved, or sends to it while it is full, would wait for itself:
it raises ``InvalidArgumentError`` instead. One that raises (even
``sys.exit`` in the producer's thread) is logged (logger ``large_queue``)
and the others still run.
An entry is taken as it is when sent: a native queue's dict or list is
copied then (msgpack-encoded queues encode it then), so changing it after
``send`` changes nothing of what is written.

Close the producer (or use it as a context manager). One left open lives,
with its thread, until the program ends (its thread holds it, so it is not
garbage-collected); the program ends when the main thread has ended and no
other thread the interpreter waits for is left to send. The producer then
writes what was sent at once, whatever its linger (a warning in the log
says so, since the exit waits for it), logs an error for a batch that
fails then (no one is left to look at its futures), waits while other
producers still write (their callbacks may send to it), and then closes,
refusing any further send and saying why. Its thread is never a daemon, so
a producer made in a daemon thread is written out too. A producer made by
an exit handler (``atexit``), which runs once the program's threads have
ended, is not closed for it: the handler closes it (``with``). In a process
forked from the producer's, the producer and the futures it had not
resolved at the fork raise ``InvalidArgumentError``: its thread, and what it
was sending, stayed in the parent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from large_queue import errors
from large_queue._entries import check_entry
from large_queue._lifecycle import flag, positive_int, seconds
from large_queue._msgpack import pack, unpack
from large_queue._receipts import COMMITTED, UNKNOWN

if TYPE_CHECKING:
    from large_queue.queue import Queue

log = logging.getLogger("large_queue")

#: appends of one batch, in all, while readers keep closing its reservation (or it times out, not in doubt)
RESERVATION_ATTEMPTS = 3
#: appends of one batch, in all, while they time out or end in doubt (idempotent producers only)
IN_DOUBT_ATTEMPTS = 4
#: seconds added to the time since a batch's first attempt when its receipt is looked for: that
#: time is this process's, the log's is the store's clock, in whole ms, and a receipt written a
#: fraction of a ms after the attempt began must not be taken as older than what the log covers
_CLOCKS_APART = 1.0
#: entries of one batch at most, unless the producer is made with another ``max_batch``. Under load
#: a batch fills to it; larger batches spread a reservation's and a publish's round trips over more
#: entries (8 threads sending through one producer: about 25% more entries/s at 2,000 than at 500,
#: on Aerospike and on the embedded store)
DEFAULT_MAX_BATCH = 2000
#: the longest linger (seconds) a producer takes
MAX_LINGER = 3600.0
#: held while a batch is resolved or a callback is added to one, so that each callback runs once
_RESOLVING = threading.Lock()
#: seconds between the idle producer thread's looks at whether the main thread has ended
_IDLE_CHECK_SECONDS = 0.25
#: entries a native queue stores as they are, which a sender could change before their batch goes
_MUTABLE = (dict, list)
#: an alarm no number of waiting entries reaches
_NEVER = float("inf")


def _timeout(timeout: float | None) -> float | None:
    """A wait's ``timeout``: None (no limit) or seconds >= 0, else ``InvalidArgumentError``."""
    return None if timeout is None else seconds("timeout", timeout, zero=True, most=_LONGEST_WAIT)


#: the longest timeout a wait takes (seconds): a year
_LONGEST_WAIT = 365 * 86400.0


def _in_doubt(error: Exception) -> bool:
    """True for a failure after which a call may have been applied: a timeout, or any error in doubt."""
    return isinstance(error, (errors.OutcomeUnknownError, errors.BackendTimeoutError)) or bool(
        getattr(error, "in_doubt", False)
    )


class _ProducerThread(threading.Thread):
    """A producer's thread: the program's end does not wait for it to stop sending (``_program_ending``)."""


#: every producer of the process (weakly: a closed one goes when its owner lets go)
_PRODUCERS: weakref.WeakSet[Producer] = weakref.WeakSet()


def _others_busy(producer: Producer) -> bool:
    """True while another producer has entries waiting or a batch in flight (with callbacks to run).

    Those callbacks may send to ``producer``, so at the program's end it
    stays open until they are done. Producers whose thread has ended (or
    lives in another process) send nothing. Read without the other's lock: its
    intake first, then the batch it sends, which its thread sets before it empties
    the intake and clears after the callbacks.
    """
    return any(
        other is not producer
        and (other._intake or other._sending is not None)
        and other._pid == producer._pid  # a forked child's copies have no thread
        and other._thread.is_alive()
        for other in list(_PRODUCERS)
    )


class _Batch:
    """Entries taken together, and the outcome they share: their offsets, or the error that failed them."""

    __slots__ = ("callbacks", "error", "offsets", "resolved", "traceback", "txn_id")

    def __init__(self, txn_id: str | None = None) -> None:
        self.txn_id = txn_id  # an idempotent producer's id for the batch's enqueue_batch
        self.resolved = threading.Event()
        self.offsets: range | None = None
        self.error: BaseException | None = None
        self.traceback: TracebackType | None = None  # the error's own: each raise starts again from it
        self.callbacks: list[Callable[[], object]] = []

    def fail(self, error: BaseException) -> None:
        """Set the error every future of the batch raises."""
        self.error = error
        self.traceback = error.__traceback__


class OffsetFuture:
    """The offset one sent entry gets, once its batch is appended (or the error that failed the batch)."""

    __slots__ = ("_batch", "_callbacks", "_index", "_producer")

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._batch: _Batch | None = None  # set, under the producer's lock, when the entry is taken
        self._index = 0
        self._callbacks: list[Callable[[], object]] | None = None  # added before the entry was taken

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._taken().error else "done")
        return f"<OffsetFuture {state}>"

    @property
    def txn_id(self) -> str | None:
        """An idempotent producer's txn id for the entry's batch, once the entry is taken into one.

        For a batch that failed in doubt (``OutcomeUnknownError``, a
        timeout), ``queue.outcome(future.txn_id)`` tells whether it is in
        the queue. None for a producer that is not idempotent, or while the
        entry waits.
        """
        batch = self._batch
        return None if batch is None else batch.txn_id

    def done(self) -> bool:
        """True once the entry's batch is appended or has failed."""
        batch = self._batch
        return batch is not None and batch.resolved.is_set()

    def result(self, timeout: float | None = None) -> int:
        """The entry's offset; raises the batch's error, or ``TimeoutError`` after ``timeout`` seconds."""
        batch = self._batch
        if batch is not None and batch.resolved.is_set():
            error = batch.error
        else:
            error = self.exception(timeout)
            batch = self._taken()
        if error is not None:
            # One error object serves every future of the batch: raised from its own traceback each
            # time, it does not collect the frames of every result() call (and of every thread)
            raise error.with_traceback(batch.traceback)
        assert batch.offsets is not None
        return batch.offsets[self._index]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error that failed the entry's batch, or None; ``TimeoutError`` after ``timeout`` seconds.

        ``InvalidArgumentError`` in a process forked before the batch was
        resolved: its outcome is known in the producer's process only.
        """
        timeout = _timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        batch = self._batch
        if batch is None or not batch.resolved.is_set():
            self._producer._check_process("the outcome of an entry it sent")
            self._producer._check_not_own_thread("wait for an entry of")
        if batch is None:
            producer = self._producer
            with producer._taking:
                if not producer._taking.wait_for(lambda: self._batch is not None, timeout):
                    raise TimeoutError(f"the entry was not appended within {timeout} s")
            batch = self._taken()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not batch.resolved.wait(left):
            raise TimeoutError(f"the entry was not appended within {timeout} s")
        return batch.error

    def add_done_callback(self, callback: Callable[[OffsetFuture], object]) -> None:
        """Call ``callback(future)`` when the entry's batch is resolved (at once, here, if it is).

        An exception it raises is logged (logger ``large_queue``), as
        :class:`concurrent.futures.Future` does, wherever it runs.
        """
        if not callable(callback):
            raise errors.InvalidArgumentError(f"a done callback is a callable, got {callback!r}")
        call = lambda: callback(self)  # noqa: E731 -- the producer thread calls it
        if not self.done():
            self._producer._check_process("the outcome of an entry it sent")
        with self._producer._lock:
            if self._batch is None:  # not taken yet: the producer thread moves it to the batch
                self._callbacks = [*(self._callbacks or ()), call]
                return
        with _RESOLVING:
            if not self._taken().resolved.is_set():
                self._taken().callbacks.append(call)
                return
        try:  # resolved already: run here, and what it raises is logged, as the producer thread does
            callback(self)
        except Exception:
            log.exception("a callback of %r raised", self._producer)

    def _taken(self) -> _Batch:
        batch = self._batch
        assert batch is not None, "the entry is not taken into a batch yet"
        return batch


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
        idempotent: bool = False,
    ) -> None:
        self.queue = queue
        self.linger = seconds("linger", linger, zero=True, most=MAX_LINGER)
        self.max_pending = positive_int("max_pending", max_pending)
        # a batch never waits for more entries than may be pending: it would linger its whole time
        self.max_batch = min(positive_int("max_batch", max_batch), queue.capacity, self.max_pending)
        self.overwrite_if_full = flag("overwrite_if_full", overwrite_if_full)
        self.idempotent = flag("idempotent", idempotent)
        # each batch's txn id: this producer's, then the batch's number
        self._txn_prefix = f"producer-{uuid.uuid4().hex}-" if self.idempotent else None
        self._batches = 0
        self._entry_limit = queue.max_entry_bytes  # fixed for the queue handle's life
        self._encoding = queue.encoding
        # Sends append to the intake without a lock (a deque's append is atomic); everything else
        # (taking entries, waking, waiting for room or for a flush) holds this lock
        self._intake: deque[tuple[Any, OffsetFuture]] = deque()
        lock = self._lock = threading.Lock()
        self._work = threading.Condition(lock)  # the producer thread waits for entries
        self._room = threading.Condition(lock)  # senders wait for fewer than max_pending unresolved
        self._done = threading.Condition(lock)  # flushers wait for their entries to resolve
        self._taking = threading.Condition(lock)  # futures wait to be taken into a batch
        self._first_at = 0.0  # monotonic time a send found the intake empty: lingering counts from it
        self._alarm: float = _NEVER  # a send that leaves this many entries waiting wakes the producer thread
        self._taken = 0  # entries taken from the intake, ever (counted before they leave it)
        self._resolved = 0  # of those, whose futures are resolved (in the order sent)
        self._flush_upto = 0  # entries before this one go at once, without lingering
        self._closed = False
        self._stopped = False  # the producer thread has taken its last entry
        # the batch the producer thread appends now: taken, until resolved with its callbacks run
        self._sending: _Batch | None = None
        self._why = ""  # why it closed, if its thread failed
        self._pid = os.getpid()  # its thread lives in this process only: a forked child has none
        self._exiting = False  # the program is ending (see _program_ending)
        main = threading.main_thread()
        self._made_at_exit = threading.current_thread() is main and not main.is_alive()
        # never a daemon (as a thread made by a daemon thread would be): the exit waits for what was sent
        self._thread = _ProducerThread(
            target=self._run, name=f"large_queue producer {queue.name}", daemon=False
        )
        _PRODUCERS.add(self)
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
        if os.getpid() != self._pid:
            raise self._forked()
        checked = check_entry(value, self._entry_limit, self._encoding)
        if type(checked) in _MUTABLE:  # a native queue's entry, written later: as it was when checked
            checked = unpack(pack(checked))
        intake = self._intake
        if self._closed or len(intake) >= self.max_pending - self._taken + self._resolved:
            self._wait_for_room()
        future = OffsetFuture(self)
        sent_at = time.monotonic()  # read first: a send switched out below can only make it earlier
        if not intake:
            self._first_at = sent_at
        intake.append((checked, future))  # its place in the queue's order, taken atomically
        if len(intake) >= self._alarm or self._closed:
            self._after_append(future)
        return future

    def _wait_for_room(self) -> None:
        """Wait while ``max_pending`` entries are unresolved; raise if closed."""
        with self._lock:
            while not self._closed and len(self._intake) >= self.max_pending - self._taken + self._resolved:
                self._check_not_own_thread("wait for room in")  # only this thread makes room
                self._room.wait()
            if self._closed:
                raise errors.InvalidArgumentError(f"{self!r} is closed: it sends nothing more{self._why}")

    def _after_append(self, future: OffsetFuture) -> None:
        """Wake the producer thread for a full batch or a first entry; refuse an entry sent past the end."""
        with self._lock:
            if self._stopped and future._batch is None:  # closed while sending: the thread is gone
                # Every entry still waiting is a late one whose sender raises, as this one does. One
                # call clears them all: a loop over the deque would meet other late senders' appends.
                self._intake.clear()
                raise errors.InvalidArgumentError(f"{self!r} is closed: it sends nothing more{self._why}")
            self._alarm = _NEVER
            self._work.notify()

    def flush(self, timeout: float | None = None) -> bool:
        """Send what waits at once and wait until every entry sent before this call is resolved.

        True when they all are; False if ``timeout`` seconds passed first.
        """
        timeout = _timeout(timeout)
        if os.getpid() != self._pid:
            raise self._forked()
        self._check_not_own_thread("flush")
        with self._lock:
            target = self._flush_upto = max(self._flush_upto, self._taken + len(self._intake))
            self._work.notify()
            # The count may hold late entries, sent past close and refused: once the thread has
            # stopped, every entry it accepted is resolved
            return self._done.wait_for(lambda: self._resolved >= target or self._stopped, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Refuse further sends, write what was sent, and stop the producer thread.

        True when the thread has stopped (every future resolved); False if
        ``timeout`` seconds passed first: the thread then goes on until it
        has resolved them all. Closing again does no harm. In a process
        forked from the one that made the producer, False at once: its
        thread, and whatever it was sending, stayed in the parent.
        """
        timeout = _timeout(timeout)
        if os.getpid() != self._pid:
            return False
        self._check_not_own_thread("close")
        with self._lock:
            self._close()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _check_not_own_thread(self, what: str) -> None:
        """``InvalidArgumentError`` in a callback (the producer's thread): it would wait for itself."""
        if threading.current_thread() is self._thread:
            raise errors.InvalidArgumentError(
                f"a callback of {self!r} cannot {what} it: callbacks run in its thread, which would wait"
                " for itself (hand the work to another thread)"
            )

    def _check_process(self, what: str) -> None:
        """Raise :meth:`_forked`'s error in a process forked from the producer's: ``what`` it cannot give."""
        if os.getpid() != self._pid:
            raise errors.InvalidArgumentError(
                f"{self!r} was made in process {self._pid}, not in this one ({os.getpid()}): {what} is"
                " known in that process only (its thread does not survive a fork)"
            )

    def _forked(self) -> errors.InvalidArgumentError:
        """The error for a producer used in a process forked from the one that made it.

        The child has a copy of the producer but not its thread (threads do
        not survive a fork), and its locks may have been held at the fork:
        nothing it sent would ever be written.
        """
        return errors.InvalidArgumentError(
            f"{self!r} was made in process {self._pid}, not in this one ({os.getpid()}): its thread does not"
            " survive a fork, so nothing sent here would be written; make a producer in this process"
        )

    def _close(self) -> None:
        """(holding the lock) Stop accepting entries; send those waiting at once."""
        self._closed = True
        self._work.notify()
        self._room.notify_all()  # blocked senders raise

    def _run(self) -> None:
        try:
            while (batch := self._next_batch()) is not None:
                self._append(*batch)
        except BaseException as exc:  # the thread ends: no future may be left waiting on it
            self._fail_everything(exc)
            raise

    def _fail_everything(self, cause: BaseException) -> None:
        """The producer thread is failing: fail its batch and every entry waiting, and refuse more."""
        error = errors.LargeQueueError(
            f"{self!r} stopped: its thread failed ({type(cause).__name__}: {cause}); entries not yet"
            " resolved were not appended"
        )
        error.__cause__ = cause
        with self._lock:
            self._closed = self._stopped = True
            self._why = f" (its thread failed: {type(cause).__name__}: {cause})"
            waiting = [future for _, future in self._intake]
            self._intake.clear()
            batches = [self._sending] if self._sending is not None else []
            if waiting:
                self._taken += len(waiting)
                batches.append(_Batch())
                for index, future in enumerate(waiting):
                    future._batch, future._index = batches[-1], index
                    if future._callbacks is not None:
                        batches[-1].callbacks.extend(future._callbacks)
                        future._callbacks = None
            failed = []
            with _RESOLVING:  # as a batch is resolved: each callback added runs once, here or at once
                for batch in batches:
                    if not batch.resolved.is_set():
                        batch.fail(error)
                        batch.resolved.set()
                        failed.append(batch)
            self._resolved = self._taken
            for condition in (self._taking, self._room, self._done, self._work):
                condition.notify_all()
        for batch in failed:  # their futures' callbacks, as for any failed batch
            self._call_back(batch)

    def _call_back(self, batch: _Batch) -> None:
        """Run a resolved batch's callbacks; one that raises anything (``sys.exit`` too) is logged.

        As concurrent.futures does for ``Exception``: the producer thread,
        and the other callbacks, must go on.
        """
        for callback in batch.callbacks:
            try:
                callback()
            except BaseException:
                log.exception("a callback of %r raised", self)

    def _next_batch(self) -> tuple[_Batch, list[Any]] | None:
        """The next batch and its entries, when due; None when the producer is closed and nothing waits.

        A send reads the alarm after its append, and this thread sets the
        alarm before it looks at the intake: so either it sees the entry,
        or the send sees the alarm and wakes it.
        """
        intake = self._intake
        with self._lock:
            while True:
                self._alarm = 1
                waiting = len(intake)
                if waiting:
                    if waiting >= self.max_batch or self._closed or self._flush_upto > self._taken:
                        break
                    if self._program_ending():
                        break  # what waits goes at once, whatever the linger
                    self._alarm = self.max_batch
                    wait = self._first_at + self.linger - time.monotonic()
                    if wait <= 0 or len(intake) >= self.max_batch:
                        break
                    wait = min(wait, _IDLE_CHECK_SECONDS)  # a long linger must not hold the program's end
                elif self._closed:
                    self._stopped = True
                    self._done.notify_all()  # flushers counting late entries stop waiting
                    return None
                elif self._program_ending() and not _others_busy(self):
                    self._why = (
                        " (the program's main thread ended and no other thread could send: it closed itself)"
                    )
                    self._close()
                    continue
                else:
                    wait = _IDLE_CHECK_SECONDS
                self._work.wait(wait)
            self._alarm = _NEVER
            return self._take(min(len(intake), self.max_batch))

    def _program_ending(self) -> bool:
        """(holding the lock) True once the program is ending: its entries then go at once.

        The program ends when its main thread has ended and no other thread
        that could still send is alive: daemon threads do not count (the
        interpreter does not wait for them), nor do producers' own (their
        callbacks may send, but :func:`_others_busy` waits for them). A
        producer made by an exit handler (``atexit``, which runs once the
        program's threads have ended) is never taken as ending: the handler
        closes it. The first time, a warning with entries waiting says that
        the exit waits for them.
        """
        if self._exiting:
            return True
        main = threading.main_thread()
        if self._made_at_exit or main.is_alive():
            return False
        for thread in threading.enumerate():
            if thread is not main and not thread.daemon and not isinstance(thread, _ProducerThread):
                return False  # a thread the program's end waits for, which may send
        self._exiting = True
        if self._intake:
            log.warning(
                "%r was not closed and the program is ending: writing the %d entries sent to it first",
                self,
                len(self._intake),
            )
        return True

    def _take(self, count: int) -> tuple[_Batch, list[Any]]:
        """(holding the lock) The next ``count`` entries of the intake, as a batch their futures name."""
        self._taken += count  # first: a send checking meanwhile sees them as pending either way
        self._batches += 1
        batch = _Batch(None if self._txn_prefix is None else f"{self._txn_prefix}{self._batches}")
        self._sending = batch  # before the intake empties: see _others_busy
        values = []
        popleft = self._intake.popleft
        for index in range(count):
            value, future = popleft()
            values.append(value)
            future._batch = batch
            future._index = index
            if future._callbacks is not None:
                batch.callbacks.extend(future._callbacks)
                future._callbacks = None
        self._taking.notify_all()
        return batch, values

    def _append(self, batch: _Batch, values: list[Any]) -> None:
        """One append of the batch's entries, then resolve it (every future of it at once)."""
        outcome = self._enqueue(values, batch.txn_id)
        if isinstance(outcome, BaseException):
            batch.fail(outcome)
            if self._exiting:  # no one is left to look at its futures
                log.error(
                    "%r could not write %d entries sent before the program ended: %s: %s",
                    self,
                    len(values),
                    type(outcome).__name__,
                    outcome,
                )
        else:
            batch.offsets = outcome
        with _RESOLVING:
            batch.resolved.set()
        self._call_back(batch)
        self._sending = None  # after its callbacks, which may have sent to other producers
        with self._lock:
            self._resolved += len(values)
            self._room.notify_all()
            self._done.notify_all()

    def _enqueue(self, values: list[Any], txn_id: str | None) -> range | Exception:
        """``enqueue_batch``, again while readers close its reservation; its offsets or its error.

        With ``txn_id`` (an idempotent producer), also again after a timeout
        or an outcome in doubt, with the same txn id, once the queue's
        receipts have said what became of the attempts so far
        (:meth:`_settled`): the batch is in the queue at most once.
        """
        closed = in_doubt = 0
        began = time.monotonic()  # before the first attempt: the receipts must cover since then
        while True:
            try:
                return self.queue._append_checked(
                    values, txn_id=txn_id, overwrite_if_full=self.overwrite_if_full
                )
            except errors.ReservationClosedError as exc:
                closed += 1
                if closed >= RESERVATION_ATTEMPTS:
                    return exc
            except errors.LargeQueueError as exc:
                if txn_id is None and isinstance(exc, errors.BackendTimeoutError) and not exc.in_doubt:
                    closed += 1  # nothing of it was applied (a timeout not in doubt): sent again, as above
                    if closed >= RESERVATION_ATTEMPTS:
                        return exc
                    continue
                in_doubt += 1
                if txn_id is None or not _in_doubt(exc) or in_doubt >= IN_DOUBT_ATTEMPTS:
                    return exc
                time.sleep(min(1.0, 0.05 * 2**in_doubt))  # the store may be pausing: give it a moment
                settled = self._settled(txn_id, len(values), began, exc)
                if settled is not None:
                    return settled
            except Exception as exc:  # whatever failed the batch is its futures' outcome
                return exc

    def _settled(self, txn_id: str, count: int, began: float, cause: Exception) -> range | Exception | None:
        """What the receipts say of a batch's attempts so far: its offsets, an error, or None (send again).

        Committed: the offsets its receipt names. Unknown (the receipt log no
        longer covers the time since the first attempt began at ``began``:
        later calls with txn ids pushed its receipt out): ``OutcomeUnknownError``,
        since sending it again could enqueue it twice. Not committed, or
        pending (sending it again with the txn id finishes it): None. The
        receipts are asked again while the store does not answer, a few times;
        then the batch ends in doubt (``OutcomeUnknownError``, from ``cause``):
        sending it again unanswered could enqueue it twice too.
        """
        outcome = None
        unanswered: errors.LargeQueueError | None = None
        for attempt in range(1, IN_DOUBT_ATTEMPTS + 1):
            try:
                outcome = self.queue.outcome(txn_id, within=time.monotonic() - began + _CLOCKS_APART)
                break
            except (
                errors.BackendTimeoutError,
                errors.BackendUnavailableError,
                errors.BackendBusyError,
            ) as exc:
                unanswered = exc  # the store did not answer: it may, in a moment
                if attempt < IN_DOUBT_ATTEMPTS:
                    time.sleep(min(1.0, 0.05 * 2**attempt))
            except errors.QueueNotFoundError as exc:  # the queue is gone: nothing more to settle
                return exc
            except errors.LargeQueueError as exc:  # an answer that will not change: the batch stays in doubt
                unanswered = exc
                break
        if outcome is None:
            failure = errors.OutcomeUnknownError(
                f"{self!r} sent a batch of {count} entries (txn id {txn_id!r}) that ended in doubt"
                f" ({type(cause).__name__}: {cause}), and the queue's receipts could not be read to tell"
                f" whether it is in the queue ({type(unanswered).__name__}: {unanswered}): it was not sent"
                " again, which could have enqueued it twice; queue.outcome(future.txn_id) tells later",
                queue=self.queue.name,
                txn_id=txn_id,
                stage="settling",
            )
            failure.__cause__ = cause
            return failure
        receipt = outcome.receipt
        if outcome.state == COMMITTED and receipt is not None and len(receipt.offsets) == count:
            # an attempt that failed was applied: counted here, as its call would have counted it
            self.queue.counters.add(enqueue_calls=1, entries_enqueued=count)
            return receipt.offsets
        if outcome.state == UNKNOWN:
            return errors.OutcomeUnknownError(
                f"{self!r} sent a batch of {count} entries (txn id {txn_id!r}) that timed out or ended in"
                f" doubt, and the queue's receipt log no longer tells whether it is in the queue"
                f" ({outcome.detail}): it was not sent again, which could have enqueued it twice (keep more"
                " receipts to keep them longer: Queue.create(..., receipts=N))",
                queue=self.queue.name,
                txn_id=txn_id,
                stage="settling",
                detail=outcome.detail,
            )
        return None
