"""Outcome receipts: idempotent enqueue, repeated dequeue and outcome lookup by txn id, on both stores."""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from large_queue import (
    EntriesGoneError,
    InvalidArgumentError,
    LockLostError,
    OutcomeUnknownError,
    Queue,
    QueueFullError,
    _txn,
)
from large_queue import _records as rec
from large_queue.appends import ATTEMPTS
from large_queue.backends._delegating import Delegating
from large_queue.backends.faults import FaultInjectingBackend
from large_queue.errors import BackendTimeoutError, ConditionNotMetError
from tests.fix_backends import Store

APPENDS = ["reserve", "lock"]


def _values(queue: Queue) -> list[object]:
    info = queue.info()
    return [e.value for e in map(queue.get, range(info.head_offset, info.tail_offset)) if e]


def _faulty(store: Store, **options: object) -> tuple[FaultInjectingBackend, Queue]:
    queue = store.new_queue(capacity=12, slots_per_record=3, **options)
    backend = FaultInjectingBackend(store.backend)
    return backend, Queue.open(backend, queue.name)


@pytest.mark.parametrize("appends", APPENDS)
def test_the_same_txn_id_enqueues_once_and_answers_with_the_first_offsets(store: Store, appends: str) -> None:
    queue = store.new_queue(appends=appends)
    assert queue.enqueue("a", txn_id="t1") == 0
    assert queue.enqueue("a", txn_id="t1") == 0
    assert queue.enqueue_batch(["b", "c", "d", "e"], txn_id=7) == range(1, 5)  # spans two records
    assert queue.enqueue_batch(["b", "c", "d", "e"], txn_id=7) == range(1, 5)
    assert queue.enqueue("f") == 5 and queue.enqueue("f") == 6  # no txn id: no receipt, no dedup
    assert _values(queue) == ["a", "b", "c", "d", "e", "f", "f"]
    assert queue.stats().repeats_answered == 2
    with pytest.raises(InvalidArgumentError, match="already names a enqueue of 4 entries"):
        queue.enqueue_batch(["b", "c"], txn_id=7)
    outcome = queue.outcome("7")
    assert outcome.committed and outcome.receipt is not None
    assert (outcome.receipt.operation, outcome.receipt.offsets) == ("enqueue", range(1, 5))
    assert abs(outcome.receipt.at_ms - time.time() * 1000) < 120_000  # the store's clock, near ours
    assert queue.outcome("never").state == "not committed"


@pytest.mark.parametrize("appends", APPENDS)
def test_a_repeated_dequeue_returns_the_first_calls_entries_and_removes_no_more(
    store: Store, appends: str
) -> None:
    queue = store.new_queue(appends=appends)
    queue.enqueue_batch(["a", "b", "c", "d"])
    first = queue.dequeue_batch(2, txn_id="d1")
    again = queue.dequeue_batch(2, txn_id="d1")
    assert [e.value for e in first] == [e.value for e in again] == ["a", "b"]
    assert [e.offset for e in again] == [0, 1]
    assert queue.dequeue(txn_id="d2").value == "c"  # type: ignore[union-attr]
    assert queue.dequeue(txn_id="d2").value == "c"  # type: ignore[union-attr]
    assert _values(queue) == ["d"]
    assert queue.outcome("d1").receipt.operation == "dequeue"  # type: ignore[union-attr]
    with pytest.raises(InvalidArgumentError, match="already names a dequeue"):
        queue.enqueue("x", txn_id="d1")
    assert queue.dequeue(txn_id="empty") is not None  # "d" left
    assert queue.dequeue(txn_id="empty2") is None
    assert queue.outcome("empty2").state == "not committed"  # an empty dequeue leaves no receipt


def test_a_repeated_dequeue_whose_entries_were_erased_says_so(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=6, slots_per_record=3)
    queue.enqueue_batch(["a", "b", "c", "d"])
    queue.dequeue_batch(2, txn_id="d1")
    queue.dequeue()  # erases the slots below the head it read, in its record
    with pytest.raises(EntriesGoneError, match="no longer stored") as caught:
        queue.dequeue_batch(2, txn_id="d1")
    assert caught.value.offsets == range(0, 2)
    assert _values(queue) == ["d"]  # nothing more was removed


