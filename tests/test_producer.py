"""The producer: batches from many threads, order, failures reaching futures, flush, close, back-pressure."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from large_queue import (
    EntryTooLargeError,
    InvalidArgumentError,
    LargeQueueError,
    OutcomeUnknownError,
    Producer,
    Queue,
    QueueFullError,
    ReservationClosedError,
    UnsupportedEntryError,
)
from large_queue import producer as producer_module
from large_queue.backends import Backend
from large_queue.backends._delegating import Delegating
from large_queue.backends.faults import Call, FaultInjectingBackend
from large_queue.errors import BackendError, BackendTimeoutError, BackendUnavailableError
from large_queue.producer import OffsetFuture
from tests.fix_backends import APPENDS, Place, Store

THREADS = 8
SENDS_PER_THREAD = 250
#: long enough that nothing goes before the test flushes or closes
NEVER = 60.0


def drain(queue: Queue) -> list[Any]:
    """Every entry in the queue, in offset order."""
    entries = []
    while batch := queue.dequeue_batch(1000):
        entries.extend(batch)
    return entries


class Gate:
    """Holds every append of a queue's producer until opened, counting the calls."""

    def __init__(self, queue: Queue) -> None:
        self.enqueue_batch = queue._append_checked
        self.opened = threading.Event()
        self.calls = 0
        queue._append_checked = self  # type: ignore[method-assign,assignment]

    def __call__(self, entries: list[Any], **options: Any) -> range:
        self.calls += 1
        self.opened.wait(10)
        return self.enqueue_batch(entries, **options)


@pytest.fixture
def gated(store: Store) -> Iterator[tuple[Queue, Gate]]:
    """A queue whose appends wait until the test opens the gate (opened after the test, whatever happens)."""
    queue = store.new_queue(capacity=30, slots_per_record=5, appends="reserve")
    gate = Gate(queue)
    yield queue, gate
    gate.opened.set()


