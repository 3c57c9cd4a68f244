"""Purge: every entry leaves at once, the queue stays; on both stores, both append modes."""

from __future__ import annotations

import time

import pytest

from large_queue import DataLossError, Queue
from large_queue._entries import check_entries
from large_queue.cli import main
from tests.fix_backends import APPENDS, Place, Store


@pytest.mark.parametrize("appends", APPENDS)
def test_a_purge_drops_every_entry_and_keeps_what_comes_after(store: Store, appends: str) -> None:
    queue = store.new_queue(appends=appends, capacity=12, slots_per_record=3)
    queue.enqueue_batch(["a", "b", "c", "d", "e"])
    assert queue.dequeue() is not None
    assert queue.purge() == range(1, 5)
    info = queue.info()
    assert (info.head_offset, info.tail_offset, info.size) == (5, 5, 0)
    assert queue.dequeue() is None
    assert queue.get(3) is None and queue.peek(10, start=1) == []
    assert queue.enqueue("after") == 5
    assert [e.value for e in queue.dequeue_batch(10)] == ["after"]
    assert queue.purge() == range(6, 6)  # nothing left to drop: nothing written but the lock
    assert queue.stats().entries_purged == 4
    assert queue.info().lock_owner is None


def test_an_enqueue_in_flight_is_purged_with_the_rest_and_a_later_one_is_kept(store: Store) -> None:
    queue = store.new_queue(capacity=4, slots_per_record=2)
    paused = Queue.open(store.backend, queue.name)
    first, now_ms = paused.appender.reserve_stamped(1, overwrite=False)  # between its two commands
    queue.enqueue("published")
    assert queue.purge() == range(0, 2)
    paused.appender.publish(first, check_entries(["late"], 1000, queue.encoding), now_ms)  # accepted ...
    assert queue.dequeue_batch(10) == []  # ... and never seen: it was below the head
    assert queue.enqueue_batch(["x", "y", "z", "w"]) == range(2, 6)  # a full lap over the purged slots
    assert [e.value for e in queue.dequeue_batch(10)] == ["x", "y", "z", "w"]


@pytest.mark.parametrize("appends", APPENDS)
def test_a_group_sees_the_purged_entries_it_had_not_taken_as_lost(store: Store, appends: str) -> None:
    queue = store.new_queue(appends=appends, capacity=12, slots_per_record=3)
    queue.create_group("slow")
    queue.enqueue_batch([0, 1, 2, 3, 4])
    assert queue.purge() == range(0, 5)
    queue.enqueue(5)
    with queue.consumer("n1", group="slow", on_data_loss="fail", time_slice=30.0, timeout=5.0) as consumer:
        with pytest.raises(DataLossError) as raised:
            consumer.receive(10, timeout=2.0)
        assert raised.value.lost == range(0, 5)  # type: ignore[attr-defined]
        got = consumer.receive(10, timeout=2.0)
        assert [m.value for m in got] == [5]
        consumer.ack(got)
    assert queue.group("slow").lost == 5


def test_the_command_line_purges(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    name = place.name("purged")
    assert main(["--url", place.url, "create", name, "--capacity", "10"]) == 0
    assert main(["--url", place.url, "enqueue", name, '"a"', '"b"', '"c"']) == 0
    capsys.readouterr()
    assert main(["--url", place.url, "purge", name]) == 0
    assert '"dropped": 3' in capsys.readouterr().out
    assert main(["--url", place.url, "dequeue", name]) == 0
    assert capsys.readouterr().out.strip() == "null"


@pytest.mark.parametrize("group", [None, "g"])
def test_a_live_owner_delivers_none_of_what_a_purge_dropped(store: Store, group: str | None) -> None:
    queue = store.new_queue(capacity=20, slots_per_record=5)
    if group is not None:
        queue.create_group(group)
    queue.enqueue_batch(range(10))
    options = {"time_slice": 30.0, "timeout": 5.0, "poll_interval": 0.05, "on_data_loss": "fail"}
    with queue.consumer("n1", group=group, **options) as consumer:  # type: ignore[arg-type]
        first = consumer.receive(1, timeout=3.0)  # the owner reads ahead past it
        assert [m.value for m in first] == [0]
        consumer.ack(first)
        assert queue.purge().stop == 10
        queue.enqueue("after")
        deadline = time.monotonic() + 5
        with pytest.raises(DataLossError) as raised:  # not 1..9 from the slots it had read
            while time.monotonic() < deadline:
                assert consumer.receive(5, timeout=0.2) == []
        assert raised.value.lost == range(1, 10)  # type: ignore[attr-defined]
        got = consumer.receive(5, timeout=3.0)
        assert [m.value for m in got] == ["after"]
        consumer.ack(got)
