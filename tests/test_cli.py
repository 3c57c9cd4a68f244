"""The command line as an operator meets it: whatever is stored is printed, a hole at the head is
waited out, the gauges count what producers reserved, and no file or queue it was not asked about
is touched."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from large_queue import Queue
from large_queue.backends import RecordKey
from large_queue.cli import main
from tests.fix_backends import Place


def _out(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out


def test_an_entry_with_bytes_keys_is_printed_not_lost(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("q")
    queue = Queue.create(place.connect(), name, capacity=6, slots_per_record=3)
    queue.enqueue_batch([{b"k": b"v", "n": 1}, {b"k": 2}])
    assert main(["--url", place.url, "get", name, "0"]) == 0
    printed = json.loads(_out(capsys))
    assert printed["value"] == {"$bytes:aw==": {"$bytes": "dg=="}, "n": 1}
    assert main(["--url", place.url, "dequeue", name]) == 0
    assert json.loads(_out(capsys))["value"] == {"$bytes:aw==": {"$bytes": "dg=="}, "n": 1}
    assert main(["--url", place.url, "dequeue", name]) == 0
    assert json.loads(_out(capsys))["value"] == {"$bytes:aw==": 2}


def test_dequeue_waits_out_a_reservation_never_published(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("q")
    queue = Queue.create(place.connect(), name, capacity=9, slots_per_record=3, hole_timeout=0.3)
    queue.enqueue("before")
    queue.appender.reserve(1, overwrite=False)  # a producer killed before it published
    queue.enqueue("after")
    assert main(["--url", place.url, "stats", name]) == 0
    stats = json.loads(_out(capsys))
    assert (stats["size"], stats["free"]) == (1, 6)  # the reserved offset is not free
    assert main(["--url", place.url, "dequeue", name]) == 0
    assert json.loads(_out(capsys))["value"] == "before"
    assert main(["--url", place.url, "dequeue", name]) == 0  # a new process: it waits the hole timeout
    captured = capsys.readouterr()
    assert json.loads(captured.out)["value"] == "after"
    assert "offset 1 is reserved and not yet published" in captured.err


def test_the_demo_leaves_a_users_queue_named_demo_alone(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = place.connect()
    Queue.delete(backend, "demo")
    mine = Queue.create(backend, "demo", capacity=10)
    try:
        mine.enqueue("precious")
        assert main(["--url", place.url, "demo"]) == 1
        assert "already has one" in capsys.readouterr().err
        assert mine.dequeue().value == "precious"  # type: ignore[union-attr]
    finally:
        Queue.delete(backend, "demo")


@pytest.mark.parametrize(
    ("made", "named"),
    [
        ("CREATE TABLE t (x)", "tables t"),
        ("CREATE TABLE records (id INTEGER PRIMARY KEY, body TEXT)", "tables records (id, body)"),
        ("CREATE VIEW v AS SELECT 1", "view v"),
        ("PRAGMA user_version=42", "user_version=42"),
        ("PRAGMA application_id=12345", "application_id=12345"),
    ],
)
def test_another_programs_sqlite_file_is_refused_and_left_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], made: str, named: str
) -> None:
    path = tmp_path / "other.db"

    def contents() -> tuple[object, ...]:
        other = sqlite3.connect(path)
        try:
            return (
                other.execute("SELECT type, name, sql FROM sqlite_master").fetchall(),
                other.execute("PRAGMA journal_mode").fetchone(),
                other.execute("PRAGMA user_version").fetchone(),
            )
        finally:
            other.close()

    other = sqlite3.connect(path)
    other.execute(made)
    other.commit()
    other.close()
    before = contents()
    assert main(["--url", f"embedded://{path}", "list"]) == 1
    assert f"SQLite database of something else ({named}), not an embedded store" in capsys.readouterr().err
    assert contents() == before


def test_an_entry_nested_past_what_can_be_read_is_one_line(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("q")
    assert main(["--url", place.url, "create", name, "--capacity", "4"]) == 0
    _out(capsys)
    assert main(["--url", place.url, "enqueue", name, "[" * 5000 + "]" * 5000]) == 1
    error = capsys.readouterr().err
    assert error.startswith("large-queue: InvalidArgumentError:") and error.count("\n") == 1


def test_a_groups_loss_shows_before_its_consumers_meet_it(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("q")
    queue = Queue.create(place.connect(), name, capacity=4, slots_per_record=2)
    queue.create_group("g")
    queue.enqueue_batch([1, 2, 3, 4])
    queue.enqueue_batch([5, 6, 7], overwrite_if_full=True)  # drops 1, 2, 3: the group had acked none
    (group,) = queue.groups()
    assert (group.lag, group.lost) == (4, 3)
    assert main(["--url", place.url, "stats", name]) == 0
    shown = json.loads(_out(capsys))["groups"]["g"]
    assert (shown["lost"], shown["not_delivered"]) == (3, 4)  # the lost ones are not still to deliver
    with queue.consumer("n1", group="g", time_slice=30, timeout=5, poll_interval=0.05) as consumer:
        got = consumer.receive(10, timeout=2)
        got += consumer.receive(10, timeout=2)
        assert [m.value for m in got] == [4, 5, 6, 7]
    (group,) = queue.groups()
    assert (group.lag, group.lost) == (4, 3)  # counted once: now stored, no longer unseen


def test_info_of_a_shared_queue_is_one_json_document(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("q")
    queue = Queue.create(place.connect(), name, capacity=6, slots_per_record=3)
    queue.enqueue("x")
    with queue.consumer("n1", time_slice=30, timeout=5, poll_interval=0.05) as consumer:
        consumer.receive(1, timeout=2)
        assert main(["--url", place.url, "info", name]) == 0
    described = json.loads(_out(capsys))  # one document: json.loads refuses two
    assert described["tail_offset"] == 1 and described["ownership"]["owner"] == "n1"
    assert described["ownership"]["in_flight"] == 1


def test_a_hole_timeout_is_refused_for_locked_appends_and_kept_for_reserving_ones(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("q")
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "--url",
                place.url,
                "create",
                name,
                "--capacity",
                "9",
                "--appends",
                "lock",
                "--hole-timeout",
                "5",
            ]
        )
    assert exit_.value.code == 2
    assert "--hole-timeout applies to --appends reserve only" in capsys.readouterr().err
    assert main(["--url", place.url, "create", name, "--capacity", "9", "--appends", "lock"]) == 0
    assert json.loads(_out(capsys))["appends"] == "lock"  # nothing was created by the refused command
    other = place.name("r")
    assert main(["--url", place.url, "create", other, "--capacity", "9", "--hole-timeout", "5"]) == 0
    assert Queue.open(place.connect(), other).hole_timeout == 5


def test_torture_refuses_a_group_without_a_consumer(capsys: pytest.CaptureFixture[str]) -> None:
    # consumer i is a node of group i % N: with more groups than consumers one group never acks,
    # and the run stalls once the queue is full while its checker finds nothing wrong
    with pytest.raises(SystemExit) as exit_:
        main(["torture", "--groups", "3", "--consumers", "2", "--duration", "1"])
    assert exit_.value.code == 2
    assert "--groups 3 needs at least 3 consumers" in capsys.readouterr().err


def test_peek_prints_entries_from_an_offset_one_line_each_and_takes_none(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("q")
    queue = Queue.create(place.connect(), name, capacity=9, slots_per_record=3)
    queue.enqueue_batch([{"n": n} for n in range(5)])
    assert main(["--url", place.url, "peek", name, "--from", "1", "--count", "3"]) == 0
    lines = _out(capsys).splitlines()
    assert [(json.loads(line)["offset"], json.loads(line)["value"]) for line in lines] == [
        (1, {"n": 1}),
        (2, {"n": 2}),
        (3, {"n": 3}),
    ]
    assert main(["--url", place.url, "peek", name]) == 0
    assert len(_out(capsys).splitlines()) == 5
    assert queue.info().size == 5
    assert main(["--url", place.url, "peek", name, "--from", "-1"]) == 1
    assert "InvalidArgumentError" in capsys.readouterr().err


def test_help_gives_each_option_one_default(capsys: pytest.CaptureFixture[str]) -> None:
    from large_queue.cli import _parser

    commands = [[], *[[name] for name in _parser()._subparsers._group_actions[0].choices]]  # type: ignore[union-attr]
    for command in commands:
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        text = capsys.readouterr().out
        options = " ".join(text.split()).split(" -")  # each option's help on one line
        said_twice = [option for option in options if option.count("default") > 1]
        assert not said_twice and "(default: None)" not in text, (command, said_twice)


def test_bench_spark_without_the_spark_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "large_queue.spark._bench", None)  # as if pyarrow were missing
    assert main(["bench", "--spark"]) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "pip install 'large-queue[spark]'" in said[0]


def test_info_and_stats_of_a_queue_readers_cannot_settle_say_so_and_fail(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("q")
    backend = place.connect()
    queue = Queue.create(backend, name, capacity=10, slots_per_record=5)
    queue.enqueue_batch(range(7))
    backend.remove(queue.keys.buffer(1))  # lost with the batch's last offset
    for command in ("info", "stats"):
        assert main(["--url", place.url, command, name]) == 1
        captured = capsys.readouterr()
        damaged = json.loads(captured.out)["damaged"]
        assert "buffer record 1" in damaged and f"large-queue check {name}" in damaged
        assert captured.err == f"large-queue: queue {name!r} is damaged: {damaged}\n"
    assert main(["--url", place.url, "check", "--repair", name]) == 0
    capsys.readouterr()
    assert main(["--url", place.url, "info", name]) == 0
    assert json.loads(_out(capsys))["damaged"] is None


def test_deleting_what_is_not_there_fails_unless_asked_not_to(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("q")
    assert main(["--url", place.url, "create", place.name("other"), "--capacity", "4"]) == 0  # the store is
    capsys.readouterr()
    assert main(["--url", place.url, "delete", name]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"deleted": False}
    assert captured.err == f"large-queue: QueueNotFoundError: there is no queue {name!r}\n"
    assert main(["--url", place.url, "delete", "--if-exists", name]) == 0
    assert json.loads(_out(capsys)) == {"deleted": False}
    assert main(["--url", place.url, "create", name, "--capacity", "4"]) == 0
    assert main(["--url", place.url, "groups", name, "--create", "a"]) == 0
    capsys.readouterr()
    assert main(["--url", place.url, "groups", name, "--create", "b", "--delete", "typo"]) == 1
    assert capsys.readouterr().err == (
        f"large-queue: GroupNotFoundError: queue {name!r} has no consumer group 'typo'\n"
    )
    assert [g.name for g in Queue.open(place.connect(), name).groups()] == ["a"]  # b not made either
    # a seek of a group the same command deletes, or of none, is refused before anything changes
    assert main(["--url", place.url, "groups", name, "--delete", "a", "--seek", "a", "--to", "head"]) == 1
    assert "InvalidArgumentError: --seek 'a' moves a group that --delete deletes" in capsys.readouterr().err
    assert main(["--url", place.url, "groups", name, "--create", "c", "--seek", "typo", "--to", "head"]) == 1
    assert capsys.readouterr().err == (
        f"large-queue: GroupNotFoundError: queue {name!r} has no consumer group 'typo'\n"
    )
    assert [g.name for g in Queue.open(place.connect(), name).groups()] == ["a"]
    assert main(["--url", place.url, "groups", name, "--create", "c", "--seek", "c", "--to", "tail"]) == 0
    assert [g.name for g in Queue.open(place.connect(), name).groups()] == ["a", "c"]
    capsys.readouterr()
    assert main(["--url", place.url, "delete", name]) == 0
    assert json.loads(_out(capsys)) == {"deleted": True}


def test_an_entry_that_is_not_json_is_named_by_its_place(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    name = place.name("q")
    assert main(["--url", place.url, "create", name, "--capacity", "4"]) == 0
    assert main(["--url", place.url, "enqueue", name, "1", "{"]) == 1
    assert "InvalidArgumentError: entry 1 is not valid JSON:" in capsys.readouterr().err
    assert Queue.open(place.connect(), name).info().size == 0  # the batch is all or none


def test_compact_of_an_aerospike_url_is_refused_without_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["--url", "aerospike://192.0.2.1:3000/test?timeout_ms=60000", "compact"]) == 1
    )  # TEST-NET: no host
    assert capsys.readouterr().err == (
        "large-queue: InvalidArgumentError: compact is for embedded stores: Aerospike reclaims space itself\n"
    )


def test_the_librarys_warnings_are_the_commands_own_lines(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"embedded://{tmp_path}/s.db"
    script = (
        "import sys, time; from large_queue import Queue, connect; from large_queue.cli import main;"
        f" q = Queue.create(connect({url!r}), 'aged', capacity=4, max_age=0.05); q.enqueue(1);"
        f" time.sleep(0.2); code = main(['--url', {url!r}, 'expire', 'aged']);"
        " import logging; logging.basicConfig(format='app: %(message)s');"  # the program's own, after
        " logging.getLogger('large_queue').warning('later'); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dropped"] == 1
    assert done.stderr.splitlines() == [
        "large-queue: queue 'aged': 1 entries older than max_age were dropped",
        "app: later",  # once: the command's handler left with the command
    ]


def test_enqueue_reads_entries_from_standard_input_one_a_line(
    place: Place, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    name = place.name("q")
    assert main(["--url", place.url, "create", name, "--capacity", "4"]) == 0
    big = "x" * 200_000  # past what one argument of a command line may hold
    monkeypatch.setattr("sys.stdin", io.StringIO(f'{{"a": 1}}\n\n"{big}"\n'))
    capsys.readouterr()
    assert main(["--url", place.url, "enqueue", name, "-"]) == 0
    assert json.loads(_out(capsys)) == {"offsets": [0, 1]}
    assert [e.value for e in Queue.open(place.connect(), name).peek(5)] == [{"a": 1}, big]
    monkeypatch.setattr("sys.stdin", io.StringIO('"a\u2028b"\r\n'))  # a line separator inside a string
    assert main(["--url", place.url, "enqueue", name, "-"]) == 0
    assert Queue.open(place.connect(), name).get(2).value == "a\u2028b"  # type: ignore[union-attr]
    monkeypatch.setattr("sys.stdin", io.StringIO('3\n\n\n{"b"\n'))
    assert main(["--url", place.url, "enqueue", name, "-"]) == 1
    assert "line 4 is not valid JSON" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO(f"1\n\n\n{2**70}\n"))  # JSON, but past 64 bits
    assert main(["--url", place.url, "enqueue", name, "-"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("large-queue: UnsupportedEntryError: line 4 of standard input: entry 1 "), said
    assert Queue.open(place.connect(), name).info().size == 3  # all or none: the 1 was not written


@pytest.mark.parametrize(
    ("options", "said"),
    [(["bad name"], "queue name 'bad name'"), (["q", "--record-size-limit", "5"], "record_size_limit")],
)
def test_a_refused_create_makes_no_store_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], said: str
) -> None:
    path = tmp_path / "new" / "store.db"
    assert main(["--url", f"embedded://{path}", "create", "--capacity", "4", *options]) == 1
    assert said in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("appends", ["lock", "reserve"])
def test_stats_and_info_say_when_the_lock_holder_has_been_silent_past_its_ttl(
    place: Place, capsys: pytest.CaptureFixture[str], appends: str
) -> None:
    name = place.name("q")
    queue = Queue.create(place.connect(), name, capacity=4, lock_ttl=0.3, appends=appends)
    queue.lock.try_acquire("dead")  # a holder that never comes back
    for expired in (False, True):
        for command in ("stats", "info"):
            assert main(["--url", place.url, command, name]) == 0
            printed = json.loads(_out(capsys))
            assert (printed.get("locked_by") or printed.get("lock_owner"), printed["lock_expired"]) == (
                "dead",
                expired,
            )
        time.sleep(0.5)
    queue.purge()  # the next taker of the lock breaks it
    assert main(["--url", place.url, "stats", name]) == 0
    assert "lock_expired" not in json.loads(_out(capsys))


@pytest.mark.parametrize("entry", [{b"x": 1, "$bytes:eA==": 2}, {1: "int", "1": "str"}], ids=["bytes", "int"])
def test_an_entry_whose_keys_would_merge_in_json_is_refused_not_printed_short(
    place: Place, capsys: pytest.CaptureFixture[str], entry: dict[object, object]
) -> None:
    name = place.name("q")
    queue = Queue.create(place.connect(), name, capacity=4)
    queue.enqueue(entry)
    queue.enqueue({1: "int alone", "2": "str"})
    assert main(["--url", place.url, "peek", name]) == 1
    assert "would be one key in JSON" in capsys.readouterr().err
    assert main(["--url", place.url, "get", name, "1"]) == 0
    assert json.loads(_out(capsys))["value"] == {"1": "int alone", "2": "str"}


def test_an_embedded_url_sets_how_long_a_command_waits_for_a_busy_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator's command does not hang 30 s on a file another writer holds: ``busy_timeout_ms``."""
    from large_queue.backends.embedded import EmbeddedBackend

    url = f"embedded://{tmp_path}/busy.db?busy_timeout_ms=300"
    Queue.create(url, "q", capacity=4)
    holder = EmbeddedBackend(tmp_path / "busy.db")
    with holder.grouped():
        holder.put(RecordKey("test", "other", "k"), {"v": 1})  # the writer lock is held from here on
        started = time.monotonic()
        assert main(["--url", url, "enqueue", "q", "1"]) == 1
        waited = time.monotonic() - started
    assert "stayed locked by another process for 0.3 s" in capsys.readouterr().err
    assert 0.3 <= waited < 10
    assert main(["--url", url, "enqueue", "q", "2"]) == 0  # free again
    assert [entry.value for entry in Queue.open(url, "q").peek()] == [2]