@pytest.mark.parametrize("appends", APPENDS)
@pytest.mark.parametrize("applied", [True, False])
def test_an_in_doubt_enqueue_is_answered_by_outcome_and_settled_by_the_retry(
    store: Store, appends: str, applied: bool
) -> None:
    """Every attempt of the last step times out: applied (a lost reply) or not (a lost request)."""
    backend, queue = _faulty(store, appends=appends)
    if appends == "lock":  # a commit is sent again on a timeout (refused once applied), then reported unknown
        backend.inject(lambda call: call.is_commit, applied=applied, times=1 if applied else 3)
    else:  # a publish likewise
        backend.inject(lambda call: call.is_buffer, applied=applied, times=ATTEMPTS)
    if appends == "lock" and applied:  # the receipt is read back: the commit is known to be applied
        assert queue.enqueue_batch(["a", "b"], txn_id="t9") == range(0, 2)
        assert queue.stats().outcomes_unknown == 0
    else:
        with pytest.raises(OutcomeUnknownError) as caught:  # the commit's, or the publish's
            queue.enqueue_batch(["a", "b"], txn_id="t9")
        assert "queue.outcome(txn_id)" in str(caught.value) and caught.value.txn_id == "t9"
        assert caught.value.offsets == range(0, 2)
        assert queue.stats().outcomes_unknown == 1
        assert queue.outcome("t9").state == ("committed" if applied else "pending")
    started = time.monotonic()
    assert queue.enqueue_batch(["a", "b"], txn_id="t9") == range(0, 2)
    assert time.monotonic() - started < queue.lock_ttl  # its own lock is taken back at once
    assert queue.outcome("t9").state == "committed"
    assert _values(queue) == ["a", "b"]
    assert queue.info().lock_owner is None


@pytest.mark.parametrize("applied", [True, False])
def test_an_in_doubt_dequeue_retried_returns_the_same_entries(store: Store, applied: bool) -> None:
    backend, queue = _faulty(store, appends="lock")
    queue.enqueue_batch(["a", "b", "c"])
    backend.inject(lambda call: call.is_commit, applied=applied, times=1 if applied else 3)
    if applied:
        assert [e.value for e in queue.dequeue_batch(2, txn_id="d9")] == ["a", "b"]
    else:
        with pytest.raises(OutcomeUnknownError):
            queue.dequeue_batch(2, txn_id="d9")
    assert [e.value for e in queue.dequeue_batch(2, txn_id="d9")] == ["a", "b"]
    assert _values(queue) == ["c"]


def test_a_closed_reservation_is_reserved_again_by_the_retry(store: Store) -> None:
    backend, queue = _faulty(store, appends="reserve")
    backend.inject(lambda call: call.is_buffer, applied=False, times=ATTEMPTS)
    with pytest.raises(OutcomeUnknownError):
        queue.enqueue_batch(["a", "b"], txn_id="t1")
    queue.appender.close(0, 2)  # what a reader does after the hole timeout
    outcome = queue.outcome("t1")
    assert outcome.state == "not committed" and "closed" in outcome.detail
    assert queue.enqueue_batch(["a", "b"], txn_id="t1") == range(2, 4)  # new offsets; the old stay closed
    assert queue.outcome("t1").receipt.offsets == range(2, 4)  # type: ignore[union-attr]
    assert [e.value for e in queue.dequeue_batch(10)] == ["a", "b"]


