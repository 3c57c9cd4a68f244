"""A lone consumer's dequeues read ahead: the next entries come with no read, never one the head passed."""

from __future__ import annotations

from large_queue import Queue
from large_queue import _records as rec
from large_queue._read_ahead import READ_AHEAD, READ_AHEAD_MOST, ReadAhead
from large_queue.appends._prefix import ENTRY
from large_queue.backends import ListSetRange
from tests.fix_backends import Store


def _values(entries: list) -> list:  # type: ignore[type-arg]
    return [entry.value for entry in entries]


def test_single_dequeues_after_a_read_ahead_send_no_read(store: Store) -> None:
    queue = store.new_queue(appends="reserve", capacity=100, slots_per_record=50)
    queue.enqueue_batch(list(range(2 * READ_AHEAD)))
    backend = store.backend
    sent = backend.commands
    taken = [entry.value for entry in [queue.dequeue()] if entry]
    assert queue.head_guess.read(1) is None  # kept: no read goes beside the next acquire either
    taken += [entry.value for _ in range(2 * READ_AHEAD - 1) if (entry := queue.dequeue())]
    assert taken == list(range(2 * READ_AHEAD))
    # the first dequeue holds the lock: an acquire and a commit (and a read, where none goes in the
    # acquire's round trip); the next 15 take what it read ahead, one command each (quick takes:
    # large_queue._quick_take); the 17th, behind the producers, reads further ahead without the
    # lock and takes (2 commands); the rest are quick takes again
    locked = 2 if backend.reads_beside else 3
    assert backend.commands - sent == locked + (READ_AHEAD - 1) + 2 + (READ_AHEAD - 1)
    queue.enqueue("next")  # nothing kept for it: it is read
    assert _values([queue.dequeue()]) == ["next"]


def test_another_consumer_taking_entries_read_ahead_is_seen_by_the_head(store: Store) -> None:
    queue = store.new_queue(appends="reserve", capacity=100, slots_per_record=50)
    other = Queue.open(store.backend, queue.name)
    queue.enqueue_batch(list(range(30)))
    assert _values(queue.dequeue_batch(1)) == [0]  # reads 0..15 ahead
    assert _values(other.dequeue_batch(5)) == [1, 2, 3, 4, 5]
    assert _values(queue.dequeue_batch(2)) == [6, 7]  # from what it kept, past the head the other left
    assert _values(other.dequeue_batch(30)) == list(range(8, 30))
    assert queue.dequeue() is None


def test_entries_an_overwriting_producer_dropped_are_not_taken_from_what_was_read_ahead(store: Store) -> None:
    queue = store.new_queue(appends="reserve", capacity=16, slots_per_record=16)
    queue.enqueue_batch([f"a{n}" for n in range(16)])  # full
    assert _values(queue.dequeue_batch(1)) == ["a0"]  # a1..a15 read ahead
    # three more, overwriting: the head moves past a1 and a2, whose slots take b0 and b1
    queue.enqueue_batch(["b0", "b1", "b2"], overwrite_if_full=True)
    taken = _values(queue.dequeue_batch(1))
    assert taken == ["a3"]
    taken += _values(queue.dequeue_batch(20))
    assert taken == [*(f"a{n}" for n in range(3, 16)), "b0", "b1", "b2"]


def test_a_run_read_ahead_ends_at_the_first_slot_that_is_not_a_plain_entry() -> None:
    ahead = ReadAhead()
    ahead.keep(40, [[40, "x", 1], [41, "y", 1], [41], [43, "z", 1]], {})  # 42 holds another offset
    assert ahead.covering(40, 42) == [[40, "x", 1], [41, "y", 1]]
    assert ahead.covering(41, 42) == [[41, "y", 1]]
    assert ahead.covering(41, 43) is None
    assert ahead.covering(39, 41) is None
    ahead.keep(50, [[50], [51, "t", 1]], {})  # a tombstone first: nothing kept
    assert ahead.covering(50, 51) is None
    ahead.keep(60, [[60, "u", 1, 62]], {})  # part of a batch spanning records, its last slot not read
    assert ahead.covering(60, 61) is None
    ahead.keep(60, [[60, "u", 1, 62]], {62: ENTRY})  # ... which an earlier read found published
    assert ahead.covering(60, 61) == [[60, "u", 1]]
    ahead.keep(60, [[60, "u", 1, 62], [61, "v", 1, 62], [62, "w", 1, 62], [63, "x", 1, 64]], {})
    assert ahead.covering(60, 63) == [[60, "u", 1], [61, "v", 1], [62, "w", 1]]  # 62 published
    assert ahead.covering(60, 64) is None
    ahead.keep(60, [[60, "u", 1, 61], [61]], {})  # the batch closed: its last slot a tombstone
    assert ahead.covering(60, 61) is None


def test_a_reader_that_took_all_it_kept_reads_further_ahead_and_one_that_lost_some_does_not() -> None:
    ahead = ReadAhead()
    start, spans = 0, []
    for _ in range(5):  # a lone consumer: it takes the first slot read, then every slot kept
        count = ahead.next_read(start, 1, start % 1000, 1000, 10_000)
        spans.append(count)
        ahead.keep(start + 1, [[offset, "x", 1] for offset in range(start + 1, start + count)], {})
        assert ahead.covering(start + 1, start + count) is not None
        start += count
    assert spans == [READ_AHEAD, 2 * READ_AHEAD, 4 * READ_AHEAD, READ_AHEAD_MOST, READ_AHEAD_MOST]
    assert ahead.next_read(start, 1, 0, 50, 10_000) == 50  # never past its record
    ahead.keep(start + 1, [[offset, "x", 1] for offset in range(start + 1, start + 50)], {})
    assert ahead.covering(start + 1, start + 3) is not None  # another consumer takes the rest
    assert ahead.next_read(start + 60, 1, 10, 1000, 10_000) == READ_AHEAD


def test_a_reader_that_caught_up_with_the_producers_reads_no_further() -> None:
    ahead = ReadAhead()
    ahead.keep(0, [[offset, "x", 1] for offset in range(16)], {})
    assert ahead.covering(0, 16) is not None  # all of a run that only the read's size ended
    assert ahead.next_read(16, 1, 16, 1000, 10_000) == 2 * READ_AHEAD
    ahead.keep(16, [[16, "x", 1], [17 - 1000, "an older lap's", 1]], {})
    assert ahead.covering(16, 17) is not None  # all of a run that a slot of no entry ended
    assert ahead.next_read(17, 1, 17, 1000, 10_000) == READ_AHEAD


def test_an_owner_never_delivers_stale_slots_it_read_past_the_tail(store: Store) -> None:
    """A kept run never goes past the tail the reader knows: a stale writer's slots there are not kept."""
    queue = store.new_queue(appends="lock", encoding="native", capacity=200, slots_per_record=100)
    queue.enqueue_batch([0, 1, 2])
    # a stale writer's batch past the tail (offsets 3..5): written under a lock it lost, never committed
    stale = [[3, "stale3", 0], [4, "stale4", 0], [5, "stale5", 0]]
    store.backend.operate(queue.keys.buffer(0), [ListSetRange(rec.SLOTS, 3, stale)])
    with queue.consumer("solo", time_slice=60, timeout=60, poll_interval=30) as consumer:
        assert [e.value for _ in range(3) for e in consumer.dequeue(1)] == [0, 1, 2]
        queue.enqueue_batch(["three", "four", "five"])  # overwrites slots 3..5 under the lock, tail 6
        taken = [e.value for _ in range(3) for e in consumer.dequeue(1)]
    assert taken == ["three", "four", "five"]