@pytest.mark.parametrize("appends", APPENDS)
def test_many_threads_keep_their_order_in_few_batches(store: Store, appends: str) -> None:
    entries = THREADS * SENDS_PER_THREAD
    queue = store.new_queue(capacity=entries, slots_per_record=100, appends=appends)
    futures: dict[int, list[OffsetFuture]] = {}
    start = threading.Barrier(THREADS)

    def sending(producer: Producer, thread: int) -> None:
        start.wait()
        futures[thread] = [producer.send({"thread": thread, "n": n}) for n in range(SENDS_PER_THREAD)]

    with queue.producer(linger=0.02) as producer:
        workers = [threading.Thread(target=sending, args=(producer, t)) for t in range(THREADS)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    offsets = {t: [future.result(timeout=0) for future in sent] for t, sent in futures.items()}
    assert sorted(o for sent in offsets.values() for o in sent) == list(range(entries))
    found = drain(queue)
    assert [entry.offset for entry in found] == list(range(entries))
    for thread, sent in offsets.items():
        mine = [entry for entry in found if entry.value["thread"] == thread]
        assert [entry.value["n"] for entry in mine] == list(range(SENDS_PER_THREAD))
        assert [entry.offset for entry in mine] == sent
    assert queue.stats().enqueue_calls <= entries / 20  # batched


def _send_from_threads(queue: Queue, threads: int, sends: int) -> dict[int, list[OffsetFuture]]:
    """Each of ``threads`` threads sends ``sends`` entries through one producer, all in one batch."""
    futures: dict[int, list[OffsetFuture]] = {}
    start = threading.Barrier(threads)

    def sending(producer: Producer, thread: int) -> None:
        start.wait()
        futures[thread] = [producer.send({"thread": thread, "n": n}) for n in range(sends)]

    with queue.producer(linger=0.05, max_batch=threads * sends) as producer:
        workers = [threading.Thread(target=sending, args=(producer, t)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    return futures


def test_every_future_names_its_own_entry_when_threads_switch_often(store: Store) -> None:
    """A send's place in its batch is taken while it holds the producer's lock, not after."""
    threads, sends = 8, 1500
    interval = sys.getswitchinterval()
    for _ in range(4):  # a wrong place shows in most rounds: four make it all but certain
        queue = store.new_queue(capacity=threads * sends, slots_per_record=100, appends="reserve")
        sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes, as on a busy machine
        try:
            futures = _send_from_threads(queue, threads, sends)
        finally:
            sys.setswitchinterval(interval)
        stored = {entry.offset: entry.value for entry in drain(queue)}
        for thread, sent in futures.items():
            assert [stored[future.result(timeout=0)] for future in sent] == [
                {"thread": thread, "n": n} for n in range(sends)
            ]


def test_a_bad_entry_raises_at_send_and_spoils_nothing(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    with queue.producer(linger=NEVER) as producer:
        first = producer.send("a")
        with pytest.raises(UnsupportedEntryError):
            producer.send(("a", "tuple"))
        with pytest.raises(EntryTooLargeError):
            producer.send(b"x" * (queue.max_entry_bytes + 1))
        second = producer.send("b")
    assert (first.result(), second.result()) == (0, 1)
    assert [entry.value for entry in drain(queue)] == ["a", "b"]


def test_a_batch_that_does_not_fit_fails_all_its_futures_and_only_them(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends="reserve")
    queue.enqueue_batch(range(4))
    with queue.producer(linger=NEVER, max_batch=3) as producer:
        refused = [producer.send(n) for n in ("a", "b", "c")]  # a full batch: it goes at once
        for future in refused:
            with pytest.raises(QueueFullError):
                future.result(timeout=10)
        fitting = [producer.send(n) for n in ("d", "e")]
    assert [future.result() for future in fitting] == [4, 5]
    assert [entry.value for entry in drain(queue)] == [0, 1, 2, 3, "d", "e"]


def test_overwriting_producers_drop_the_oldest_entries(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends="reserve")
    queue.enqueue_batch(range(6))
    with queue.producer(linger=NEVER, overwrite_if_full=True) as producer:
        futures = [producer.send(n) for n in ("a", "b")]
    assert [future.result() for future in futures] == [6, 7]
    assert [entry.value for entry in drain(queue)] == [2, 3, 4, 5, "a", "b"]


def test_flush_sends_at_once_and_waits_for_what_was_sent(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    with queue.producer(linger=NEVER) as producer:
        future = producer.send("a")
        assert not future.done()  # lingering
        began = time.monotonic()
        assert producer.flush(timeout=10) is True
        assert time.monotonic() - began < 5
        assert future.result(timeout=0) == 0
        assert producer.flush() is True  # nothing waits


def test_flush_and_close_time_out_while_a_batch_is_held_and_lose_nothing(
    gated: tuple[Queue, Gate],
) -> None:
    queue, gate = gated
    producer = queue.producer(linger=NEVER)
    future = producer.send("a")
    assert producer.flush(timeout=0.05) is False
    assert producer.close(timeout=0.05) is False
    with pytest.raises(InvalidArgumentError, match="closed"):
        producer.send("b")
    gate.opened.set()
    assert producer.close(timeout=10) is True
    assert future.result(timeout=0) == 0
    assert [entry.value for entry in drain(queue)] == ["a"]


def test_send_blocks_while_max_pending_entries_are_unresolved(gated: tuple[Queue, Gate]) -> None:
    queue, gate = gated
    with queue.producer(linger=0, max_pending=2) as producer:
        held = [producer.send("a"), producer.send("b")]
        sent: list[OffsetFuture] = []
        blocked = threading.Thread(target=lambda: sent.append(producer.send("c")))
        blocked.start()
        blocked.join(0.2)
        assert blocked.is_alive() and not sent
        gate.opened.set()
        blocked.join(10)
        assert [future.result(timeout=10) for future in [*held, *sent]] == [0, 1, 2]


def test_close_wakes_a_blocked_send_which_raises(gated: tuple[Queue, Gate]) -> None:
    queue, gate = gated
    producer = queue.producer(linger=0, max_pending=1)
    held = producer.send("a")
    raised: list[BaseException] = []

    def sending() -> None:
        try:
            producer.send("b")
        except InvalidArgumentError as exc:
            raised.append(exc)

    blocked = threading.Thread(target=sending)
    blocked.start()
    while gate.calls == 0:
        time.sleep(0.01)
    assert producer.close(timeout=0.05) is False
    blocked.join(10)
    assert len(raised) == 1
    gate.opened.set()
    assert producer.close(timeout=10) is True
    assert held.result(timeout=0) == 0


def test_a_closed_reservation_is_appended_again_a_few_times_at_most(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    enqueue_batch = queue._append_checked  # what the producer calls: entries it has checked
    refusals = [1]

    def closing(entries: list[Any], **options: Any) -> range:
        if refusals[0]:
            refusals[0] -= 1
            raise ReservationClosedError("closed by a reader")
        return enqueue_batch(entries, **options)

    monkeypatch.setattr(queue, "_append_checked", closing)
    with queue.producer(linger=NEVER) as producer:
        first = producer.send("a")
        assert producer.flush(timeout=10) is True
        assert first.result(timeout=0) == 0
        refusals[0] = producer_module.RESERVATION_ATTEMPTS
        given_up = producer.send("b")
    with pytest.raises(ReservationClosedError):
        given_up.result(timeout=0)
    assert refusals == [0]
    assert [entry.value for entry in drain(queue)] == ["a"]


def test_callbacks_run_once_when_the_batch_resolves(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    seen: list[int] = []
    with queue.producer(linger=NEVER) as producer:
        future = producer.send("a")
        future.add_done_callback(lambda done: seen.append(done.result()))
        assert not future.done() and seen == []
        with pytest.raises(TimeoutError):
            future.result(timeout=0.01)
    assert seen == [0]
    future.add_done_callback(lambda done: seen.append(done.result() + 100))  # resolved: called at once
    assert seen == [0, 100] and future.exception() is None


def test_bad_settings_are_refused(store: Store) -> None:
    queue = store.new_queue()
    options: dict[str, Any]
    for options in (
        {"linger": -1},
        {"linger": 1e10},  # past what a thread can wait: it would end the producer's thread
        {"linger": "0.1"},
        {"max_batch": 0},
        {"max_pending": 1.5},
    ):
        with pytest.raises(InvalidArgumentError):
            queue.producer(**options)
    with queue.producer(max_batch=10_000) as producer:
        assert producer.max_batch == queue.capacity
    with queue.producer(max_batch=10, max_pending=4) as producer:
        assert producer.max_batch == 4  # a batch never waits for more entries than may be pending


def test_senders_blocked_on_max_pending_do_not_wait_out_the_linger(store: Store) -> None:
    queue = store.new_queue(capacity=100, slots_per_record=10)
    started = time.monotonic()
    with queue.producer(linger=2.0, max_batch=100, max_pending=10) as producer:
        futures = [producer.send(value) for value in range(30)]
        assert [f.result(timeout=10) for f in futures] == list(range(30))
        assert time.monotonic() - started < 1.0  # full batches of max_pending go at once


def test_a_failed_batchs_error_is_raised_from_its_own_traceback_every_time(store: Store) -> None:
    queue = store.new_queue(capacity=3, slots_per_record=3)
    queue.enqueue_batch([0, 1, 2])
    with queue.producer(linger=NEVER) as producer:
        futures = [producer.send(value) for value in range(3)]
        producer.flush(timeout=10)
    depths = []
    for future in futures * 20:
        with pytest.raises(QueueFullError) as raised:
            future.result(timeout=0)
        depth, tb = 0, raised.value.__traceback__
        while tb is not None:
            depth, tb = depth + 1, tb.tb_next
        depths.append(depth)
    assert max(depths) == min(depths), depths  # not one frame more at every call


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's end, shown
def test_a_producer_whose_thread_dies_fails_every_waiting_future_and_refuses_more(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    append = queue._append_checked
    calls = []
    release = threading.Event()

    def dying_append(values: list[Any], **options: Any) -> range:
        calls.append(values)
        if len(calls) == 2:  # something no append error is: the thread itself ends
            release.wait(10)
            raise SystemExit(3)
        return append(values, **options)

    queue._append_checked = dying_append  # type: ignore[method-assign,assignment]
    producer = queue.producer(linger=NEVER, max_batch=2)
    done = [producer.send(value) for value in "ab"]  # a full batch: appended
    assert [f.result(timeout=5) for f in done] == [0, 1]
    sending = [producer.send(value) for value in "cd"]  # the batch the thread dies in
    while len(calls) < 2:
        time.sleep(0.01)
    waiting = producer.send("e")  # waits for a batch that never comes
    told: list[BaseException | None] = []
    for future in [*sending, waiting]:
        future.add_done_callback(lambda done: told.append(done.exception(timeout=0)))
    release.set()
    for future in [*sending, waiting]:  # resolved, not left hanging: failed with the cause named
        with pytest.raises(LargeQueueError, match=r"thread failed \(SystemExit: 3\)"):
            future.result(timeout=5)
    with pytest.raises(InvalidArgumentError, match="thread failed"):
        producer.send("f")
    assert producer.flush(timeout=5) is True and producer.close(timeout=5) is True
    assert [e.value for e in drain(queue)] == ["a", "b"]
    assert len(told) == 3 and all(isinstance(e, LargeQueueError) for e in told)  # their callbacks ran


def test_a_producer_left_open_writes_what_was_sent_when_the_program_ends(place: Place) -> None:
    name = place.name("left-open")
    Queue.create(place.connect(), name, capacity=12, slots_per_record=3, appends="reserve")
    program = (
        "import large_queue\n"
        f"queue = large_queue.Queue.open({place.url!r}, {name!r})\n"
        "producer = queue.producer(linger=0.05)\n"
        "producer.send('left open')\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)
    assert [entry.value for entry in drain(Queue.open(place.connect(), name))] == ["left open"]


def test_a_send_takes_no_lock_once_the_producer_thread_lingers(store: Store) -> None:
    """Senders that queue on one lock convoy when the interpreter switches threads: a send needs none."""
    queue = store.new_queue(capacity=200, slots_per_record=10, appends="reserve")
    with queue.producer(linger=NEVER) as producer:
        first = producer.send(0)  # the first entry wakes the producer thread, which then lingers
        while producer._alarm != producer.max_batch:
            time.sleep(0.001)
        sent: list[OffsetFuture] = []
        with producer._lock:
            sender = threading.Thread(target=lambda: sent.extend(producer.send(n) for n in range(1, 100)))
            sender.start()
            sender.join(10)
            assert not sender.is_alive() and len(sent) == 99
    assert [first.result(timeout=0), *(future.result(timeout=0) for future in sent)] == list(range(100))


def test_sends_racing_close_resolve_or_raise_and_never_hang(store: Store) -> None:
    threads, sends = 8, 300
    queue = store.new_queue(capacity=threads * sends, slots_per_record=100, appends="reserve")
    producer = queue.producer(linger=0.001, max_batch=50)
    futures: list[OffsetFuture] = []
    refused: list[InvalidArgumentError] = []
    start = threading.Barrier(threads + 1)

    def sending(thread: int) -> None:
        start.wait()
        for n in range(sends):
            try:
                futures.append(producer.send({"thread": thread, "n": n}))
            except InvalidArgumentError as exc:
                refused.append(exc)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes: a send meets close anywhere
    try:
        workers = [threading.Thread(target=sending, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        start.wait()
        time.sleep(0.01)
        assert producer.close(timeout=30) is True
        for worker in workers:
            worker.join(30)
    finally:
        sys.setswitchinterval(interval)
    assert all("closed" in str(exc) for exc in refused)
    stored = {entry.offset: entry.value for entry in drain(queue)}
    assert sorted(future.result(timeout=0) for future in futures) == sorted(stored)
    assert len(stored) + len(refused) <= threads * sends


class _ClosingIntake(deque[Any]):
    """An intake whose next append waits until the producer is closed and its thread has stopped."""

    producer: Producer

    def append(self, item: Any) -> None:
        self.producer.close(timeout=10)
        super().append(item)


def test_a_send_that_appends_after_the_producer_thread_stopped_raises(store: Store) -> None:
    """The send checked for closing, then close ran to its end, then the send appended: it must not hang."""
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    producer = queue.producer(linger=NEVER)
    intake = producer._intake = _ClosingIntake()
    intake.producer = producer
    with pytest.raises(InvalidArgumentError, match="closed"):
        producer.send("late")
    assert not producer._thread.is_alive() and not intake
    assert drain(queue) == []


def test_late_senders_all_raise_and_leave_nothing_behind(store: Store) -> None:
    """Many sends that passed the closing check append after the producer thread stopped, all at once."""
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # late senders meet each other's appends anywhere
    try:
        for _ in range(20):  # a sender's refusal meeting two others' appends shows in a few rounds
            producer = queue.producer(linger=NEVER)
            raised = _send_late(producer, senders=32)
            assert len(raised) == 32 and all(isinstance(exc, InvalidArgumentError) for exc in raised)
            assert not producer._intake
            assert producer.flush(timeout=10) is True  # nothing it accepted is unresolved
    finally:
        sys.setswitchinterval(interval)
    assert drain(queue) == []


def _send_late(producer: Producer, senders: int) -> list[BaseException]:
    """What each of ``senders`` sends raised, each held after its closing check until the producer closed."""
    appending = threading.Event()

    class _HeldIntake(deque[Any]):
        def append(self, item: Any) -> None:
            appending.wait(10)
            super().append(item)

    producer._intake = _HeldIntake()
    raised: list[BaseException] = []

    def sending() -> None:
        try:
            producer.send("late")
        except BaseException as exc:  # the test looks at what each send raised
            raised.append(exc)

    threads = [threading.Thread(target=sending) for _ in range(senders)]
    for thread in threads:
        thread.start()
    assert producer.close(timeout=10) is True
    appending.set()
    for thread in threads:
        thread.join(10)
    return raised


def test_flush_does_not_wait_on_an_entry_refused_after_close(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    producer = queue.producer(linger=NEVER)
    flushed: list[bool] = []

    class _FlushingIntake(deque[Any]):
        def append(self, item: Any) -> None:
            producer.close(timeout=10)  # the send passed its closing check; close runs to its end
            super().append(item)
            flusher = threading.Thread(target=lambda: flushed.append(producer.flush(timeout=10)))
            flusher.start()
            flusher.join()

    producer._intake = _FlushingIntake()
    with pytest.raises(InvalidArgumentError, match="closed"):
        producer.send("late")
    assert flushed == [True]


def test_pending_entries_stay_within_max_pending_and_one_per_sender(store: Store) -> None:
    """Sends check for room without the lock: each may pass once beside the others, no more."""
    queue = store.new_queue(capacity=2000, slots_per_record=100, appends="reserve")  # max_batch fits
    appended = [0]

    def slow_append(entries: list[Any], **options: Any) -> range:
        time.sleep(0.002)  # a round trip's time, so that sends wait for room
        appended[0] += len(entries)
        return range(appended[0] - len(entries), appended[0])

    queue._append_checked = slow_append  # type: ignore[method-assign,assignment]
    threads, limit = 4, queue.capacity
    producer = queue.producer(linger=0.001, max_batch=limit, max_pending=limit)
    worst = [0]
    take = producer._take

    def taking(count: int) -> Any:
        taken = take(count)  # under the lock: pending is what waits, plus taken and unresolved
        worst[0] = max(worst[0], len(producer._intake) + producer._taken - producer._resolved)
        return taken

    producer._take = taking  # type: ignore[method-assign]
    until = time.monotonic() + 1.0

    def sending() -> None:
        while time.monotonic() < until:
            producer.send(1)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a send may stop between any two bytecodes, as on a busy machine
    try:
        senders = [threading.Thread(target=sending) for _ in range(threads)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(30)
    finally:
        sys.setswitchinterval(interval)
    assert producer.close(timeout=10) is True
    assert appended[0] > 4 * limit  # sends waited for room many times
    assert worst[0] <= limit + threads


def _answers_in_a_child(calls: list[Callable[[], object]], refusal: str) -> str:
    """What each call answers in a forked child, joined by commas (the child must exit 0).

    A call's answer: the str it returns, "answered" for anything else,
    "refused" for an ``InvalidArgumentError`` whose message holds
    ``refusal`` (another one's message), or any other exception's repr.
    """
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:
        said = []
        for call in calls:
            try:
                answer = call()
                said.append(answer if isinstance(answer, str) else "answered")
            except InvalidArgumentError as exc:
                said.append("refused" if refusal in str(exc) else str(exc))
            except BaseException as exc:
                said.append(repr(exc))
        os.write(writing, ",".join(said).encode())
        os._exit(0)
    os.close(writing)
    _, status = os.waitpid(child, 0)
    with os.fdopen(reading) as answer:
        assert status == 0
        return answer.read()


def test_a_producer_used_in_a_forked_child_refuses_instead_of_never_resolving(store: Store) -> None:
    queue = store.new_queue()
    with queue.producer(linger=0.0) as producer:
        assert producer.send("parent").result(timeout=5) == 0
        # the child's copy of the producer has no thread
        calls = [lambda: producer.send("child"), lambda: producer.flush(timeout=1)]
        said = _answers_in_a_child([*calls, lambda: str(producer.close(timeout=1))], "fork")
        assert said == "refused,refused,False"
        assert producer.send("parent again").result(timeout=5) == 1  # the parent's goes on
    assert queue.info().size == 2


def _run_program(program: str) -> tuple[float, str]:
    """Run ``program`` in a new interpreter: seconds it took, and its stderr (it must exit 0)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return time.monotonic() - started, done.stderr


def test_a_producer_left_open_writes_at_once_when_the_program_ends_whatever_its_linger(place: Place) -> None:
    name = place.name("left-lingering")
    Queue.create(place.connect(), name, capacity=12, slots_per_record=3, appends="reserve")
    opened = _run_program(f"import large_queue\nlarge_queue.Queue.open({place.url!r}, {name!r})\n")[0]
    took, said = _run_program(
        "import large_queue\n"
        f"queue = large_queue.Queue.open({place.url!r}, {name!r})\n"
        "queue.producer(linger=60).send('left open')\n"
    )
    assert took < opened + 5  # not the linger's 60 s
    assert "was not closed and the program is ending: writing the 1 entries" in said
    assert [entry.value for entry in drain(Queue.open(place.connect(), name))] == ["left open"]


def test_a_batch_that_fails_as_the_program_ends_is_logged(place: Place) -> None:
    name = place.name("left-full")
    queue = Queue.create(place.connect(), name, capacity=3, slots_per_record=3, appends="reserve")
    queue.enqueue_batch([1, 2, 3])
    _, said = _run_program(
        "import large_queue\n"
        f"queue = large_queue.Queue.open({place.url!r}, {name!r})\n"
        "queue.producer(linger=0.05).send('no room')\n"
    )
    assert "could not write 1 entries sent before the program ended: QueueFullError" in said
    assert [entry.value for entry in drain(queue)] == [1, 2, 3]


def test_threads_that_outlive_the_main_thread_can_still_send(place: Place) -> None:
    """The program has not ended while a thread it waits for may send: producers stay open for it."""
    name = place.name("outlived")
    Queue.create(place.connect(), name, capacity=12, slots_per_record=3, appends="reserve")
    _run_program(
        "import threading, time, large_queue\n"
        f"queue = large_queue.Queue.open({place.url!r}, {name!r})\n"
        "early = queue.producer(linger=0.01)\n"
        "def work():\n"
        "    time.sleep(1.0)  # the main thread has ended, and its producer's thread looked\n"
        "    assert early.send('early').result(timeout=10) == 0\n"
        "    with queue.producer(linger=0.01) as late:\n"
        "        assert late.send('late').result(timeout=10) == 1\n"
        "    print('sent')\n"
        "threading.Thread(target=work).start()\n"
    )
    assert [entry.value for entry in drain(Queue.open(place.connect(), name))] == ["early", "late"]


def test_a_producer_closed_by_the_programs_end_says_why_it_refuses(place: Place) -> None:
    """An exit handler runs once the threads the program waits for have ended: the producer has closed."""
    name = place.name("ended")
    Queue.create(place.connect(), name, capacity=12, slots_per_record=3, appends="reserve")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import atexit, large_queue\n"
            f"queue = large_queue.Queue.open({place.url!r}, {name!r})\n"
            "producer = queue.producer(linger=0.01)\n"
            "def late():\n"
            "    try:\n"
            "        producer.send('late')\n"
            "    except large_queue.InvalidArgumentError as exc:\n"
            "        print(exc)\n"
            "atexit.register(late)\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "is closed: it sends nothing more (the program's main thread ended" in done.stdout
    assert Queue.open(place.connect(), name).info().size == 0


def _divide_by_zero(done: OffsetFuture) -> None:
    1 / 0  # noqa: B018 -- raises


def _exit(done: OffsetFuture) -> None:
    sys.exit("from a callback")


@pytest.mark.parametrize(("failing", "told"), [(_divide_by_zero, "ZeroDivisionError"), (_exit, "SystemExit")])
def test_a_callback_that_raises_is_logged_and_the_others_run(
    store: Store, caplog: pytest.LogCaptureFixture, failing: Callable[[OffsetFuture], None], told: str
) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    ran: list[int] = []
    with queue.producer(linger=NEVER) as producer:
        futures = [producer.send(value) for value in range(3)]
        futures[0].add_done_callback(failing)
        for future in futures:  # the first's after the one that raises
            future.add_done_callback(lambda done: ran.append(done.result()))
        assert producer.flush(timeout=10) is True
        last = producer.send(3)
        assert producer.flush(timeout=10) is True
        assert last.result(timeout=0) == 3  # the producer goes on
    assert ran == [0, 1, 2]
    assert "a callback of" in caplog.text and told in caplog.text


def test_a_callback_that_would_wait_for_its_own_producer_is_refused_and_the_producer_goes_on(
    store: Store,
) -> None:
    """flush, close, waiting for a later entry or for room, from a callback: each would wait for the
    producer's own thread (a flush hung it for good, and the program with it), so each raises."""
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    raised: list[BaseException] = []
    with queue.producer(linger=NEVER, max_pending=2, max_batch=1) as producer:
        later: list[OffsetFuture] = []

        def misuse(_: OffsetFuture) -> None:
            for call in (
                lambda: producer.flush(),
                lambda: producer.close(),
                lambda: later[0].result(),
                lambda: [producer.send("fill") for _ in range(3)],  # full at the 2nd or 3rd: waits for room
            ):
                try:
                    call()
                except InvalidArgumentError as exc:
                    raised.append(exc)

        first = producer.send("a")
        first.add_done_callback(misuse)
        later.append(producer.send("b"))
        assert producer.flush(timeout=10) is True
        assert first.result(timeout=0) == 0
        last = producer.send("c")
        assert producer.flush(timeout=10) is True
        assert last.result(timeout=0) >= 1  # the producer goes on
    assert [str(exc).split(": ")[-1] for exc in raised] == [
        "callbacks run in its thread, which would wait for itself (hand the work to another thread)"
    ] * 4
    assert all("cannot" in str(exc) for exc in raised)


def test_a_callback_added_to_a_resolved_future_runs_at_once_and_what_it_raises_is_logged(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    queue = store.new_queue()
    with queue.producer(linger=NEVER) as producer:
        future = producer.send("a")
        assert producer.flush(timeout=10) is True
        assert future.result(timeout=0) == 0
        ran: list[int] = []
        future.add_done_callback(lambda done: ran.append(done.result()))
        future.add_done_callback(lambda _: 1 / 0)  # logged, as concurrent.futures does
        assert ran == [0] and "ZeroDivisionError" in caplog.text
        with pytest.raises(InvalidArgumentError, match="a done callback is a callable, got None"):
            future.add_done_callback(None)  # type: ignore[arg-type]
        pending = producer.send("b")
        with pytest.raises(InvalidArgumentError, match="a done callback is a callable"):
            pending.add_done_callback("not callable")  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [-1, "1", math.nan, math.inf, True])
def test_bad_timeouts_are_refused_before_anything_changes(store: Store, timeout: Any) -> None:
    queue = store.new_queue()
    with queue.producer(linger=NEVER) as producer:
        future = producer.send("a")
        for call in (producer.flush, producer.close, future.result, future.exception):
            with pytest.raises(InvalidArgumentError, match="timeout must be a number of seconds"):
                call(timeout)
        assert not future.done()  # neither flushed nor closed
        second = producer.send("b")
        assert producer.flush(timeout=10) is True
    assert future.result(timeout=0) == 0 and second.result(timeout=0) == 1


@pytest.mark.parametrize("encoding", ["native", "msgpack", "json"])
def test_an_entry_changed_after_it_was_sent_is_written_as_it_was_sent(store: Store, encoding: str) -> None:
    """Changed between send and its batch (a NUL, a value too large, an object no store holds): what
    goes is what was checked, on every store alike (Aerospike had cut the str at its NUL)."""
    queue = store.new_queue(encoding=encoding)
    with queue.producer(linger=NEVER) as producer:
        listed: list[Any] = ["ok"]
        mapped: dict[str, Any] = {"k": 1}
        futures = [producer.send(listed), producer.send(mapped)]
        listed.append("a\x00b")
        mapped["k"] = object()
        mapped["big"] = b"y" * (queue.max_entry_bytes * 3)
        assert producer.flush(timeout=10) is True
    assert [future.result(timeout=0) for future in futures] == [0, 1]
    assert [entry.value for entry in queue.dequeue_batch(2)] == [["ok"], {"k": 1}]


def test_an_entry_sent_alone_is_named_as_the_entry_when_refused(store: Store) -> None:
    queue = store.new_queue(encoding="native")
    with queue.producer() as producer, pytest.raises(UnsupportedEntryError, match=r"^the entry is a tuple"):
        producer.send((1, 2))
    with pytest.raises(UnsupportedEntryError, match=r"^the entry\['k'\] is a str holding a NUL"):
        queue.enqueue({"k": "a\x00"})
    with pytest.raises(EntryTooLargeError, match=r"^the entry is \d+ bytes as stored"):
        queue.enqueue("x" * queue.max_entry_bytes)
    with pytest.raises(UnsupportedEntryError, match=r"^entry 1 is a tuple"):
        queue.enqueue_batch(["fine", (1, 2)])


def test_futures_left_unresolved_by_a_fork_refuse_in_the_child(store: Store) -> None:
    queue = store.new_queue()
    with queue.producer(linger=NEVER) as producer:
        resolved = producer.send("before")
        assert producer.flush(timeout=10) is True
        waiting = producer.send("at the fork")
        # in the child: the producer's thread, and what it sends, stayed in the parent
        calls = [
            lambda: str(resolved.result(timeout=1)),
            lambda: waiting.result(timeout=1),
            lambda: waiting.exception(timeout=1),  # no hang if it waited instead
            lambda: waiting.add_done_callback(print),
        ]
        assert _answers_in_a_child(calls, "known in that process only") == "0,refused,refused,refused"
    assert waiting.result(timeout=0) == 1  # the parent's resolved


@pytest.fixture(params=APPENDS)
def faulty(store: Store, request: pytest.FixtureRequest) -> tuple[Queue, FaultInjectingBackend]:
    """A queue (in each append mode) on a handle that loses the replies of its next 3 settling writes.

    The writes are applied; what settles an append is a publish, or (appends
    under the lock) the commit: a plain append gives up after 3 such attempts.
    """
    queue = store.new_queue(capacity=12, slots_per_record=3, appends=request.param, lock_ttl=0.5)
    backend = FaultInjectingBackend(store.backend)
    settling = "is_buffer" if request.param == "reserve" else "is_commit"
    backend.inject(lambda call: bool(getattr(call, settling)), applied=True, times=3)
    return Queue.open(backend, queue.name), backend


def test_an_idempotent_producer_sends_a_batch_in_doubt_again_and_it_is_in_the_queue_once(
    faulty: tuple[Queue, FaultInjectingBackend],
) -> None:
    queue, backend = faulty
    with queue.producer(linger=NEVER, idempotent=True) as producer:
        futures = [producer.send(value) for value in ("a", "b")]
    assert [future.result(timeout=0) for future in futures] == [0, 1]
    assert futures[0].txn_id is not None and futures[0].txn_id == futures[1].txn_id
    assert backend.injected >= 2  # at least one attempt gave up (as the plain producer's does, below)
    backend._faults.clear()
    stats = queue.stats()
    assert (stats.enqueue_calls, stats.entries_enqueued) == (1, 2)  # settled, whichever attempt applied it
    assert [entry.value for entry in drain(queue)] == ["a", "b"]


def test_a_plain_producer_fails_a_batch_in_doubt_and_an_idempotent_ones_outcome_can_be_asked(
    store: Store, faulty: tuple[Queue, FaultInjectingBackend]
) -> None:
    queue, backend = faulty
    with queue.producer(linger=NEVER) as producer:
        plain = producer.send("plain")
    with pytest.raises((OutcomeUnknownError, BackendTimeoutError)):
        plain.result(timeout=0)
    assert plain.txn_id is None

    # an idempotent producer gives up after IN_DOUBT_ATTEMPTS, every one of them lost
    backend.inject(lambda call: True, applied=True, times=1000)
    with queue.producer(linger=NEVER, idempotent=True) as producer:
        lost = producer.send("in doubt")
    with pytest.raises((OutcomeUnknownError, BackendTimeoutError)):
        lost.result(timeout=0)
    backend._faults.clear()
    # the queue's receipts know the batch by the future's txn id: in the queue, or reserved and
    # not published (a reader closes it after the hole timeout), never unknown to them
    assert lost.txn_id is not None and queue.outcome(lost.txn_id).state in ("committed", "pending")
    store.advance(1.0)  # appending under the lock, an acquire whose reply was lost holds it until then
    values = [entry.value for entry in drain(queue)]
    assert values.count("plain") == 1 and values.count("in doubt") <= 1


def test_idempotent_must_be_a_bool(store: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="idempotent"):
        store.new_queue().producer(idempotent="yes")  # type: ignore[arg-type]


class _PushedOutBeforeRead(Delegating):
    """A store that runs ``meanwhile`` once, just before the next ``get`` (the caller is paused there)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.meanwhile: Callable[[], object] | None = None

    def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "get" and self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()
        return super().relay(method, *args, **kwargs)


def test_a_refusal_for_a_receipt_that_left_the_log_since_is_unknown_not_a_full_queue(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve", receipts=2)
    assert queue.enqueue_batch(["mine"], txn_id="first") == range(0, 1)
    paused = _PushedOutBeforeRead(store.backend)
    again = Queue.open(paused, queue.name)
    # refused for the receipt; before the refusal is explained, two calls push the receipt out
    paused.meanwhile = lambda: [queue.enqueue("other", txn_id=f"other-{n}") for n in range(2)]
    with pytest.raises(
        OutcomeUnknownError, match=r"the queue was full then \(it has room now\), or the receipt"
    ):
        again.enqueue_batch(["mine"], txn_id="first")
    assert [entry.value for entry in drain(queue)] == ["mine", "other", "other"]


class _AppliedThenLost(Delegating):
    """A store whose next settling write (a publish, or a commit) is applied, then fails with ``error``.

    ``meanwhile`` runs between the two, as other clients' calls would.
    """

    def __init__(
        self, inner: Backend, appends: str, error: Exception, meanwhile: Callable[[], object] | None = None
    ) -> None:
        super().__init__(inner)
        self.settling = "is_buffer" if appends == "reserve" else "is_commit"
        self.error: Exception | None = error
        self.meanwhile = meanwhile

    def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = super().relay(method, *args, **kwargs)
        if self.error is not None and method in ("operate", "operate_each"):
            key = args[0][0][0] if method == "operate_each" else args[0]
            operations = () if method == "operate_each" else tuple(args[1])
            if getattr(Call(method, key, operations), self.settling):
                error, self.error = self.error, None
                if self.meanwhile is not None:
                    self.meanwhile()
                raise error
        return result


@pytest.mark.parametrize("appends", APPENDS)
def test_an_idempotent_producer_sends_again_a_batch_any_error_left_in_doubt(
    store: Store, appends: str
) -> None:
    made = store.new_queue(capacity=12, slots_per_record=3, appends=appends)
    lost = BackendUnavailableError("the connection dropped", code=-10, in_doubt=True)
    queue = Queue.open(_AppliedThenLost(store.backend, appends, lost), made.name)
    with queue.producer(linger=NEVER, idempotent=True) as producer:
        futures = [producer.send(value) for value in ("a", "b")]
    assert [future.result(timeout=0) for future in futures] == [0, 1]
    assert [entry.value for entry in drain(made)] == ["a", "b"]


@pytest.mark.parametrize("appends", APPENDS)
def test_an_idempotent_producer_does_not_send_again_a_batch_whose_receipt_left_the_log(
    store: Store, appends: str
) -> None:
    """Sent again without its receipt, an applied batch would be enqueued twice: it fails instead."""
    made = store.new_queue(capacity=12, slots_per_record=3, appends=appends, receipts=2)

    def others() -> None:  # two calls with txn ids push the batch's receipt out of the log
        for n in range(2):
            made.enqueue("other", txn_id=f"other-{n}")

    # (a timeout of a publish would be sent again by the publish itself, which finds its entries)
    lost = BackendUnavailableError("the connection dropped", code=-10, in_doubt=True)
    queue = Queue.open(_AppliedThenLost(store.backend, appends, lost, others), made.name)
    with queue.producer(linger=NEVER, idempotent=True) as producer:
        mine = producer.send("mine")
    with pytest.raises(OutcomeUnknownError, match="receipt log no longer tells"):
        mine.result(timeout=0)
    assert [entry.value for entry in drain(made)] == ["mine", "other", "other"]  # once


@pytest.mark.parametrize(
    ("setting", "program"),
    [
        (  # made lazily in a daemon thread (a request handler's, say): its thread is not one
            "daemon",
            "import threading\n"
            "def handle():\n"
            "    queue.producer(linger=3600).send('from a daemon thread')\n"
            "worker = threading.Thread(target=handle, daemon=True)\n"
            "worker.start(); worker.join()\n",
        ),
        (  # made by an exit handler, which runs once the program's threads ended: the handler closes it
            "atexit",
            "import atexit\n"
            "def at_exit():\n"
            "    with queue.producer(linger=0.01) as late:\n"
            "        late.send('from an exit handler').result(timeout=10)\n"
            "atexit.register(at_exit)\n",
        ),
        (  # one producer's callback sends to another: both left open, both written
            "chain",
            "first = queue.producer(linger=3600)\n"
            "second = queue.producer(linger=3600)\n"
            "first.send('first').add_done_callback(lambda done: second.send('from a callback'))\n",
        ),
    ],
)
def test_what_was_sent_is_written_at_the_programs_end(place: Place, setting: str, program: str) -> None:
    name = place.name(f"end-{setting}")
    Queue.create(place.connect(), name, capacity=12, slots_per_record=3, appends="reserve")
    _, said = _run_program(
        f"import large_queue\nqueue = large_queue.Queue.open({place.url!r}, {name!r})\n{program}"
    )
    values = [entry.value for entry in drain(Queue.open(place.connect(), name))]
    assert (
        values
        == {
            "daemon": ["from a daemon thread"],
            "atexit": ["from an exit handler"],
            "chain": ["first", "from a callback"],
        }[setting]
    ), said
    assert "raised" not in said


def test_linger_counts_from_the_oldest_waiting_entry_not_the_newest(store: Store) -> None:
    """A steady trickle of sends, each sooner than the linger after the last, still goes every linger."""
    queue = store.new_queue(capacity=500, slots_per_record=50, appends="reserve")
    with queue.producer(linger=0.2, max_batch=500) as producer:
        first = producer.send(0)
        began = time.monotonic()
        while not first.done() and time.monotonic() - began < 1.5:
            producer.send(1)
            time.sleep(0.01)
        assert first.done()  # within about 0.2 s, not when the sends stop
        assert first.result(timeout=0) == 0


def test_sends_and_flushes_wake_the_producer_thread_at_once(
    gated: tuple[Queue, Gate], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producer thread is woken, not found by its next look at the program's end."""
    queue, gate = gated
    gate.opened.set()
    monkeypatch.setattr(producer_module, "_IDLE_CHECK_SECONDS", 30.0)  # no looks during the test
    with queue.producer(linger=0) as producer:
        time.sleep(0.05)  # the thread waits idle
        assert producer.send("alone").result(timeout=2) == 0  # a first entry
    with queue.producer(linger=NEVER, max_batch=2) as producer:
        full = [producer.send("full")]
        time.sleep(0.05)  # the thread lingers, one entry short of a full batch
        full.append(producer.send("batch"))
        assert [future.result(timeout=2) for future in full] == [1, 2]  # a full batch
        lingering = producer.send("flushed")
        time.sleep(0.05)  # the thread lingers
        assert producer.flush(timeout=2) is True  # a flush
        assert lingering.result(timeout=0) == 3


def test_entries_waiting_past_max_batch_go_in_batches_of_max_batch(gated: tuple[Queue, Gate]) -> None:
    queue, gate = gated
    held = queue._append_checked
    sizes: list[int] = []

    def sizing(entries: list[Any], **options: Any) -> range:
        sizes.append(len(entries))
        return held(entries, **options)

    queue._append_checked = sizing  # type: ignore[method-assign,assignment]
    with queue.producer(linger=NEVER, max_batch=2) as producer:
        futures = [producer.send("a"), producer.send("b")]  # a full batch: taken, held at the gate
        while gate.calls == 0:
            time.sleep(0.001)
        futures += [producer.send(value) for value in "cde"]  # three wait behind it
        gate.opened.set()
    assert [future.result(timeout=0) for future in futures] == [0, 1, 2, 3, 4]
    assert sizes == [2, 2, 1]


def test_a_future_waiting_to_be_taken_is_woken_when_its_batch_is_taken(store: Store) -> None:
    queue = store.new_queue()
    with queue.producer(linger=NEVER) as producer:
        future = producer.send("a")
        answers: list[int | BaseException] = []

        def waiting() -> None:
            try:
                answers.append(future.result(timeout=5))
            except BaseException as exc:  # the test looks at it
                answers.append(exc)

        waiter = threading.Thread(target=waiting)
        waiter.start()
        time.sleep(0.05)  # the waiter waits for the entry to be taken into a batch
        began = time.monotonic()
        assert producer.flush(timeout=5) is True
        waiter.join(5)
        assert answers == [0] and time.monotonic() - began < 2


def test_a_future_is_not_done_while_its_batch_is_being_appended(gated: tuple[Queue, Gate]) -> None:
    queue, gate = gated
    with queue.producer(linger=0) as producer:
        future = producer.send("a")
        while gate.calls == 0:  # taken into a batch, whose append waits at the gate
            time.sleep(0.001)
        assert not future.done() and future.txn_id is None
        assert "pending" in repr(future)
        with pytest.raises(TimeoutError):
            future.exception(timeout=0.01)
        gate.opened.set()
        assert future.result(timeout=5) == 0 and future.done()


def test_in_a_forked_child_resolved_futures_answer_and_taken_unresolved_ones_refuse(
    gated: tuple[Queue, Gate],
) -> None:
    queue, gate = gated
    gate.opened.set()
    with queue.producer(linger=0) as producer:
        resolved = producer.send("before")
        assert resolved.result(timeout=5) == 0
        gate.opened.clear()
        calls = gate.calls
        taken = producer.send("at the fork")
        while gate.calls == calls:  # taken into a batch, whose append waits at the gate
            time.sleep(0.001)
        # in the child: the batch being appended, and its outcome, stay in the parent
        called: list[int] = []
        calls = [
            lambda: str(resolved.exception(timeout=1)),
            lambda: str(resolved.add_done_callback(lambda done: called.append(done.result()))),
            lambda: taken.exception(timeout=0.5),
            lambda: taken.result(timeout=0.5),
            lambda: taken.add_done_callback(print),
            lambda: repr(called),
        ]
        said = _answers_in_a_child(calls, "known in that process only")
        assert said == "None,None,refused,refused,refused,[0]"
        gate.opened.set()
    assert taken.result(timeout=0) == 1  # the parent's resolved


def test_every_batch_of_every_idempotent_producer_has_a_txn_id_of_its_own(store: Store) -> None:
    """A txn id used again would be answered by the receipt of the batch that had it: a batch lost."""
    queue = store.new_queue()
    with queue.producer(linger=NEVER, idempotent=True) as producer:
        first = producer.send("a")
        assert producer.flush(timeout=10) is True
        second = producer.send("b")
    with queue.producer(linger=NEVER, idempotent=True) as other:
        third = other.send("c")
    futures = [first, second, third]
    assert [future.result(timeout=0) for future in futures] == [0, 1, 2]
    assert len({future.txn_id for future in futures}) == 3
    assert [entry.value for entry in drain(queue)] == ["a", "b", "c"]


def _failing_appends(queue: Queue, errors: list[BaseException]) -> list[int]:
    """Make the queue's appends raise ``errors`` one by one, then go through; the number of each call."""
    append = queue._append_checked
    calls: list[int] = []

    def failing(entries: list[Any], **options: Any) -> range:
        calls.append(len(calls) + 1)
        if errors:
            raise errors.pop(0)
        return append(entries, **options)

    queue._append_checked = failing  # type: ignore[method-assign,assignment]
    return calls


@pytest.mark.parametrize("in_doubt", ["outcome unknown", "timeout"])
def test_an_idempotent_producer_sends_again_after_either_error_in_doubt(store: Store, in_doubt: str) -> None:
    queue = store.new_queue()

    def error() -> BaseException:
        if in_doubt == "timeout":
            return BackendTimeoutError("timed out", code=9)  # a timeout is in doubt, flagged or not
        return OutcomeUnknownError("lost reply")

    calls = _failing_appends(queue, [error()])
    with queue.producer(linger=NEVER, idempotent=True) as producer:
        future = producer.send("a")
    assert future.result(timeout=0) == 0 and calls == [1, 2]
    queue = store.new_queue()
    calls = _failing_appends(queue, [error() for _ in range(10)])
    began = time.monotonic()
    with queue.producer(linger=NEVER, idempotent=True) as producer:
        lost = producer.send("lost")
    assert len(calls) == producer_module.IN_DOUBT_ATTEMPTS  # and no more
    assert time.monotonic() - began >= 0.5  # backing off between them: 0.1 + 0.2 + 0.4 s
    with pytest.raises((OutcomeUnknownError, BackendTimeoutError)):
        lost.result(timeout=0)


@pytest.mark.parametrize("unanswered", [1, producer_module.IN_DOUBT_ATTEMPTS])
def test_an_idempotent_producer_sends_a_batch_in_doubt_again_only_once_the_receipts_answer(
    store: Store, unanswered: int
) -> None:
    queue = store.new_queue()
    calls = _failing_appends(queue, [OutcomeUnknownError("lost reply")])
    asked: list[str] = []
    outcome = queue.outcome

    def unreadable(txn_id: str | int, *, within: float | None = None) -> Any:
        asked.append(str(txn_id))
        if len(asked) <= unanswered:
            raise BackendTimeoutError("the store did not answer", code=9)
        return outcome(txn_id, within=within)

    queue.outcome = unreadable  # type: ignore[method-assign]
    with queue.producer(linger=NEVER, idempotent=True) as producer:
        future = producer.send("a")
    if unanswered < producer_module.IN_DOUBT_ATTEMPTS:  # asked again: not committed, so sent again
        assert future.result(timeout=0) == 0 and calls == [1, 2] and len(asked) == unanswered + 1
    else:  # never answered: not sent again blind, which could enqueue it twice
        with pytest.raises(OutcomeUnknownError, match="receipts could not be read") as raised:
            future.result(timeout=0)
        assert isinstance(raised.value.__cause__, OutcomeUnknownError) and calls == [1]
        assert len(asked) == unanswered and queue.info().size == 0


def test_an_idempotent_producer_whose_receipts_answer_with_an_error_leaves_the_batch_in_doubt(
    store: Store,
) -> None:
    queue = store.new_queue()
    calls = _failing_appends(queue, [OutcomeUnknownError("lost reply")])

    def failing(txn_id: str | int, *, within: float | None = None) -> Any:
        raise BackendError("aerospike error 1: server error", code=1)  # an answer, and not a useful one

    queue.outcome = failing  # type: ignore[method-assign]
    with queue.producer(linger=NEVER, idempotent=True) as producer:
        future = producer.send("a")
    with pytest.raises(OutcomeUnknownError, match="receipts could not be read") as raised:
        future.result(timeout=0)  # not the bare BackendError, which would not say it may be in
    assert calls == [1] and "server error" in str(raised.value)


def test_an_idempotent_producer_does_not_send_again_a_batch_refused_for_sure(store: Store) -> None:
    queue = store.new_queue(capacity=3, slots_per_record=3)
    queue.enqueue_batch([0, 1, 2])
    calls = _failing_appends(queue, [])
    with queue.producer(linger=NEVER, idempotent=True) as producer:
        refused = producer.send("no room")
    with pytest.raises(QueueFullError):
        refused.result(timeout=0)
    assert calls == [1]


def _run_briefly(program: str) -> str:
    """Run ``program`` in a new interpreter, which must exit 0 within 20 s; its stderr."""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_program_ends_though_daemon_threads_and_other_producers_live_on(place: Place) -> None:
    """Daemon threads, and other producers' threads, cannot send: they do not hold producers open."""
    name = place.name("left-two")
    Queue.create(place.connect(), name, capacity=12, slots_per_record=3, appends="reserve")
    said = _run_briefly(
        "import threading, time, large_queue\n"
        f"queue = large_queue.Queue.open({place.url!r}, {name!r})\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
        "queue.producer(linger=60).send('one')\n"
        "queue.producer(linger=60).send('two')\n"
    )
    assert said.count("was not closed and the program is ending") == 2
    values = [entry.value for entry in drain(Queue.open(place.connect(), name))]
    assert sorted(values) == ["one", "two"]


def test_a_producer_lingering_when_the_main_thread_ends_writes_within_a_moment(place: Place) -> None:
    """Its thread, waiting out a long linger, looks at the program's end every moment meanwhile."""
    name = place.name("left-lingering-long")
    Queue.create(place.connect(), name, capacity=12, slots_per_record=3, appends="reserve")
    began = time.monotonic()
    said = _run_briefly(
        "import time, large_queue\n"
        f"queue = large_queue.Queue.open({place.url!r}, {name!r})\n"
        "queue.producer(linger=60).send('left open')\n"
        "time.sleep(0.3)  # its thread has taken a look, and lingers\n"
    )
    assert time.monotonic() - began < 15  # not the linger's 60 s
    assert "writing the 1 entries sent to it first" in said
    assert [entry.value for entry in drain(Queue.open(place.connect(), name))] == ["left open"]


def test_close_wakes_a_blocked_send_at_once_while_a_batch_is_held(gated: tuple[Queue, Gate]) -> None:
    queue, gate = gated
    producer = queue.producer(linger=0, max_pending=1)
    held = producer.send("a")
    while gate.calls == 0:  # its batch is held at the gate
        time.sleep(0.001)
    raised: list[BaseException] = []

    def sending() -> None:
        try:
            producer.send("b")
        except BaseException as exc:  # the test looks at it
            raised.append(exc)

    blocked = threading.Thread(target=sending)
    blocked.start()
    time.sleep(0.05)  # waiting for room
    assert producer.close(timeout=0.05) is False
    blocked.join(2)  # woken by close, not by the held batch resolving (the gate stays shut)
    assert not blocked.is_alive() and len(raised) == 1 and isinstance(raised[0], InvalidArgumentError)
    gate.opened.set()
    assert producer.close(timeout=10) is True and held.result(timeout=0) == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's end, shown
def test_a_send_that_appends_after_the_producer_thread_died_raises(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The send checked for closing, then the thread died in an append, then the send appended."""
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")

    def dying(entries: list[Any], **options: Any) -> range:
        raise SystemExit(3)  # something no append error is: the thread itself ends

    queue._append_checked = dying  # type: ignore[method-assign,assignment]
    producer = queue.producer(linger=NEVER)
    first = producer.send("a")

    class _LateFuture(OffsetFuture):
        """Made by a send past its closing check, before its append: the thread dies meanwhile."""

        def __init__(self, producer: Producer) -> None:
            super().__init__(producer)
            assert producer.flush(timeout=10) is True  # "a" goes, and the thread dies appending it
            producer._thread.join(10)

    monkeypatch.setattr(producer_module, "OffsetFuture", _LateFuture)
    with pytest.raises(InvalidArgumentError, match="thread failed"):
        producer.send("late")
    with pytest.raises(LargeQueueError, match="thread failed"):
        first.result(timeout=0)
    assert not producer._intake and producer.close(timeout=5) is True


def test_a_results_timeout_counts_its_wait_to_be_taken_too(gated: tuple[Queue, Gate]) -> None:
    queue, gate = gated
    with queue.producer(linger=NEVER) as producer:
        future = producer.send("a")
        waited: list[float] = []

        def waiting() -> None:
            began = time.monotonic()
            with pytest.raises(TimeoutError):
                future.result(timeout=1.0)
            waited.append(time.monotonic() - began)

        waiter = threading.Thread(target=waiting)
        waiter.start()
        time.sleep(0.7)  # the entry waits to be taken for most of the timeout
        producer.flush(timeout=0)  # then it is taken, and its batch held at the gate
        waiter.join(5)
        assert len(waited) == 1 and waited[0] < 1.4  # the timeout in all, not again once taken
        gate.opened.set()
    assert future.result(timeout=0) == 0


def test_a_plain_producer_sends_again_a_batch_that_timed_out_with_nothing_of_it_applied(store: Store) -> None:
    """A batch spanning records whose first part timed out at every attempt can never show (readers
    show it only with its last record): a timeout not in doubt, which the producer sends again."""
    queue = store.new_queue(capacity=12, slots_per_record=3)
    backend = FaultInjectingBackend(store.backend)
    faulty = Queue.open(backend, queue.name)
    faulty.enqueue("x")  # the batch 1..4 spans records 0 and 1
    backend.inject(lambda call: call.is_buffer and call.key.user_key.endswith("-0"), applied=True, times=3)
    with faulty.producer(linger=NEVER, max_batch=4) as producer:
        futures = [producer.send(value) for value in "abcd"]
        producer.flush()
    assert [future.result(timeout=0) for future in futures] == [5, 6, 7, 8]  # taken anew, once
    assert [entry.value for entry in drain(faulty)] == ["x", "a", "b", "c", "d"]