@pytest.mark.parametrize("values", [["a"], ["a", "b", "c", "d"]])  # one record, and a batch spanning two
def test_a_retry_that_publishes_a_call_still_under_way_leaves_one_copy(
    store: Store, values: list[str]
) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3, appends="reserve")
    queue.enqueue_batch(["x", "y"])  # the batch of four spans records 0 and 1
    retry = Queue.open(store.backend, queue.name)  # another thread's (or process's) handle
    publish = queue.appender.publish
    answered: list[range] = []

    def paused_then_published(first: int, *args: object, **kwargs: object) -> None:
        # the first call is paused between its reservation and its publish; the retry finds
        # the receipt pending and publishes the reserved offsets itself
        if not answered:
            answered.append(retry.enqueue_batch(values, txn_id="t1"))
        publish(first, *args, **kwargs)  # type: ignore[arg-type]

    queue.appender.publish = paused_then_published  # type: ignore[method-assign]
    assert queue.enqueue_batch(values, txn_id="t1") == answered[0] == range(2, 2 + len(values))
    assert _values(queue) == ["x", "y", *values]  # once, not a second time at new offsets
    assert queue.outcome("t1").receipt.offsets == answered[0]  # type: ignore[union-attr]


def test_a_retry_whose_entry_was_consumed_and_its_slot_reused_before_the_first_call_publishes(
    store: Store,
) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends="reserve")
    retry, consumer = (Queue.open(store.backend, queue.name) for _ in range(2))
    publish = queue.appender.publish
    answered: list[range] = []

    def paused_then_published(first: int, *args: object, **kwargs: object) -> None:
        if not answered:  # the first call is paused past a whole lap of the ring
            answered.append(retry.enqueue_batch(["a"], txn_id="t1"))
            assert [e.value for e in consumer.dequeue_batch(10)] == ["a"]
            consumer.enqueue_batch([f"lap{n}" for n in range(6)])  # reuses the slot of offset 0
            assert len(consumer.dequeue_batch(10)) == 6
        publish(first, *args, **kwargs)  # type: ignore[arg-type]

    queue.appender.publish = paused_then_published  # type: ignore[method-assign]
    assert queue.enqueue_batch(["a"], txn_id="t1") == answered[0] == range(0, 1)
    assert consumer.dequeue_batch(10) == []  # "a" was consumed once, and is not enqueued again


def test_a_half_published_spanning_batch_is_finished_by_the_retry(store: Store) -> None:
    backend, queue = _faulty(store, appends="reserve")
    # the batch 1..4 spans records 0 and 1: the first record is published, the last times out
    queue.enqueue("x")
    backend.inject(
        lambda call: call.is_buffer and call.key.user_key.endswith("-1"), applied=False, times=ATTEMPTS
    )
    with pytest.raises(OutcomeUnknownError) as caught:  # the last record's publish is the batch's, in doubt
        queue.enqueue_batch(["a", "b", "c", "d"], txn_id="t1")
    assert caught.value.offsets == range(1, 5)  # the whole batch: it shows whole or not at all
    assert queue.info().tail_offset == 1  # nothing of the batch is visible
    assert queue.enqueue_batch(["a", "b", "c", "d"], txn_id="t1") == range(1, 5)
    assert _values(queue) == ["x", "a", "b", "c", "d"]


def test_a_spanning_batch_whose_first_part_times_out_is_not_in_doubt(store: Store) -> None:
    """Readers show a batch spanning records only once its last record is published, which a call
    whose first part timed out never does: nothing of it shows, and making it again is safe."""
    backend, queue = _faulty(store, appends="reserve")
    queue.enqueue("x")  # the batch 1..4 spans records 0 and 1
    backend.inject(
        lambda call: call.is_buffer and call.key.user_key.endswith("-0"), applied=True, times=ATTEMPTS
    )
    with pytest.raises(BackendTimeoutError, match="nothing of the batch is visible") as caught:
        queue.enqueue_batch(["a", "b", "c", "d"])
    assert not caught.value.in_doubt and queue.stats().outcomes_unknown == 0
    backend._faults.clear()
    again = queue.enqueue_batch(["a", "b", "c", "d"])
    assert again == range(5, 9)  # new offsets: the first reservation's last slot was closed
    assert _values(queue) == ["x", "a", "b", "c", "d"]


