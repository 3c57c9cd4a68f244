"""``large-queue check`` names what is wrong and repairs only what is safe."""

from __future__ import annotations

from pathlib import Path

import pytest

from large_queue import CorruptQueueError, Queue, QueueNotFoundError, _locked, connect
from large_queue import _records as rec
from large_queue._check import check_queue
from large_queue.backends import ListSet, Write, WriteMode
from large_queue.cli import main
from tests.fix_backends import APPENDS, AfterFirstRead, Place, Store


@pytest.mark.parametrize("appends", APPENDS)
def test_a_healthy_queue_passes(store: Store, appends: str) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends=appends)
    queue.enqueue_batch(range(5))
    queue.dequeue_batch(2)
    report = check_queue(store.backend, queue.name)
    assert report.ok, report.lines()
    assert report.live_entries == 3


@pytest.mark.parametrize("appends", APPENDS)
def test_a_full_queue_read_a_few_records_at_a_time_counts_every_entry_once(
    store: Store, appends: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from large_queue import _check

    monkeypatch.setattr(_check, "BATCH", 2)  # 7 records in 4 reads, from the head's record round
    queue = store.new_queue(capacity=21, slots_per_record=3, appends=appends)
    queue.enqueue_batch(range(19))
    queue.dequeue_batch(17)
    queue.enqueue_batch(range(19))  # head 17, tail 38: full, the last two in the head's record again
    report = check_queue(store.backend, queue.name)
    assert report.ok, report.lines()
    assert report.live_entries == 21
    store.backend.remove(queue.keys.buffer(1))  # offsets 24..26 gone
    report = check_queue(store.backend, queue.name)
    assert report.problems == ["buffer record 1 is missing; the live offsets it held are gone: 24, 25, 26"]


@pytest.mark.parametrize("appends", APPENDS)
def test_slots_an_overwriting_producer_takes_while_checked_are_no_problem(store: Store, appends: str) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends=appends)
    queue.enqueue_batch(range(6))  # full: head 0, tail 6
    before = store.backend.get(queue.keys.metadata)
    assert before is not None

    def overwritten() -> None:  # after check has read the metadata (head 0), before the buffer records
        queue.enqueue_batch(["new"] * 4, overwrite_if_full=True)  # head 4; offsets 6..9 in slots 0..3

    report = check_queue(AfterFirstRead(store.backend, overwritten), queue.name)
    assert report.ok, report.lines()
    assert any("4 offsets were overwritten while they were checked" in n for n in report.notes), report.notes
    assert any("the head moved from 0 to 4 meanwhile" in n for n in report.notes), report.notes
    assert check_queue(store.backend, queue.name).live_entries == 6

    # The same slots while the head stays where the check read it: entries gone, a problem.
    queue.enqueue_batch(["newer"] * 4, overwrite_if_full=True)  # head 8; offsets 10..13 in slots 4, 5, 0, 1

    def overwritten_head_kept() -> None:
        queue.enqueue_batch(["newest"] * 4, overwrite_if_full=True)  # head 12
        store.backend.put(queue.keys.metadata, before.bins)  # head 0 again: damage, not an overwrite

    report = check_queue(AfterFirstRead(store.backend, overwritten_head_kept), queue.name)
    assert not report.ok
    assert not any("while they were checked" in n for n in report.notes), report.notes


