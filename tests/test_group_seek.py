"""Seeking a consumer group: replay from an earlier offset or moment, or skip ahead, on both stores."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from large_queue import GroupNotFoundError, InvalidArgumentError, OwnershipLostError, Queue
from large_queue.cli import main
from large_queue.cluster import Message
from tests.fix_backends import Place, Store
from tests.fix_consumers import FAST
from tests.fix_consumers import receive_all as _receive


def _values(messages: list[Message]) -> list[Any]:
    return [m.value for m in messages]


def test_a_group_replays_from_an_earlier_offset_and_its_old_deliveries_are_fenced(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    queue.create_group("fast")
    queue.create_group("slow")  # consumes nothing: the entries stay in the queue, to be replayed
    queue.enqueue_batch(range(10))
    with queue.consumer("n1", group="fast", **FAST) as consumer:
        done = _receive(consumer, 8)
        consumer.ack(done)
        held = _receive(consumer, 2)  # delivered, not acked when the seek comes
        assert _values(done + held) == list(range(10))
        assert queue.seek_group("fast", 3) == 3
        with pytest.raises(OwnershipLostError):
            consumer.ack(held)  # delivered under the epoch the seek ended
        again = _receive(consumer, 7)  # the node takes the group again and delivers from 3
        assert _values(again) == list(range(3, 10))
        consumer.ack(again)
    group = queue.group("fast")
    assert (group.acked_offset, group.in_flight, group.lost) == (10, 0, 0)
    assert queue.info().head_offset == 0  # "slow" still holds every entry


def test_a_group_skips_to_the_tail_and_the_head_follows_it(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    queue.create_group("g")
    queue.enqueue_batch(range(5))
    assert queue.seek_group("g", "tail") == 5
    assert queue.info().head_offset == 5  # g was the only group: its entries' room is free again
    queue.enqueue("new")
    with queue.consumer("n1", group="g", **FAST) as consumer:
        assert _values(_receive(consumer, 1)) == ["new"]
    assert queue.seek_group("g", "head") == 5


def test_a_group_seeks_to_the_first_entry_enqueued_at_or_after_a_moment(store: Store) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    queue.create_group("g")
    queue.create_group("keeper")
    queue.enqueue_batch(["old-1", "old-2"])
    store.advance(1.5)
    queue.enqueue_batch(["new-1", "new-2"])
    stamp = queue.get(2).enqueued_at_ms  # type: ignore[union-attr]
    moment = datetime.datetime.fromtimestamp(stamp / 1000, tz=datetime.timezone.utc)
    assert queue.seek_group("g", "tail") == 4
    assert queue.seek_group("g", moment) == 2
    assert queue.seek_group("g", moment - datetime.timedelta(days=365)) == 0  # older than all: the head
    assert queue.seek_group("g", moment + datetime.timedelta(days=365)) == 4  # younger than all: the tail


@pytest.mark.parametrize(
    ("to", "named"),
    [(-1, "offset -1"), (99, "offset 99"), ("latest", "'latest'"), (True, "True"), (2.0, "2.0")],
)
def test_a_seek_outside_the_queue_or_to_no_place_is_refused_and_changes_nothing(
    store: Store, to: object, named: str
) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    queue.create_group("g")
    queue.enqueue_batch(range(4))
    before = queue.group("g")
    with pytest.raises(InvalidArgumentError, match=named):
        queue.seek_group("g", to)  # type: ignore[arg-type]
    after = queue.group("g")
    assert (after.epoch, after.delivered_offset) == (before.epoch, before.delivered_offset)
    assert queue.info().lock_owner is None


def test_a_seek_of_a_group_that_is_not_there_names_it(store: Store) -> None:
    queue = store.new_queue()
    with pytest.raises(GroupNotFoundError, match="nope"):
        queue.seek_group("nope", "head")
    assert queue.info().lock_owner is None


def test_the_groups_command_seeks(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    name = place.name("sought")
    assert main(["--url", place.url, "create", name, "--capacity", "10"]) == 0
    assert main(["--url", place.url, "groups", name, "--create", "g"]) == 0
    assert main(["--url", place.url, "groups", name, "--create", "keeper"]) == 0
    assert main(["--url", place.url, "enqueue", name, "1", "2", "3"]) == 0
    capsys.readouterr()
    for to, cursor in [("tail", 3), ("1", 1), ("head", 0), ("2000-01-01T00:00:00+00:00", 0)]:
        assert main(["--url", place.url, "groups", name, "--seek", "g", "--to", to]) == 0
        assert f'"cursor": {cursor}' in capsys.readouterr().out
    assert main(["--url", place.url, "groups", name, "--seek", "g", "--to", "2000-01-01"]) == 1
    assert "time zone" in capsys.readouterr().err
    assert main(["--url", place.url, "groups", name, "--seek", "g"]) == 1
    assert "--to" in capsys.readouterr().err
    assert main(["--url", place.url, "groups", name, "--to", "head"]) == 1
    assert "give --seek too" in capsys.readouterr().err
    bad = ["--create", "new", "--delete", "keeper", "--seek", "g", "--to", "yesterday"]
    assert main(["--url", place.url, "groups", name, *bad]) == 1  # refused before the others ran
    assert "--to must be" in capsys.readouterr().err
    for spelled in ("+1", " 1", "\u0661"):  # int() reads these as 1; an operator means no offset by them
        assert main(["--url", place.url, "groups", name, "--seek", "g", "--to", spelled]) == 1
        assert "--to must be an offset" in capsys.readouterr().err
    for to, said in [
        ("2000-01-01T00:00:00", "time zone"),
        ("-5", "cannot seek to offset -5: the queue holds offsets 0 to 3 (below the head, entries are gone)"),
        (
            "9",
            "cannot seek to offset 9: the queue holds offsets 0 to 3 (past the tail, nothing is there yet)",
        ),
    ]:
        assert main(["--url", place.url, "groups", name, *bad[:4], "--seek", "g", "--to", to]) == 1
        assert said in capsys.readouterr().err  # refused before the group was made or the other deleted
    for bad_names in (
        ["--create", ""],
        ["--create", "new", "--delete", ""],
        ["--delete", "keeper", "--seek", "", "--to", "head"],
    ):
        assert main(["--url", place.url, "groups", name, *bad_names]) == 1
        assert "group name '' is invalid" in capsys.readouterr().err  # an empty name is refused, not ignored
    queue = Queue.open(place.connect(), name)
    assert queue.group("g").delivered_offset == 0
    assert sorted(g.name for g in queue.groups()) == ["g", "keeper"]


def test_a_seek_forgets_a_dead_letter_move_under_way_and_delivers_its_entry_again(store: Store) -> None:
    from large_queue.backends import Write

    queue = store.new_queue(capacity=12, slots_per_record=3)
    dead = store.new_queue(capacity=12, slots_per_record=3)
    queue.create_group("g")
    queue.create_group("keeper")
    queue.enqueue_batch(["poison", "ok"])
    # as a crash in the middle of a move leaves it: a dead-letter offset reserved for entry 0
    store.backend.operate(queue.keys.group("g").owner, [Write("dead", {0: 0}), Write("cursor", 1)])
    assert queue.seek_group("g", "head") == 0
    options = {**FAST, "max_deliveries": 3, "dead_letter": dead}
    with queue.consumer("n1", group="g", **options) as consumer:  # type: ignore[arg-type]
        got = _receive(consumer, 2)
        assert _values(got) == ["poison", "ok"]  # delivered again, not moved
        consumer.ack(got)
    assert dead.info().size == 0 and queue.group("g").dead_lettered == 0


def test_a_seek_to_a_moment_whose_offset_the_head_passed_meanwhile_lands_on_the_head(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = store.new_queue(capacity=12, slots_per_record=3)
    queue.create_group("g")
    queue.enqueue_batch(list(range(6)))
    with queue.consumer("n1", group="g", **FAST) as consumer:
        consumer.ack(_receive(consumer, 3))
        consumer.close()  # its last sync moves the head to 3
    assert queue.info().head_offset == 3
    monkeypatch.setattr(queue, "offset_at", lambda moment: 1)  # looked up before the head passed offset 1
    assert queue.seek_group("g", datetime.datetime.now(datetime.timezone.utc)) == 3
    assert queue.group("g").delivered_offset == 3