def test_a_spanning_batch_of_a_txn_whose_first_part_times_out_is_finished_by_the_retry(store: Store) -> None:
    """With a txn id the call can be made again, and then publishes these very offsets: in doubt until
    then (the whole batch's offsets named), and no reservation is left behind to wait out."""
    backend, queue = _faulty(store, appends="reserve")
    queue.enqueue("x")
    backend.inject(
        lambda call: call.is_buffer and call.key.user_key.endswith("-0"), applied=False, times=ATTEMPTS
    )
    with pytest.raises(OutcomeUnknownError) as caught:
        queue.enqueue_batch(["a", "b", "c", "d"], txn_id="t1")
    assert caught.value.offsets == range(1, 5) and caught.value.txn_id == "t1"
    assert queue.info().tail_offset == 1  # nothing of it shows meanwhile
    assert queue.enqueue_batch(["a", "b", "c", "d"], txn_id="t1") == range(1, 5)
    assert [entry.value for entry in queue.dequeue_batch(10)] == ["x", "a", "b", "c", "d"]  # no hole


@pytest.mark.parametrize("appends", APPENDS)
def test_a_receipt_dropped_in_the_millisecond_of_the_oldest_kept_leaves_its_call_unknown(
    store: Store, appends: str
) -> None:
    queue = store.new_queue(appends=appends, capacity=30, slots_per_record=10, receipts=3)
    began = time.monotonic()
    queue.enqueue("a", txn_id="first")
    for index in range(3):  # on the embedded store's still clock, all in one millisecond with "first"
        queue.enqueue(index, txn_id=f"other{index}")  # "first" is dropped to keep the log at 3
    store.advance(1.0)
    made = max(1.0, time.monotonic() - began)  # the store's clock moved 1 s; a server's, as this one
    asked = queue.outcome("first", within=made)  # the oldest receipt kept is as old as it, not older
    assert asked.state == "unknown", asked.detail
    assert _values(queue) == ["a", 0, 1, 2]


def test_a_window_asked_in_fractions_of_a_millisecond_is_rounded_up(store: Store) -> None:
    """Asked about the last 1.0034 s, with the oldest receipt kept 1,004 ms old: a call made
    1,003.4 ms ago may carry that receipt's millisecond, and have been dropped beside it."""
    if store.clock is None:
        pytest.skip("needs a store clock the test sets to the millisecond (the embedded store's)")
    queue = store.new_queue(capacity=30, slots_per_record=10, receipts=3)
    queue.enqueue("a", txn_id="first")
    for index in range(3):  # all in one millisecond with "first", which is dropped by count
        queue.enqueue(index, txn_id=f"other{index}")
    store.advance(1.004)
    assert queue.outcome("first", within=1.0034).state == "unknown"  # not "not committed"
    assert queue.outcome("first", within=1.002).state == "not committed"


def test_a_window_as_long_as_the_receipt_ttl_is_answered_whatever_its_float(store: Store) -> None:
    """16.1 * 1000 is 16100.000000000002 as a float: rounded up whole, the window passed the TTL, which
    the log never covers, so the answer was always "unknown"."""
    queue = store.new_queue(capacity=30, slots_per_record=10, receipts=10, receipt_ttl=16.1)
    queue.enqueue("a", txn_id="one")
    assert queue.outcome("never", within=16.1).state == "not committed"


@pytest.mark.parametrize("appends", APPENDS)
def test_the_receipt_log_stays_bounded_and_says_when_it_cannot_answer(store: Store, appends: str) -> None:
    queue = store.new_queue(appends=appends, capacity=60, slots_per_record=10, receipts=5)
    for index in range(20):
        queue.enqueue(index, txn_id=f"t{index}")
    log = store.backend.get(queue.keys.metadata).bins[rec.RECEIPTS]  # type: ignore[union-attr]
    assert sorted(log) == [f"t{index}" for index in range(15, 20)]
    assert queue.outcome("t19").committed
    lost = queue.outcome("t3")  # dropped to keep the log at 5: the log cannot say
    assert lost.state == "unknown" and "covers only" in lost.detail
    # an old call dropped by count is unknown; a recent one asked "within" what the log covers is answered
    assert queue.outcome("t3", within=0.0).state == "not committed"
    assert queue.enqueue(3, txn_id="t3") == 20  # no receipt left: it enqueues again (the log's bound)