def test_check_holds_a_few_records_in_memory_however_long_the_queue(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracemalloc

    from large_queue import _check

    monkeypatch.setattr(_check, "BATCH", 4)
    queue = store.new_queue(capacity=2_000, slots_per_record=10)
    entry = "x" * 1_000
    for _ in range(4):
        queue.enqueue_batch([entry] * 500)  # 2 MB of entries in 200 records
    tracemalloc.start()
    try:
        report = check_queue(store.backend, queue.name)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.ok and report.live_entries == 2_000, report.lines()
    assert peak < 400_000, peak  # read 4 records (40 KB of entries) at a time, not all 2 MB


def test_missing_buffer_record_is_named_and_repaired(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=6, slots_per_record=3)
    queue.enqueue_batch(range(5))
    store.backend.remove(queue.keys.buffer(1))
    report = check_queue(store.backend, queue.name)
    assert report.problems == ["buffer record 1 is missing; the live offsets it held are gone: 3, 4"]
    repaired = check_queue(store.backend, queue.name, repair=True)
    assert repaired.repaired and "recreated empty" in repaired.repaired[0]
    assert repaired.problems == ["live offsets whose slots no longer hold their entry: 3, 4"]
    assert [e.value for e in queue.dequeue_batch(10)] == [0, 1, 2]  # usable again; 3 and 4 were lost
    assert check_queue(store.backend, queue.name).ok


def test_a_missing_record_of_a_wrapped_reserving_queue_names_its_offsets_and_counts_nothing(
    store: Store,
) -> None:
    queue = store.new_queue(appends="reserve", capacity=9, slots_per_record=3)
    queue.enqueue_batch(range(7))
    queue.dequeue_batch(5)
    queue.enqueue_batch(range(7, 12))  # head 5, tail 12: record 0 holds 9, 10, 11; record 1 holds 5
    store.backend.remove(queue.keys.buffer(0))
    report = check_queue(store.backend, queue.name)
    assert report.problems == ["buffer record 0 is missing; the live offsets it held are gone: 9, 10, 11"]
    assert report.live_entries is None and "live entries not counted" in report.lines()[-1]  # not 0


def test_unpublished_and_closed_reservations_are_noted_not_problems(store: Store) -> None:
    queue = store.new_queue(capacity=9, slots_per_record=3, appends="reserve")
    queue.enqueue_batch(range(2))
    closed = queue.appender.reserve(1, overwrite=False)
    queue.appender.close(closed, closed + 1)  # as a reader does after the hole timeout
    queue.enqueue("published")
    queue.appender.reserve(2, overwrite=False)  # a producer that has not published yet
    report = check_queue(store.backend, queue.name)
    assert report.ok, report.lines()
    assert report.live_entries == 3
    assert any("1 reserved offsets were closed" in note for note in report.notes), report.notes
    assert any(
        "offsets 4, 5 are reserved and not published yet: the prefix ends at 4" in n for n in report.notes
    )


def test_a_malformed_slot_of_a_reserving_queue_is_named(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends="reserve")
    queue.enqueue("kept")
    store.backend.operate(
        queue.keys.buffer(0), [ListSet(rec.SLOTS, 1, [1, "x", 0, 0])]
    )  # batch end before it
    report = check_queue(store.backend, queue.name)
    assert any("slot 1 is malformed" in p for p in report.problems), report.problems


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ([ListSet(rec.SLOTS, 1, "garbage")], "slot 1 is malformed"),
        ([ListSet(rec.SLOTS, 2, [0, "x", 0])], "slot 2 holds offset 0, which belongs elsewhere"),
        ([ListSet(rec.SLOTS, 0, [0, "x", "yesterday"])], "slot 0 is malformed"),  # no enqueue time
        ([Write(rec.FENCE_COUNTER, 10**6)], "ahead of the queue's counter"),
        ([Write(rec.FENCE_EPOCH, "one")], "non-integer fencing marks"),
        ([Write(rec.SLOTS, [None])], "does not hold a list of 3 slots"),
    ],
)
def test_damaged_buffer_records_are_named(store: Store, damage: list[object], problem: str) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3)
    queue.enqueue("kept")
    store.backend.operate(queue.keys.buffer(0), damage)  # type: ignore[arg-type]
    report = check_queue(store.backend, queue.name)
    assert any(problem in p for p in report.problems), report.problems


def test_damaged_metadata_is_named_not_raised(store: Store) -> None:
    queue = store.new_queue()
    store.backend.put(queue.keys.metadata, {rec.HEAD: 9}, mode=WriteMode.UPDATE_ONLY)
    report = check_queue(store.backend, queue.name)
    assert len(report.problems) == 1 and "head 9 and tail 0" in report.problems[0]
    assert not check_queue(store.backend, "no-such-queue").ok


