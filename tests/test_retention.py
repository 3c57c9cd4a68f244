"""Retention by age (``max_age``): expired entries leave from the head, counted, on both stores.

On the embedded store the tests move the store's clock; on Aerospike they
wait for it (``Store.advance``), so ages are a second or two there.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from large_queue import DataLossError, InvalidArgumentError, Queue, QueueFullError
from large_queue._entries import check_entries
from large_queue.appends import ReceiptWrite
from large_queue.cli import main
from large_queue.lock import _Busy
from tests.fix_backends import APPENDS, Place, Store

MAX_AGE = 1.0
#: past max_age on the store's clock
LATER = 1.3


def _queue(store: Store, appends: str, **options: Any) -> Queue:
    queue = store.new_queue(appends=appends, max_age=MAX_AGE, **options)
    queue.store_clock.refresh = 0.0  # consumers read the store's clock at every receive (it is moved by hand)
    return queue


@pytest.mark.parametrize("appends", APPENDS)
def test_a_dequeue_drops_the_entries_older_than_max_age(store: Store, appends: str) -> None:
    queue = _queue(store, appends, capacity=12, slots_per_record=3)
    queue.enqueue_batch(["old-1", "old-2", "old-3", "old-4"])
    store.advance(LATER)
    queue.enqueue_batch(["young-1", "young-2"])
    entry = queue.dequeue()
    assert entry is not None and entry.value == "young-1"
    assert queue.stats().entries_expired == 4
    assert [e.value for e in queue.dequeue_batch(10)] == ["young-2"]
    assert queue.info().size == 0
    assert queue.stats().entries_dequeued == 2  # the old ones were dropped, never returned


@pytest.mark.parametrize("appends", APPENDS)
def test_a_dequeue_of_a_long_expired_backlog_drops_it_all_at_once(store: Store, appends: str) -> None:
    queue = _queue(store, appends, capacity=300, slots_per_record=10)
    queue.enqueue_batch(range(250))
    store.advance(LATER)
    queue.enqueue("young")
    before = queue.stats().commands
    entry = queue.dequeue()
    assert entry is not None and (entry.offset, entry.value) == (250, "young")
    # one dequeue's read finds the head expired, then the rest goes by bisection, not a read a record
    assert queue.stats().commands - before <= 2 * 3 + math.ceil(math.log2(26)) + 5
    assert queue.stats().entries_expired == 250


@pytest.mark.parametrize("appends", APPENDS)
def test_a_full_queue_makes_room_by_dropping_expired_entries(store: Store, appends: str) -> None:
    queue = _queue(store, appends, capacity=6, slots_per_record=3)
    queue.enqueue_batch(["old-1", "old-2", "old-3"])
    store.advance(LATER)
    queue.enqueue_batch(["young-1", "young-2", "young-3"])
    offset = queue.enqueue("newest")  # full: the three old entries leave, and the enqueue goes on
    assert offset == 6
    assert [e.value for e in queue.dequeue_batch(10)] == ["young-1", "young-2", "young-3", "newest"]
    assert queue.stats().entries_expired == 3
    queue.enqueue_batch(["a", "b", "c", "d", "e", "f"])
    with pytest.raises(QueueFullError):  # nothing is old enough to leave: still full
        queue.enqueue("g")
    assert [e.value for e in queue.dequeue_batch(10)] == ["a", "b", "c", "d", "e", "f"]


@pytest.mark.parametrize("appends", APPENDS)
def test_expire_drops_the_expired_prefix_by_bisection(store: Store, appends: str) -> None:
    queue = _queue(store, appends, capacity=400, slots_per_record=5)
    queue.enqueue_batch(range(203))
    store.advance(LATER)
    queue.enqueue_batch(range(7))
    before = queue.stats().commands
    assert queue.expire() == range(0, 203)
    assert queue.stats().commands - before <= math.ceil(math.log2(42)) + 5
    assert queue.info().head_offset == 203
    assert queue.expire() == range(203, 203)  # nothing more has expired
    assert [e.value for e in queue.dequeue_batch(10)] == list(range(7))
    assert queue.stats().entries_expired == 203


def test_a_queue_without_max_age_keeps_its_entries_however_old(store: Store) -> None:
    queue = store.new_queue()
    queue.enqueue("kept")
    store.advance(LATER)
    before = queue.stats().commands
    assert queue.expire() == range(0)
    assert queue.stats().commands == before  # nothing to do: not even a read
    entry = queue.dequeue()
    assert entry is not None and entry.value == "kept"
    assert queue.info().max_age is None


def test_max_age_is_stored_and_reported(store: Store) -> None:
    queue = store.new_queue(max_age=86400)
    assert queue.info().max_age == 86400.0
    assert Queue.open(store.backend, queue.name).max_age_ms == 86_400_000


@pytest.mark.parametrize("bad", [0, -1, 0.0001, "60", float("nan"), float("inf"), True, 11 * 365 * 86400])
def test_a_bad_max_age_is_refused_before_anything_is_written(store: Store, bad: object) -> None:
    name = f"refused-{abs(hash(repr(bad))) % 10_000}"
    with pytest.raises(InvalidArgumentError, match="max_age"):
        Queue.create(store.backend, name, capacity=10, max_age=bad)  # type: ignore[arg-type]
    assert name not in Queue.names(store.backend)


@pytest.mark.parametrize("appends", APPENDS)
def test_a_group_sees_expired_entries_as_lost_with_their_range(store: Store, appends: str) -> None:
    queue = _queue(store, appends, capacity=12, slots_per_record=3)
    queue.create_group("slow")
    queue.enqueue_batch([0, 1, 2, 3, 4])
    store.advance(LATER)
    queue.enqueue_batch([5, 6])
    with queue.consumer("n1", group="slow", on_data_loss="fail", time_slice=30.0, timeout=5.0) as consumer:
        with pytest.raises(DataLossError) as raised:
            consumer.receive(10, timeout=2.0)
        assert raised.value.count == 5  # type: ignore[attr-defined]
        assert raised.value.lost == range(0, 5)  # type: ignore[attr-defined]
        got = consumer.receive(10, timeout=2.0)
        assert [m.value for m in got] == [5, 6]
        for message in got:
            message.ack()
    assert queue.group("slow").lost == 5
    assert queue.stats().entries_expired == 5


@pytest.mark.parametrize("group", ["g", None], ids=["group", "shim"])
@pytest.mark.parametrize("on_data_loss", ["report", "fail"])
def test_a_consumer_passes_a_long_expired_backlog_in_one_receive_and_says_its_loss_once(
    store: Store, group: str | None, on_data_loss: str
) -> None:
    """One entry asked for at a time (the README's ``for message in consumer``): a backlog of expired
    entries is passed a few records a command, without waiting between passes, so the young entries
    behind it are met before they expire too; the loss is one, said once."""
    backlog = 1_000
    queue = _queue(store, "reserve", capacity=backlog + 100, slots_per_record=50)
    if group:
        queue.create_group(group)  # at the head: it sees the whole backlog
    queue.enqueue_batch(list(range(backlog)))
    store.advance(LATER)
    queue.enqueue("young")
    commands = queue.stats().commands
    with queue.consumer(
        "n1", group=group, on_data_loss=on_data_loss, time_slice=30.0, timeout=5.0
    ) as consumer:
        if on_data_loss == "fail":
            with pytest.raises(DataLossError) as raised:
                consumer.receive(1, timeout=0)  # one look: every pass it needs, no wait
            assert (raised.value.count, raised.value.lost) == (backlog, range(0, backlog))  # type: ignore[attr-defined]
        got = consumer.receive(1, timeout=0)
        assert [message.value for message in got] == ["young"]
        got[0].ack()
    assert queue.stats().entries_expired == backlog
    if group:
        assert queue.group(group).lost == backlog
    # a few records a pass (each a read and a commit), not a command or two for each entry
    assert store.backend.commands - commands < backlog // 10


def test_the_cluster_consumer_counts_expired_entries_as_lost(store: Store) -> None:
    queue = _queue(store, "reserve", capacity=12, slots_per_record=3)
    queue.enqueue_batch(["old-1", "old-2"])
    store.advance(LATER)
    queue.enqueue("young")
    with queue.consumer("n1", time_slice=30.0, timeout=5.0) as consumer:
        got = consumer.receive(10, timeout=2.0)
        assert [m.value for m in got] == ["young"]
    assert queue.stats().entries_expired == 2


@pytest.mark.parametrize("appends", APPENDS)
def test_a_repeated_dequeue_after_dropping_returns_what_the_first_took(store: Store, appends: str) -> None:
    queue = _queue(store, appends, capacity=12, slots_per_record=3)
    queue.enqueue_batch(["old-1", "old-2"])
    store.advance(LATER)
    queue.enqueue_batch(["young-1", "young-2"])
    first = queue.dequeue_batch(2, txn_id="take-1")
    assert [e.value for e in first] == ["young-1", "young-2"]
    again = queue.dequeue_batch(2, txn_id="take-1")
    assert again == first
    outcome = queue.outcome("take-1")
    assert outcome.receipt is not None and outcome.receipt.offsets == range(2, 4)


def test_the_command_line_creates_and_expires(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    name = place.name("retained")
    assert main(["--url", place.url, "create", name, "--capacity", "10", "--max-age", "0.05"]) == 0
    assert '"max_age": 0.05' in capsys.readouterr().out
    assert main(["--url", place.url, "enqueue", name, '"a"', '"b"']) == 0
    time.sleep(0.2)  # other processes' clocks are real on both stores
    capsys.readouterr()
    assert main(["--url", place.url, "expire", name]) == 0
    assert '"dropped": 2' in capsys.readouterr().out


@pytest.mark.parametrize("appends", APPENDS)
def test_entries_are_stamped_with_the_store_clock_not_the_producers(store: Store, appends: str) -> None:
    queue = store.new_queue(appends=appends)
    if store.clock is not None:
        store.clock.advance(86400)  # the store's clock a day ahead of this machine's
    before = queue.appender.store_now()
    first = queue.enqueue("one")
    batch = queue.enqueue_batch(["two", "three"])
    after = queue.appender.store_now()
    stamps = [entry.enqueued_at_ms for entry in (queue.get(o) for o in [first, *batch]) if entry is not None]
    assert len(stamps) == 3
    assert all(before <= stamp <= after for stamp in stamps)
    if store.clock is not None:
        assert min(stamps) > time.time() * 1000 + 86_000_000  # not this machine's clock


def test_expire_keeps_a_run_of_reservations_longer_than_a_record_that_nothing_expired_precedes(
    store: Store,
) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=2, max_age=3600)  # nothing is an hour old
    producers = [Queue.open(store.backend, queue.name) for _ in range(5)]
    held = [
        p.appender.reserve_stamped(1, overwrite=False) for p in producers
    ]  # each between its two commands
    assert queue.expire() == range(0, 0)
    for producer, (first, now_ms) in zip(producers, held, strict=True):
        producer.appender.publish(first, check_entries([f"fresh-{first}"], 1000, queue.encoding), now_ms)
    assert [e.value for e in queue.dequeue_batch(10)] == [f"fresh-{o}" for o in range(5)]


def test_expire_keeps_a_spanning_batch_whole_while_its_last_record_is_unpublished(store: Store) -> None:
    from large_queue import _records as rec
    from large_queue.backends import ListSetRange

    queue = _queue(store, "reserve", capacity=12, slots_per_record=3, hole_timeout=60, encoding="native")
    queue.enqueue("old")  # offset 0
    first, now_ms = queue.appender.reserve_stamped(5, overwrite=False)  # 1..5: records 0 and 1
    values = check_entries([f"b{i}" for i in range(5)], 1000, queue.encoding)
    # Its producer published record 0's part (marked with the batch's last offset, 5) and paused.
    parts = [[first + i, values[i], now_ms, first + 4] for i in range(2)]
    queue.backend.operate(queue.keys.buffer(0), [ListSetRange(rec.SLOTS, 1, parts)])
    store.advance(LATER)
    assert queue.expire() == range(0, 1)  # not into the batch: its part in record 0 stays
    queue.appender.publish(first, values, now_ms, repeat=True)  # the producer goes on
    assert [e.value for e in queue.peek()] == ["b0", "b1", "b2", "b3", "b4"]  # whole, expired or not
    assert queue.expire() == range(1, 6)  # and then it goes whole


def test_expire_past_a_reservation_never_published_says_the_head_may_have_skipped_it(store: Store) -> None:
    queue = _queue(store, "reserve", capacity=4, slots_per_record=2, hole_timeout=60)
    put = queue.receipts.reserved("T", 1)
    queue.appender.reserve_stamped(
        1, overwrite=False, receipt=ReceiptWrite(put, queue.receipts.absent("T"), "T")
    )
    queue.enqueue("published")
    store.advance(LATER)
    assert queue.expire() == range(0, 2)  # the unpublished offset goes with the expired entry above it
    queue.enqueue_batch([1, 2, 3, 4])  # a later lap reuses the slot that txn T reserved
    queue.dequeue_batch(10)
    assert queue.outcome("T").state == "unknown"  # not "committed": T's entry was never published


def test_a_callers_txn_id_cannot_take_the_lock_from_a_running_expire(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from large_queue import LockNotAcquiredError, _retention
    from large_queue.lock import LockPolicy

    queue = _queue(store, "lock", lock_ttl=30.0)
    queue.enqueue_batch(range(3))
    other = Queue.open(store.backend, queue.name, lock_policy=LockPolicy(acquire_timeout=0.2))
    tried: list[object] = []
    search = _retention._seek.search

    def search_while_another_dequeues(*args: Any) -> int:
        assert queue.current_metadata().lock_owner.startswith("expire/")  # its name, made unique per call
        try:
            tried.append(other.dequeue(txn_id="expire"))  # a caller's id that was its fixed name
        except LockNotAcquiredError:
            tried.append("waited")
        return search(*args)

    monkeypatch.setattr(_retention._seek, "search", search_while_another_dequeues)
    queue.expire()
    assert tried == ["waited"]  # it did not take the lock from the live expire


@pytest.mark.parametrize("group", ["g", None], ids=["group", "shim"])
def test_expire_and_purge_do_not_report_what_consumers_acked_before_the_head_followed(
    store: Store, group: str | None
) -> None:
    """The head follows the consumers' acks only now and then (each quarter of the capacity): what
    they acked below it was consumed, not dropped, and is neither returned nor counted."""
    queue = _queue(store, "reserve", capacity=40, slots_per_record=5)
    if group:
        queue.create_group(group)
    queue.enqueue_batch(list(range(8)))
    with queue.consumer("n1", group=group, time_slice=30.0, timeout=5.0) as consumer:
        got = consumer.receive(6, timeout=2.0)
        consumer.ack(got)  # 0..5 acked; the head is still 0
        assert queue.info().head_offset == 0
        store.advance(LATER)
        assert queue.expire() == range(6, 8)  # 6 and 7 were never acked: those are dropped
        assert queue.stats().entries_expired == 2
        queue.enqueue_batch([8, 9])
        assert queue.purge() == range(8, 10)
        assert queue.stats().entries_purged == 2


def test_expire_renews_its_lock_while_it_searches_a_long_run_of_slots_with_no_time(store: Store) -> None:
    """A big batch whose producer died, closed by readers: its slots have no time, and the search
    reads them a record at a time. The lock is renewed on the way: nobody takes it meanwhile."""
    queue = _queue(store, "reserve", capacity=100, slots_per_record=10, lock_ttl=1.0)
    queue.enqueue_batch(list(range(10)))  # old
    first = queue.appender.reserve(60, overwrite=False)
    for start in range(first, first + 60, 10):
        queue.appender.close(start, start + 10)
    store.advance(LATER)
    queue.enqueue_batch(["young"] * 10)
    thief = Queue.open(store.backend, queue.name)
    refused = []
    probe = queue.prefix.slots

    def slow_probe(start: int, stop: int) -> Any:
        time.sleep(0.3)  # each probe a slow round trip: the search outlasts the lock's TTL
        if store.kind == "embedded":
            store.advance(0.3)  # the lock's age is the store's clock's
        try:
            thief.lock.try_acquire("thief")  # would take a lock silent past its TTL
        except _Busy:
            refused.append(start)
        return probe(start, stop)

    queue.prefix.slots = slow_probe  # type: ignore[method-assign]
    assert queue.expire() == range(0, 70)  # the old entries and the closed run
    assert len(refused) >= 4  # the search probed past the TTL (1 s), and the lock stayed held
    assert [entry.value for entry in queue.peek(20)] == ["young"] * 10


@pytest.mark.parametrize("group", ["g", None], ids=["group", "shim"])
def test_a_full_queue_makes_room_when_the_expired_entries_were_acked_already(
    store: Store, group: str | None
) -> None:
    """The drop moves the head past what the consumers acked (none of it counted as dropped): that is
    room all the same, and the enqueue that asked for it goes on."""
    queue = _queue(store, "reserve", capacity=40, slots_per_record=5)
    if group:
        queue.create_group(group)
    queue.enqueue_batch(list(range(5)))
    with queue.consumer("n1", group=group, time_slice=30.0, timeout=5.0) as consumer:
        consumer.ack(consumer.receive(5, timeout=2.0))  # acked; the head follows only later
        store.advance(LATER)
        queue.enqueue_batch([f"young{i}" for i in range(35)])  # full
        assert queue.enqueue("new") == 40
        assert queue.stats().entries_expired == 0


def test_a_consumer_whose_commit_is_in_doubt_while_it_passes_expired_entries_delivers_nothing(
    store: Store,
) -> None:
    """A delivery whose owner write stays in doubt delivers nothing, also in the middle of passing
    a long expired backlog: the passes stop there, and the entries come once it owns the queue again."""
    from large_queue import errors

    queue = _queue(store, "reserve", capacity=2_000, slots_per_record=10)
    queue.enqueue_batch(list(range(500)))
    store.advance(LATER)
    queue.enqueue_batch(["y0", "y1"])
    with queue.consumer("n1", time_slice=60.0, timeout=10.0) as consumer:
        commit = consumer.ownership.commit
        commits = [0]

        def in_doubt_once(*args: Any, **changes: Any) -> Any:
            commits[0] += 1
            done = commit(*args, **changes)
            if commits[0] == 2:
                raise errors.OutcomeUnknownError("applied, and its reply lost")
            return done

        consumer.ownership.commit = in_doubt_once  # type: ignore[method-assign]
        assert consumer.receive(1, timeout=0) == []  # nothing handed out past the write in doubt
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            for message in consumer.receive(2, timeout=0.5):
                got.append(message.value)
                message.ack()
    assert got == ["y0", "y1"]