@pytest.mark.parametrize("appends", APPENDS)
def test_calls_sent_at_once_with_one_txn_id_apply_once_and_the_others_say_so(
    store: Store, appends: str
) -> None:
    """On a server, such calls take the lock back from each other: each answers with what the txn did
    or fails saying another call with its txn id took the lock (taken_back), never applied twice."""
    queue = store.new_queue(appends=appends, capacity=60, slots_per_record=10)
    queue.enqueue_batch(range(10))

    def answers(futures: list[Future[Any]]) -> set[Any]:
        said = set()
        for future in futures:
            try:
                result = future.result()
                said.add(result if isinstance(result, range) else tuple(entry.offset for entry in result))
            except LockLostError as exc:
                assert exc.taken_back and "another call carrying the same txn id" in str(exc)  # type: ignore[attr-defined]
        return said

    for round_ in range(3):
        with ThreadPoolExecutor(6) as pool:
            enqueued = answers(
                [pool.submit(queue.enqueue_batch, ["x", "y"], txn_id=f"e{round_}") for _ in range(6)]
            )
            taken = answers([pool.submit(queue.dequeue_batch, 3, txn_id=f"d{round_}") for _ in range(6)])
        assert len(enqueued) == 1 and queue.outcome(f"e{round_}").receipt.offsets in enqueued  # type: ignore[union-attr]
        assert len(taken) == 1
    assert queue.info().size == 10 + 3 * 2 - 3 * 3  # each txn applied once


def test_receipt_settings_are_checked(store: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="receipts must be"):
        store.new_queue(receipts=1)
    with pytest.raises(InvalidArgumentError, match="receipt_ttl must be"):
        store.new_queue(receipt_ttl=0)
    with pytest.raises(InvalidArgumentError, match="txn_id must be"):
        store.new_queue().outcome("")
    queue = store.new_queue()
    for huge in (10**5000, -(10**200)):  # past what str() of an int may make, and past 128 digits
        with pytest.raises(
            InvalidArgumentError, match=r"txn_id is an int of .* bits, longer than 128 digits"
        ):
            queue.enqueue("x", txn_id=huge)
    assert queue.enqueue("x", txn_id=10**127) == 0  # 128 digits: an id like any other


def test_the_reference_api_keeps_txn_id_as_the_lock_holders_name(store: Store) -> None:
    from large_queue import LargeQueue

    queue = store.new_queue(appends="lock")
    reference = LargeQueue()
    reference.initialize_existing_queue(store.backend, "test", queue.name)
    assert reference.enqueue("a", 1) == 0
    assert reference.enqueue("b", 1) == 1  # the same txn id, two entries: as the reference does
    assert reference.dequeue(1)["entry"] == "a"  # type: ignore[index]
    assert reference.dequeue(1)["entry"] == "b"  # type: ignore[index]


def test_a_call_that_finds_its_reservation_closed_says_so_in_its_receipt(store: Store) -> None:
    queue = store.new_queue(appends="reserve", capacity=6, slots_per_record=3)
    publish = queue.appender.publish

    def closed_first(first: int, values: list[object], now_ms: int, **options: object) -> None:
        queue.appender.publish = publish  # type: ignore[method-assign]
        queue.appender.close(first, first + len(values))  # a reader was quicker: the hole timeout passed
        queue.enqueue_batch(["x"] * 5)  # and the queue filled up meanwhile
        publish(first, values, now_ms, **options)  # type: ignore[arg-type]

    queue.appender.publish = closed_first  # type: ignore[method-assign]
    with pytest.raises(QueueFullError):  # it could not reserve again: nothing of it is in the queue
        queue.enqueue("a", txn_id="t1")
    outcome = queue.outcome("t1")
    assert outcome.state == "not committed" and outcome.receipt is not None and outcome.receipt.closed
    queue.dequeue_batch(6)
    queue.enqueue_batch(["y"] * 6)  # a later lap reuses its slot: the receipt still tells
    assert queue.outcome("t1").state == "not committed"
    queue.dequeue_batch(6)
    assert queue.enqueue("a", txn_id="t1") == 12  # the retry reserves anew
    assert queue.outcome("t1").committed