def test_check_command(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    url, q = place.url, place.name("q")
    create = ["create", q, "--capacity", "4", "--slots-per-record", "2", "--record-size-limit", "65536"]
    assert main(["--url", url, *create]) == 0
    assert '"max_entry_bytes": 30696' in capsys.readouterr().out
    assert main(["--url", url, "enqueue", q, '{"a": 1}', "[2]"]) == 0
    assert main(["--url", url, "check", q]) == 0
    assert "2 live entries; OK" in capsys.readouterr().out
    assert main(["--url", url, "get", q, "1"]) == 0
    assert '"value": [2]' in capsys.readouterr().out
    assert main(["--url", url, "enqueue", q, "{bad json"]) == 1
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["--url", url, "info", q]) == 0
    assert '"tail_offset": 2' in capsys.readouterr().out
    assert main(["--url", url, "dequeue", q]) == 0
    assert '"value": {"a": 1}' in capsys.readouterr().out
    assert main(["--url", url, "delete", q]) == 0
    assert main(["--url", url, "info", q]) == 1
    assert "QueueNotFoundError" in capsys.readouterr().err


def test_demo_command(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", place.url, "demo"]) == 0
    out = capsys.readouterr().out
    assert "message 12 refused: queue 'demo' has 0 free slots" in out  # capacity 12: the 13th is refused
    assert "empty now: True" in out


@pytest.mark.parametrize(
    "arguments",
    [
        ["bench", "--operations", "0"],
        ["bench", "--processes", "0"],
        ["bench", "--batch-size", "-5"],
        ["torture", "--producers", "0"],
        ["torture", "--duration", "nan"],
    ],
)
def test_counts_that_cannot_work_are_refused_by_the_command_line(
    arguments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == 2
    assert "positive" in capsys.readouterr().err


def test_errors_are_one_line_and_debug_shows_the_traceback(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"embedded://{tmp_path}/cli.db"
    assert main(["--url", url, "create", "other", "--capacity", "4"]) == 0
    assert main(["--url", url, "info", "missing"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "large-queue: QueueNotFoundError: queue 'missing' does not exist in namespace 'test'"
    ]
    with pytest.raises(QueueNotFoundError):
        main(["--url", url, "--debug", "info", "missing"])


def test_read_only_commands_never_create_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"embedded://{tmp_path}/missing/dir/store.db"
    for command in (["info", "q"], ["get", "q", "0"], ["check", "q"], ["dequeue", "q"], ["delete", "q"]):
        assert main(["--url", url, *command]) == 1
        assert "StoreFileError: there is no store file at" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


def test_json_on_the_command_line_is_standard_both_ways(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    url, q = place.url, place.name("q")
    assert main(["--url", url, "create", q, "--capacity", "4"]) == 0
    for text in ("NaN", "[1e400]", '{"x": -Infinity}'):
        assert main(["--url", url, "enqueue", q, text]) == 1
        assert "is not valid JSON" in capsys.readouterr().err
    Queue.open(connect(url), q).enqueue([float("nan"), float("-inf"), 1.5])
    assert main(["--url", url, "get", q, "0"]) == 0
    assert '"value": ["NaN", "-Infinity", 1.5]' in capsys.readouterr().out


def test_list_names_the_queues_of_the_namespace(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    names = sorted(place.name(base) for base in ("a", "b"))
    for name in names:
        assert main(["--url", place.url, "create", name, "--capacity", "4"]) == 0
    capsys.readouterr()
    assert main(["--url", place.url, "list"]) == 0
    listed = capsys.readouterr().out.split()
    assert [name for name in listed if name in names] == names


def test_help_says_what_each_option_does_and_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "``" not in top and "Manage, inspect" in top
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "single operations of each kind (default: 3000)" in " ".join(capsys.readouterr().out.split())


def test_a_publish_into_a_missing_buffer_record_names_the_record_not_a_deleted_queue(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends="reserve")
    queue.enqueue("kept")
    store.backend.remove(queue.keys.buffer(0))
    with pytest.raises(
        CorruptQueueError, match=r"buffer record 0 .* is missing: offsets 1\.\.1 were reserved"
    ):
        queue.enqueue("lost")
    Queue.delete(store.backend, queue.name)
    with pytest.raises(QueueNotFoundError, match="was deleted"):
        queue.enqueue("gone")


def test_a_consumer_group_without_its_owner_record_is_named(store: Store) -> None:
    queue = store.new_queue()
    queue.create_group("billing")
    assert check_queue(store.backend, queue.name).ok
    store.backend.remove(queue.keys.group("billing").owner)  # as a delete of it under way leaves it too
    queue.create_group("audit")
    assert [group.name for group in queue.info().groups] == ["audit"]  # the others are still shown
    assert [group.name for group in queue.groups()] == ["audit"]
    queue.delete_group("audit")
    report = check_queue(store.backend, queue.name)
    assert report.problems == [
        "consumer group 'billing' is listed but its owner record is missing: where it had got to is gone"
        f" (large-queue groups {queue.name} --delete billing, then create it again)"
    ]
    assert queue.delete_group("billing")
    assert check_queue(store.backend, queue.name).ok


def test_a_reserving_queue_repaired_closes_what_it_lost_and_says_so(store: Store) -> None:
    queue = store.new_queue(capacity=9, slots_per_record=3, appends="reserve", hole_timeout=60.0)
    for n in range(7):
        queue.enqueue(n)  # offsets 0..6, all published
    store.backend.remove(queue.keys.buffer(1))
    repaired = check_queue(store.backend, queue.name, repair=True)
    assert repaired.repaired == [
        "buffer record 1 was missing and was recreated empty; the live offsets it held are gone: 3, 4, 5"
    ]
    report = check_queue(store.backend, queue.name)
    assert (report.ok, report.live_entries) == (True, 4), report.lines()
    assert [e.value for e in queue.dequeue_batch(10)] == [0, 1, 2, 6]  # at once, not after the hole timeout


def test_a_repair_that_closes_a_batch_names_its_parts_in_intact_records(store: Store) -> None:
    queue = store.new_queue(capacity=10, slots_per_record=5, appends="reserve", hole_timeout=60.0)
    queue.enqueue_batch(range(7))  # one batch: offsets 0..4 in record 0, its last two in record 1
    queue.enqueue(7)
    store.backend.remove(queue.keys.buffer(1))
    repaired = check_queue(store.backend, queue.name, repair=True)
    assert repaired.repaired == [
        "buffer record 1 was missing and was recreated empty; the live offsets it held are gone: 5, 6, 7",
        "offsets 0, 1, 2, 3, 4 were closed too, though their records are intact: they belong to batches"
        " whose last offset the missing records held, and a batch is delivered whole or not at all"
        " (whether it had been published cannot be told)",
    ]
    assert not any("producers failed" in note for note in repaired.notes), repaired.notes
    assert (repaired.ok, repaired.live_entries) == (True, 0)
    assert queue.dequeue_batch(10) == []


def test_published_offsets_that_hold_no_entry_are_named_lost(store: Store) -> None:
    queue = store.new_queue(capacity=9, slots_per_record=3, appends="reserve")
    for n in range(7):
        queue.enqueue(n)
    assert queue.dequeue().value == 0  # type: ignore[union-attr]
    # as a reader leaves it that settled every offset up to the tail (a group's, say)
    store.backend.put(queue.keys.metadata, {rec.PUBLISHED: 7}, mode=WriteMode.UPDATE_ONLY)
    empty = rec.empty_buffer(3, (0, 0), queue.incarnation, reserved=True)  # what a repair once left
    store.backend.put(queue.keys.buffer(1), empty, mode=WriteMode.REPLACE)
    report = check_queue(store.backend, queue.name)
    assert report.problems == ["live offsets below the published mark 7 hold no entry (lost): 3, 4, 5"]
    assert report.live_entries == 3


def test_a_published_mark_past_the_tail_is_named(store: Store) -> None:
    queue = store.new_queue(capacity=9, slots_per_record=3, appends="reserve")
    queue.enqueue("x")
    store.backend.put(queue.keys.metadata, {rec.PUBLISHED: 1000}, mode=WriteMode.UPDATE_ONLY)
    report = check_queue(store.backend, queue.name)
    assert report.problems == [
        f"metadata record of queue {queue.name!r}: bin 'published' holds 1000, past the tail 1"
    ]
    with pytest.raises(CorruptQueueError, match="past the tail"):
        Queue.open(store.backend, queue.name).info()


def test_a_malformed_slot_is_named_with_its_own_record(store: Store) -> None:
    queue = store.new_queue(capacity=9, slots_per_record=3, appends="reserve")
    queue.enqueue_batch(range(5))
    store.backend.operate(queue.keys.buffer(1), [ListSet(rec.SLOTS, 1, None)])  # offset 4's slot
    with pytest.raises(CorruptQueueError, match=r"buffer record 1 .*offset 4") as raised:
        queue.dequeue_batch(10)
    assert raised.value.record == 1  # type: ignore[attr-defined]


def test_a_slot_past_the_tail_is_noted_not_a_problem(store: Store) -> None:
    queue = store.new_queue(capacity=6, slots_per_record=3, appends="lock")
    queue.enqueue("kept")
    store.backend.operate(
        queue.keys.buffer(0), [ListSet(rec.SLOTS, 2, [2, "x", 0])]
    )  # written, not committed
    report = check_queue(store.backend, queue.name)
    assert report.ok, report.lines()
    assert any("holds offset 2, at or beyond the tail 1" in note for note in report.notes), report.notes


def test_an_append_under_the_lock_never_committed_is_noted_not_shown(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=12, slots_per_record=3)
    queue.enqueue("a")
    grant = queue.lock.acquire("ghost")
    _locked.write_entries(queue, grant, ["ghost"], overwrite_if_full=False)  # slot of offset 1, the tail
    queue.lock.release(grant)  # never committed: the tail stays 1
    assert [e.value for e in queue.peek(10)] == ["a"]
    report = check_queue(store.backend, queue.name)
    assert report.ok, report.lines()
    assert any("slot 1 holds offset 1, at or beyond the tail 1" in note for note in report.notes), (
        report.notes
    )


def test_a_live_offset_whose_slot_holds_another_lap_is_named(store: Store) -> None:
    queue = store.new_queue(appends="lock", capacity=12, slots_per_record=3, encoding="native")
    queue.enqueue_batch(list(range(12)))
    queue.dequeue_batch(12)
    queue.enqueue_batch([12, 13, 14])  # the second lap, in record 0
    store.backend.operate(queue.keys.buffer(0), [ListSet(rec.SLOTS, 1, [1, "stale", 0])])  # lap one again
    report = check_queue(store.backend, queue.name)
    assert report.problems == ["live offsets whose slots no longer hold their entry: 13"], report.lines()


def test_a_reservation_at_the_published_mark_is_pending_not_lost(store: Store) -> None:
    queue = store.new_queue(appends="reserve", capacity=12, slots_per_record=3, hole_timeout=60)
    queue.enqueue_batch(["a", "b"])
    queue.appender.reserve(1, overwrite=False)  # offset 2: not published yet
    queue.enqueue("d")
    assert [e.value for e in queue.dequeue_batch(10)] == ["a", "b"]  # stops at the hole
    assert queue.current_metadata().published == 2
    report = check_queue(store.backend, queue.name)
    assert report.ok, report.lines()
    assert any("offsets 2 are reserved and not published yet" in note for note in report.notes), report.notes


def test_the_check_command_exits_1_on_a_damaged_queue(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("damaged")
    backend = place.connect()
    queue = Queue.create(backend, name, capacity=4, slots_per_record=2)
    queue.enqueue("a")
    assert main(["--url", place.url, "check", name]) == 0
    backend.remove(queue.keys.buffer(0))
    capsys.readouterr()
    assert main(["--url", place.url, "check", name]) == 1
    assert "problem: buffer record 0 is missing" in capsys.readouterr().out