def test_a_dead_producers_reservation_closed_by_a_reader_is_told_apart_after_its_slots_are_reused(
    store: Store,
) -> None:
    """A producer dies between its reservation and its publish; a reader closes the hole; laps go by."""
    backend, queue = _faulty(store, appends="reserve")  # capacity 12
    backend.inject(lambda call: call.is_buffer, applied=False, times=ATTEMPTS)  # it never publishes
    with pytest.raises(OutcomeUnknownError):
        queue.enqueue_batch(["a", "b"], txn_id="dead")
    queue.appender.close(0, 2)  # what a reader does after the hole timeout
    queue.enqueue_batch(["lap-0"] * 10)  # offsets 2..11
    assert len(queue.dequeue_batch(12)) == 10
    queue.enqueue_batch(["lap-1"] * 12)  # offsets 12..23: slots 0 and 1 now hold 12 and 13
    assert len(queue.dequeue_batch(12)) == 12
    outcome = queue.outcome("dead")
    assert outcome.state == "not committed" and "closed" in outcome.detail, outcome
    assert queue.enqueue_batch(["a", "b"], txn_id="dead") == range(24, 26)  # the restarted caller's retry
    assert [e.value for e in queue.dequeue_batch(10)] == ["a", "b"]
    assert queue.outcome("dead").committed


class _Killed(BaseException):
    """The producer process dies here (nothing of the library catches it)."""


def _dies_after_publishing(queue: Queue, before: object = None) -> None:
    """The next publish of ``queue``'s producer is applied, then the producer dies before it hears back.

    ``before(first, count)`` runs first (what another process does meanwhile).
    """
    publish = queue.appender.publish

    def published_then_killed(first: int, values: list[object], now_ms: int, **options: object) -> None:
        queue.appender.publish = publish  # type: ignore[method-assign]
        if callable(before):
            before(first, len(values))
        publish(first, values, now_ms, **options)  # type: ignore[arg-type]
        raise _Killed()

    queue.appender.publish = published_then_killed  # type: ignore[method-assign]


def _laps(queue: Queue) -> None:
    """Consume everything, then fill and empty the queue (capacity 12): every slot is reused."""
    queue.dequeue_batch(12)
    queue.enqueue_batch(["lap"] * 12)
    assert len(queue.dequeue_batch(12)) == 12


def test_a_killed_producers_published_reservation_is_committed_after_its_slots_are_reused(
    store: Store,
) -> None:
    """No reader marked it closing, nothing skipped it: its reused slots say it was published."""
    queue = store.new_queue(appends="reserve")  # capacity 12
    _dies_after_publishing(queue)
    with pytest.raises(_Killed):
        queue.enqueue_batch(["a", "b"], txn_id="gone")
    assert [e.value for e in queue.dequeue_batch(5)] == ["a", "b"]  # published, and consumed
    _laps(queue)
    outcome = queue.outcome("gone")
    assert outcome.committed and "published" in outcome.detail, outcome
    assert queue.enqueue_batch(["a", "b"], txn_id="gone") == range(0, 2)  # the retry writes nothing
    assert queue.dequeue_batch(5) == []


def test_a_reservation_whose_closer_may_have_died_stays_unknown(store: Store) -> None:
    """A reader marked the run closing, then died before its tombstones: nothing can tell."""
    queue = store.new_queue(appends="reserve")
    _dies_after_publishing(
        queue, before=lambda first, count: queue.appender._mark_run(first, count, rec.CLOSING)
    )
    with pytest.raises(_Killed):
        queue.enqueue_batch(["a", "b"], txn_id="gone")
    _laps(queue)
    assert queue.outcome("gone").state == "unknown"
    with pytest.raises(OutcomeUnknownError):
        queue.enqueue_batch(["a", "b"], txn_id="gone")


def test_a_reservation_an_overwriting_producer_skipped_stays_unknown(store: Store) -> None:
    """Its producer died before publishing, and an overwrite moved the head past it: not published."""
    backend, queue = _faulty(store, appends="reserve")  # capacity 12
    backend.inject(lambda call: call.is_buffer, applied=False, times=ATTEMPTS)  # it never publishes
    with pytest.raises(OutcomeUnknownError):
        queue.enqueue_batch(["a", "b"], txn_id="dead")
    queue.enqueue_batch(["o"] * 12, overwrite_if_full=True)  # offsets 2..13: the head passes 0..1
    _laps(queue)
    outcome = queue.outcome("dead")
    assert outcome.state == "unknown", outcome


def test_a_format_3_queue_keeps_such_a_receipt_unknown(store: Store) -> None:
    """A queue made before runs were marked closing: a reused reservation cannot be told apart."""
    queue = store.new_queue(appends="reserve")
    store.backend.put(queue.keys.metadata, {rec.FORMAT: rec.RESERVED_FORMAT_VERSION})
    old = Queue.open(store.backend, queue.name)
    assert not old.marked
    _dies_after_publishing(old)
    with pytest.raises(_Killed):
        old.enqueue_batch(["a", "b"], txn_id="gone")
    _laps(old)
    assert old.outcome("gone").state == "unknown"


def test_a_log_full_of_marks_since_the_reservation_keeps_it_unknown(store: Store) -> None:
    """Marks of its time may have been pushed out of a log kept at 3: the absence of one proves nothing."""
    queue = store.new_queue(appends="reserve", receipts=3)
    _dies_after_publishing(queue)
    with pytest.raises(_Killed):
        queue.enqueue_batch(["a", "b"], txn_id="gone")
    queue.dequeue_batch(5)
    for first in (100, 200):  # closed runs elsewhere, after it (marks of other laps' reservations)
        queue.appender._mark_run(first, 1, rec.CLOSED_RUN)
    _laps(queue)
    assert queue.outcome("gone").state == "unknown"


def test_a_reader_marks_a_run_closing_before_its_tombstones(store: Store) -> None:
    """The reader's tombstones go in, and it dies before it marks them closed: unknown, not published."""
    backend, queue = _faulty(store, appends="reserve")  # capacity 12
    backend.inject(lambda call: call.is_buffer, applied=False, times=ATTEMPTS)  # its producer never publishes
    with pytest.raises(OutcomeUnknownError):
        queue.enqueue_batch(["a", "b"], txn_id="dead")
    backend.inject(lambda call: call.is_buffer, applied=True)  # the tombstones go in, the reply is lost
    with pytest.raises(ConditionNotMetError):  # its repeat is refused by them: it never marks them closed
        queue.appender.close(0, 2)
    _laps(queue)
    assert queue.outcome("dead").state == "unknown"


def test_two_retries_of_one_closed_reservation_reserve_again_only_once(store: Store) -> None:
    """A txn whose reservation a reader closed is reserved again guarded by "its receipt still
    names the closed offsets", so two calls of that txn that both found it closed cannot both
    reserve (the entry would be enqueued twice)."""
    from large_queue.appends import Duplicate, ReceiptWrite

    queue = store.new_queue(appends="reserve", capacity=8, slots_per_record=4)
    put = queue.receipts.reserved("t9", 1)
    first = queue.appender.reserve(
        1, overwrite=False, receipt=ReceiptWrite(put, queue.receipts.absent("t9"), "t9")
    )
    # both retries read the receipt naming `first` and find it closed; each reserves anew
    again = ReceiptWrite(put, queue.receipts.still_names("t9", first), "t9")
    queue.appender.reserve(1, overwrite=False, receipt=again)
    with pytest.raises(Duplicate):
        queue.appender.reserve(1, overwrite=False, receipt=again)
    assert queue.current_metadata().tail == 2  # the first reservation and one reservation anew


def test_internal_lock_holder_names_are_unique_per_call() -> None:
    """Unique per call: no caller's txn_id can name one and take the lock from a live holder."""
    first, second = _txn.internal("purge"), _txn.internal("purge")
    assert first != second
    assert first.startswith("purge/") and first != "purge"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_draws_its_own_default_txn_ids() -> None:
    """Parent and child, forked with the same counter, never hand out the same default txn id."""
    _txn.txn_id(None)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next default txn id, then gone
        try:
            os.write(write_end, _txn.txn_id(None).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    child = os.read(read_end, 200).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    mine = _txn.txn_id(None)
    assert child and child != mine
    assert child.rsplit("-", 1)[0] != mine.rsplit("-", 1)[0]  # another process id


class _PausedBeforeRecord(Delegating):
    """Stops the first command on buffer record ``record`` for ``seconds`` before sending it."""

    def __init__(self, inner: Any, record: str, seconds: float) -> None:
        super().__init__(inner)
        self.record, self.seconds, self.armed = record, seconds, True

    def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
        key = args[0] if args else None
        if self.armed and method != "get" and getattr(key, "user_key", None) == self.record:
            self.armed = False
            time.sleep(self.seconds)
        return super().relay(method, *args, **kwargs)


def test_a_call_made_at_once_with_the_same_txn_id_and_other_entries_cannot_tear_the_batch(
    store: Store,
) -> None:
    """A publishes the first record of its batch and pauses before the second; B, with A's txn id and
    other entries, finds the reservation pending. B must not publish the rest over A's part: readers
    would see a batch that is neither call's, and both would be told it was enqueued."""
    name = store.new_queue(capacity=100, slots_per_record=10).name
    paused = Queue.open(_PausedBeforeRecord(store.backend, "queue-buffer-1", 1.0), name)
    queue = Queue.open(store.backend, name)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(paused.enqueue_batch, [f"a{n}" for n in range(12)], txn_id="t")
        time.sleep(0.3)
        try:
            second: range | None = queue.enqueue_batch([f"b{n}" for n in range(12)], txn_id="t")
        except InvalidArgumentError as exc:  # Aerospike: B found A's entries where it would publish
            assert "another call made with the same txn id" in str(exc)
            second = None
        assert first.result() == range(12)
    assert second in (None, range(12))  # the embedded store: B waited for A's append, then answered
    assert [entry.value for entry in queue.dequeue_batch(100)] == [f"a{n}" for n in range(12)]


def test_a_retry_with_entries_equal_in_python_but_stored_otherwise_is_refused(store: Store) -> None:
    """1 == 1.0 in Python, yet a native queue stores them apart: a call made again with the txn id and
    1.0 for 1 must not finish the first call's batch with its own entries."""
    name = store.new_queue(capacity=100, slots_per_record=10, encoding="native").name
    faulty = FaultInjectingBackend(store.backend)
    faulty.inject(
        lambda call: call.is_buffer and call.key.user_key.endswith("buffer-2"), applied=False, times=50
    )
    with pytest.raises(OutcomeUnknownError):  # records 0 and 1 published, record 2 never
        Queue.open(faulty, name).enqueue_batch([1] * 25, txn_id="t")
    queue = Queue.open(store.backend, name)
    with pytest.raises(InvalidArgumentError, match="another call made with the same txn id"):
        queue.enqueue_batch([1.0] * 25, txn_id="t")
    assert queue.enqueue_batch([1] * 25, txn_id="t") == range(25)  # the same call again finishes it
    values = [entry.value for entry in queue.dequeue_batch(100)]
    assert values == [1] * 25 and all(type(value) is int for value in values)
