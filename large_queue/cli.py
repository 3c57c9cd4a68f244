"""The ``large-queue`` command: manage, inspect, demo and benchmark queues.

Examples::

    large-queue create events --capacity 100000
    large-queue enqueue events '{"id": 1}'
    large-queue dequeue events
    large-queue info events
    large-queue check events [--repair]
    large-queue get events 0
    large-queue peek events --from 100 --count 20
    large-queue groups events --seek billing --to 2026-11-27T09:00:00Z
    large-queue expire events
    large-queue purge events
    large-queue demo
    large-queue bench
    large-queue torture --duration 60

The store comes from ``--url`` or ``LARGE_QUEUE_URL`` (see
:func:`large_queue.connect`); only ``create``, ``demo``, ``bench`` and
``torture`` make an embedded store's file. Entries are given and printed as
standard JSON: ``NaN`` and numbers beyond a double are refused on input, and
stored floats JSON has no number for print as the strings "NaN",
"Infinity" and "-Infinity".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from large_queue import errors
from large_queue._entries import DEFAULT_ENCODING, ENCODINGS, bytes_as_json, finite, json_key
from large_queue._records import LOCKED_APPENDS, RESERVED_APPENDS
from large_queue.backends import connect
from large_queue.queue import DEFAULT_APPENDS, Entry, Queue, QueueInfo


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return bytes_as_json(value)


def _print(value: Any) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    print(json.dumps(_standard(value), default=_json_default, ensure_ascii=False, allow_nan=False))


def _standard(value: Any) -> Any:
    """``value`` as JSON can say it: the floats JSON has no number for (NaN, infinities) as the strings
    JavaScript uses, int map keys as their decimal text and bytes map keys as ``"$bytes:<base64>"`` (a
    JSON key must be a string)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        shown = {json_key(key): _standard(item) for key, item in value.items()}
        if len(shown) < len(value):
            raise errors.UnsupportedEntryError(
                "an entry holds a map key (bytes, or an int) and a str key that would be one key in"
                ' JSON (1 and "1"): get it through the library instead'
            )
        return shown
    if isinstance(value, (list, tuple)):
        return [_standard(item) for item in value]
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _names_aerospike(url: str | None) -> bool:
    """True if ``url`` (or, without one, the environment's) is an Aerospike URL: not to be connected
    to by a command for embedded stores only."""
    from large_queue.backends import URL_ENVIRONMENT_VARIABLE

    return (url or os.environ.get(URL_ENVIRONMENT_VARIABLE) or "").lower().startswith("aerospike:")


def _json_entry(where: str, text: str) -> Any:
    """An entry of ``enqueue`` (``where``: which argument or line), read as JSON.

    ``InvalidArgumentError`` naming ``where`` if it is not JSON, or holds a
    number JSON reads with no double for.
    """
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=finite)
    except ValueError as exc:  # json.JSONDecodeError is one
        raise errors.InvalidArgumentError(f"{where} is not valid JSON: {exc}") from None
    except RecursionError:
        raise errors.InvalidArgumentError(f"{where} is nested too deeply to read") from None


def _entries_given(entries: list[str]) -> tuple[list[str], list[Any]]:
    """``enqueue``'s entries and where each was given: its arguments, or with ``-`` alone one a line
    of standard input.

    Lines end at a line feed only (JSON may hold other line separators,
    such as U+2028, inside its strings); blank lines are no entries.
    """
    if entries != ["-"]:
        given = [(f"entry {index}", text) for index, text in enumerate(entries)]
    else:
        lines = sys.stdin.read().split("\n")
        given = [(f"line {number}", line) for number, line in enumerate(lines, 1) if line.strip()]
    return [where for where, _ in given], [_json_entry(where, text) for where, text in given]


def _enqueue(queue: Queue, entries: list[str], *, overwrite_if_full: bool) -> list[int]:
    """``enqueue``'s batch, all or none; a refused entry read from standard input is named by its line."""
    wheres, values = _entries_given(entries)
    try:
        return list(queue.enqueue_batch(values, overwrite_if_full=overwrite_if_full))
    except (errors.UnsupportedEntryError, errors.EntryTooLargeError) as exc:
        index = getattr(exc, "entry_index", None)
        if index is None or entries != ["-"]:
            raise  # the entries are the arguments, which the error's index counts already
        raise type(exc)(f"{wheres[index]} of standard input: {exc}", **vars(exc)) from None


def _demo(url: str | None) -> None:
    store = connect(url)
    print(f"store: {store!r}")
    try:
        queue = Queue.create(store, "demo", capacity=12, slots_per_record=3)
    except errors.QueueExistsError:
        raise errors.QueueExistsError(
            "the demo makes (and deletes) a queue named 'demo', and this store already has one:"
            " delete it first (large-queue delete demo) or run the demo on another store",
            queue="demo",
        ) from None
    try:
        print(
            f"created {queue!r}: {queue.shape.record_count} buffer records"
            f" of {queue.shape.slots_per_record} slots"
        )
        for n in range(13):  # one too many
            try:
                offset = queue.enqueue({"msg-id": n, "text": f"message {n}"})
                print(f"enqueued message {n} at offset {offset}")
            except errors.QueueFullError as exc:
                print(f"message {n} refused: {exc}")
        print(
            "with overwrite_if_full the oldest entry makes room:",
            queue.enqueue({"msg-id": 13, "text": "ring mode"}, overwrite_if_full=True),
        )
        info = queue.info()
        print(f"head {info.head_offset}, tail {info.tail_offset}, size {info.size}")
        print("offset read of the head, no lock:", queue.get(info.head_offset))
        print("offset read of an overwritten offset:", queue.get(0))
        print("batch dequeue of 5:", [e.value["msg-id"] for e in queue.dequeue_batch(5)])
        while (entry := queue.dequeue()) is not None:
            print(f"dequeued offset {entry.offset}: {entry.value}")
        print("empty now:", queue.info().size == 0)
    finally:
        Queue.delete(store, "demo")


def _bench(args: argparse.Namespace) -> None:
    from large_queue import _bench

    url = args.url or os.environ.get("LARGE_QUEUE_URL")
    if args.spark:
        try:
            from large_queue.spark import _bench as spark_bench
        except ImportError as exc:  # pyspark or pyarrow
            raise errors.InvalidArgumentError(
                f"bench --spark needs the spark extra: pip install 'large-queue[spark]' ({exc})"
            ) from None

        spark_bench.run(url, entries=args.entries)
        return
    with tempfile.TemporaryDirectory() as directory:
        url = url or f"embedded://{directory}/bench.db"
        for line in _bench.measure(
            url,
            operations=args.operations,
            batches=args.batches,
            batch_size=args.batch_size,
            processes=args.processes,
            progress=not args.no_progress,
            encoding=args.encoding,
        ).lines():
            print(line)


def _torture(args: argparse.Namespace) -> int:
    from large_queue import _torture

    with tempfile.TemporaryDirectory() as directory:
        config = _torture.TortureConfig(
            url=args.url or os.environ.get("LARGE_QUEUE_URL") or f"embedded://{directory}/torture.db",
            producers=args.producers,
            consumers=args.consumers,
            duration=args.duration,
            lock_ttl=args.lock_ttl,
            capacity=args.capacity,
            fault_interval=args.fault_interval,
            pauses=not args.no_pauses,
            kills=not args.no_kills,
            seed=args.seed,
            appends=args.appends,
            hole_timeout=0.5 if args.hole_timeout is None else args.hole_timeout,
            groups=args.groups,
            txn_ids=args.txn_ids,
        )
        try:
            report = _torture.run(config, directory=args.histories)
        except KeyboardInterrupt:
            print(
                "large-queue: torture interrupted; its workers were stopped and its queue deleted",
                file=sys.stderr,
            )
            return 130
    return 0 if report.ok else 1


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive, finite number")
    return value


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows an option's default where it has one its text does not already tell."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is argparse.SUPPRESS or "default" in text:
            return text
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    formatter = _Defaults
    parser = argparse.ArgumentParser(
        prog="large-queue",
        description="Manage, inspect, demonstrate and benchmark large_queue queues.",
        formatter_class=formatter,
    )
    parser.add_argument("--url", help="store URL (default: LARGE_QUEUE_URL, else the embedded store)")
    parser.add_argument("--namespace", help="namespace of the queue's metadata record (default: the store's)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=text, description=text, formatter_class=formatter)

    create = command("create", "create a queue")
    create.add_argument("queue", help="queue name")
    create.add_argument(
        "--capacity",
        type=_positive_int,
        required=True,
        help="entries the queue holds (rounded up to whole buffer records: info shows the capacity made)",
    )
    create.add_argument(
        "--slots-per-record",
        type=_positive_int,
        help="entries per buffer record (default: the capacity, at most 100, and fewer in small records)",
    )
    create.add_argument("--buffer-namespace", help="namespace of the buffer records (default: --namespace)")
    create.add_argument(
        "--lock-ttl", type=_positive_float, default=2.0, help="seconds a silent lock holder keeps it"
    )
    create.add_argument(
        "--record-size-limit",
        type=_positive_int,
        help="bytes a buffer record may hold (default: the store's limit for the namespace)",
    )
    create.add_argument(
        "--encoding",
        choices=ENCODINGS,
        default=DEFAULT_ENCODING,
        help="how entries are stored: msgpack bytes (fastest), the store's native values, or JSON text",
    )
    create.add_argument(
        "--appends",
        choices=(RESERVED_APPENDS, LOCKED_APPENDS),
        default=DEFAULT_APPENDS,
        help="how producers append: reserving offsets (2 round trips, no lock) or under the queue lock (3)",
    )
    create.add_argument(
        "--hole-timeout",
        type=_positive_float,
        help="seconds readers wait on an unpublished reservation before closing it (--appends reserve;"
        " default 2)",
    )
    create.add_argument(
        "--max-age",
        type=_positive_float,
        help="seconds an entry is kept after its enqueue; older ones leave from the head (default: kept)",
    )
    command("list", "list the queues of the namespace")
    command("compact", "shrink an embedded store's file to what it holds (rewrites the whole file)")
    for name, text in [
        ("info", "show a queue's state"),
        ("stats", "show a queue's backlog and its consumers' lag, as stored (counters live in each process)"),
        ("dequeue", "remove and print the head entry"),
        ("expire", "drop the entries older than the queue's max-age from the head now"),
        ("purge", "drop every entry of a queue now (the queue stays)"),
    ]:
        command(name, text).add_argument("queue", help="queue name")
    delete = command("delete", "delete a queue and its records (exit status 1 if there is no such queue)")
    delete.add_argument("queue", help="queue name")
    delete.add_argument("--if-exists", action="store_true", help="no queue of that name is not an error")
    groups = command(
        "groups", "show a queue's consumer groups (cursors, lag, in flight, lost, dead-lettered)"
    )
    groups.add_argument("queue", help="queue name")
    groups.add_argument("--create", metavar="GROUP", help="create this group first (at the queue's head)")
    groups.add_argument(
        "--delete", metavar="GROUP", help="delete this group first (exit status 1 if there is no such group)"
    )
    groups.add_argument(
        "--seek",
        metavar="GROUP",
        help="move this group's cursor first (to --to): replay, or skip ahead (where the group was the"
        " slowest, the entries skipped leave the queue for good)",
    )
    groups.add_argument(
        "--to",
        metavar="WHERE",
        help="where --seek moves the cursor: an offset, 'head', 'tail', or an ISO 8601 time with its zone",
    )
    enqueue = command("enqueue", "append entries given as JSON, all or none")
    enqueue.add_argument("queue", help="queue name")
    enqueue.add_argument(
        "entries", nargs="+", help="one JSON value per entry; - alone: one per line of standard input"
    )
    enqueue.add_argument(
        "--overwrite-if-full", action="store_true", help="drop the oldest entries to make room"
    )
    check = command("check", "report what is wrong with a queue's records")
    check.add_argument("queue", help="queue name")
    check.add_argument("--repair", action="store_true", help="recreate missing buffer records (empty)")
    get = command("get", "read the entry at an offset (no lock)")
    get.add_argument("queue", help="queue name")
    get.add_argument("offset", type=int, help="the entry's offset")
    peek = command("peek", "print entries from the head (or an offset) on, without taking them (no lock)")
    peek.add_argument("queue", help="queue name")
    peek.add_argument(
        "--from", dest="start", type=int, metavar="OFFSET", help="first offset (default: the head)"
    )
    peek.add_argument("--count", type=_positive_int, default=10, help="most entries printed")
    command("demo", "a short tour on the configured store")
    torture = command("torture", "many processes, pauses and kills; then check the history")
    torture.add_argument("--producers", type=_positive_int, default=3, help="producer processes")
    torture.add_argument("--consumers", type=_positive_int, default=2, help="consumer processes")
    torture.add_argument(
        "--groups",
        type=int,
        choices=range(0, 10),
        default=0,
        metavar="N",
        help="consumers are nodes of N consumer groups that receive and ack (0: they dequeue)",
    )
    torture.add_argument("--duration", type=_positive_float, default=10.0, help="seconds of load")
    torture.add_argument("--lock-ttl", type=_positive_float, default=0.5, help="seconds")
    torture.add_argument("--capacity", type=_positive_int, default=300, help="entries the queue holds")
    torture.add_argument(
        "--fault-interval", type=_positive_float, default=1.0, help="mean seconds between faults"
    )
    torture.add_argument("--no-pauses", action="store_true", help="do not SIGSTOP workers")
    torture.add_argument(
        "--txn-ids",
        action="store_true",
        help="every call carries a txn id and is made again with it until it succeeds; calls of killed"
        " workers are made again after the run (nothing is left in doubt)",
    )
    torture.add_argument("--no-kills", action="store_true", help="do not SIGKILL workers")
    torture.add_argument(
        "--appends",
        choices=(RESERVED_APPENDS, LOCKED_APPENDS),
        default=DEFAULT_APPENDS,
        help="how producers append: under the lock, or by reserving offsets (then producers are also"
        " stopped between reserve and publish)",
    )
    torture.add_argument(
        "--hole-timeout", type=_positive_float, help="seconds (with --appends reserve; default 0.5)"
    )
    torture.add_argument("--seed", type=int, default=0, help="seed of the workload and the faults")
    torture.add_argument("--histories", help="keep the history files in this directory")
    bench = command("bench", "throughput, round trips and client CPU per operation, against floors")
    bench.add_argument(
        "--operations", type=_positive_int, default=3000, help="single operations of each kind"
    )
    bench.add_argument("--batches", type=_positive_int, default=300, help="batches of each kind")
    bench.add_argument("--batch-size", type=_positive_int, default=100, help="entries per batch")
    bench.add_argument("--processes", type=_positive_int, default=4, help="concurrent producer processes")
    bench.add_argument("--no-progress", action="store_true", help="no progress bars")
    bench.add_argument(
        "--encoding",
        choices=ENCODINGS,
        default=DEFAULT_ENCODING,
        help="how the bench's queues store entries",
    )
    bench.add_argument(
        "--spark", action="store_true", help="rows/s reading a queue into Spark, against Parquet"
    )
    bench.add_argument("--entries", type=_positive_int, default=1_000_000, help="queue size for --spark")
    return parser


def _seek_target(text: str | None) -> int | str | datetime.datetime:
    """``--to``: an offset, ``head``, ``tail`` or an ISO 8601 time (``InvalidArgumentError`` if none)."""
    if text is None:
        raise errors.InvalidArgumentError("--seek needs --to: an offset, 'head', 'tail' or an ISO 8601 time")
    if text in ("head", "tail"):
        return text
    digits = text.removeprefix("-")
    if digits.isascii() and digits.isdigit():  # an offset: digits only (int() takes "+1", " 2", "٣")
        return int(text)
    try:  # a trailing Z is UTC (Python before 3.11 reads only +00:00)
        return datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise errors.InvalidArgumentError(
            f"--to must be an offset, 'head', 'tail' or an ISO 8601 time, got {text!r}"
        ) from None


def _damaged(info: QueueInfo) -> int:
    """The exit status of ``info`` or ``stats``: 1, said on stderr, if part of the queue cannot be read."""
    if info.damaged is None:
        return 0
    print(f"large-queue: queue {info.name!r} is damaged: {info.damaged}", file=sys.stderr)
    return 1


def _stored_stats(queue: Queue, info: QueueInfo) -> dict[str, Any]:
    """The gauges a queue's records hold (``info`` read just now): its backlog, and where the cluster
    shim's consumers are."""
    from large_queue.cluster import ownership_info

    stats: dict[str, Any] = {
        "queue": queue.name,
        "size": info.size,
        "free": info.capacity - (info.reserved_tail - info.head_offset),  # reserved, unpublished: used
        "head_offset": info.head_offset,
        "tail_offset": info.tail_offset,
        "locked_by": info.lock_owner,
    }
    if info.lock_owner is not None:  # a holder silent past the TTL holds it no more: the next taker breaks it
        stats["lock_expired"] = queue.lock.expired()
    if info.damaged is not None:
        stats["damaged"] = info.damaged
    with contextlib.suppress(errors.QueueNotFoundError):  # no node shares it
        shared = ownership_info(queue)
        stats["consumers"] = {
            "owner": shared.owner,
            # read after info: the consumers may have gone past the tail it read since
            "not_delivered": max(0, info.tail_offset - max(shared.delivered_offset, info.head_offset)),
            "delivered_not_acked": shared.in_flight,
            "live_nodes": sum(node.alive for node in shared.nodes),
        }
    if info.groups:
        stats["groups"] = {
            group.name: {
                "owner": group.owner,
                "lag": group.lag,
                # below the head: lost, not owed; past the tail info read: delivered since
                "not_delivered": max(0, info.tail_offset - max(group.delivered_offset, info.head_offset)),
                "delivered_not_acked": group.in_flight,
                "lost": group.lost,
                "dead_lettered": group.dead_lettered,
                "live_nodes": sum(node.alive for node in group.nodes),
            }
            for group in info.groups
        }
    return stats


def _entry(entry: Entry | None) -> dict[str, Any] | None:
    return None if entry is None else dataclasses.asdict(entry)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    handler = _log_to_stderr()
    try:
        return _run(parser, args)
    finally:
        if handler is not None:  # a program that calls main() sets up logging its own way afterwards
            logging.getLogger("large_queue").removeHandler(handler)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """:func:`main` once its command line is read."""
    if getattr(args, "hole_timeout", None) is not None and args.appends == LOCKED_APPENDS:
        parser.error("--hole-timeout applies to --appends reserve only (locked appends leave no holes)")
    if args.command == "torture" and args.groups > args.consumers:
        parser.error(
            f"--groups {args.groups} needs at least {args.groups} consumers (consumer i is a node of group"
            f" i % {args.groups}): a group with no consumer acks nothing, so the queue stops taking"
            " entries once full and the run tests nothing past it"
        )
    try:
        if args.command == "demo":
            _demo(args.url)
        elif args.command == "bench":
            _bench(args)
        elif args.command == "torture":
            return _torture(args)
        elif args.command == "create":
            from large_queue._lifecycle import check_options

            shape = {
                "capacity": args.capacity,
                "slots_per_record": args.slots_per_record,
                "lock_ttl": args.lock_ttl,
                "record_size_limit": args.record_size_limit,
                "appends": args.appends,
                "hole_timeout": 2.0 if args.hole_timeout is None else args.hole_timeout,
            }
            check_options(args.queue, **shape)  # before the store is opened (and its file made)
            created = Queue.create(
                connect(args.url),
                args.queue,
                namespace=args.namespace,
                buffer_namespace=args.buffer_namespace,
                encoding=args.encoding,
                max_age=args.max_age,
                **shape,
            )
            _print(created.info())
        elif args.command == "compact":
            from large_queue.backends.embedded import EmbeddedBackend

            store = None if _names_aerospike(args.url) else connect(args.url, create=False)
            if not isinstance(store, EmbeddedBackend):
                raise errors.InvalidArgumentError(
                    "compact is for embedded stores: Aerospike reclaims space itself"
                )
            before = store.path.stat().st_size
            store.compact()
            _print(
                {"file": str(store.path), "bytes_before": before, "bytes_after": store.path.stat().st_size}
            )
        elif args.command == "list":
            for name in Queue.names(connect(args.url, create=False), namespace=args.namespace):
                print(name)
        elif args.command == "check":
            from large_queue._check import check_queue

            report = check_queue(
                connect(args.url, create=False), args.queue, namespace=args.namespace, repair=args.repair
            )
            print("\n".join(report.lines()))
            return 0 if report.ok else 1
        elif args.command == "delete":
            deleted = Queue.delete(connect(args.url, create=False), args.queue, namespace=args.namespace)
            _print({"deleted": deleted})
            if not deleted and not args.if_exists:
                raise errors.QueueNotFoundError(f"there is no queue {args.queue!r}", queue=args.queue)
        else:
            queue = Queue.open(connect(args.url, create=False), args.queue, namespace=args.namespace)
            if args.command == "info":
                from large_queue.cluster import ownership_info

                info = queue.info()
                described = dataclasses.asdict(info)  # one JSON document, whatever it holds
                if info.lock_owner is not None:
                    described["lock_expired"] = queue.lock.expired()
                with contextlib.suppress(errors.QueueNotFoundError):  # no node shares it
                    described["ownership"] = dataclasses.asdict(ownership_info(queue))
                _print(described)
                return _damaged(info)
            elif args.command == "groups":
                if args.to is not None and args.seek is None:
                    raise errors.InvalidArgumentError("--to says where --seek moves a group: give --seek too")
                target = _seek_target(args.to) if args.seek is not None else None
                from large_queue.cluster._groups import check_group, check_new_group, check_seek

                if args.create is not None:  # every argument refused before anything changes
                    check_new_group(args.create)
                listed = queue.current_metadata().groups
                if args.delete is not None:
                    check_group(args.delete)
                    if args.delete != args.create and args.delete not in listed:
                        raise errors.GroupNotFoundError(
                            f"queue {queue.name!r} has no consumer group {args.delete!r}", queue=queue.name
                        )
                if args.seek is not None:
                    check_seek(queue, args.seek, target)
                    if args.seek == args.delete:
                        raise errors.InvalidArgumentError(
                            f"--seek {args.seek!r} moves a group that --delete deletes: give one of them"
                        )
                    if args.seek != args.create and args.seek not in listed:
                        raise errors.GroupNotFoundError(
                            f"queue {queue.name!r} has no consumer group {args.seek!r}", queue=queue.name
                        )
                if args.create is not None:
                    _print({"created": queue.create_group(args.create)})
                if args.delete is not None:
                    _print({"deleted": queue.delete_group(args.delete)})
                if args.seek is not None:
                    assert target is not None
                    _print({"group": args.seek, "cursor": queue.seek_group(args.seek, target)})
                for group in queue.groups():
                    _print(group)
            elif args.command == "stats":
                info = queue.info()
                _print(_stored_stats(queue, info))
                return _damaged(info)
            elif args.command == "dequeue":
                _print(_entry(_dequeue(queue)))
            elif args.command in ("expire", "purge"):
                dropped = queue.expire() if args.command == "expire" else queue.purge()
                _print({"dropped": len(dropped), "offsets": [dropped.start, dropped.stop] if dropped else []})
            elif args.command == "get":
                _print(_entry(queue.get(args.offset)))
            elif args.command == "peek":
                for entry in queue.peek(args.count, start=args.start):
                    _print(_entry(entry))
            elif args.command == "enqueue":
                _print({"offsets": _enqueue(queue, args.entries, overwrite_if_full=args.overwrite_if_full)})
    except errors.LargeQueueError as exc:
        if args.debug:
            raise
        print(f"large-queue: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("large-queue: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of the output left (| head): nothing more to say
        # Python would complain again when it flushes stdout at exit: point it at nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


def _log_to_stderr() -> logging.Handler | None:
    """The library's warnings (entries dropped, a lock broken) on stderr as the command's own lines,
    where the program that called :func:`main` has not set up logging itself; the handler added."""
    log = logging.getLogger("large_queue")
    if log.handlers or logging.getLogger().handlers:
        return None
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("large-queue: %(message)s"))
    log.addHandler(handler)
    return handler


def _dequeue(queue: Queue) -> Entry | None:
    """One dequeue. Where an unpublished reservation stands at the head (a producer that died, or
    is slow), waits up to the queue's hole timeout: a reader closes such a hole only once it has
    seen it open that long, and each run of the command is a new reader."""
    entry = queue.dequeue()
    if entry is not None or not queue.reserved:
        return entry
    info = queue.info()
    if info.reserved_tail == info.tail_offset or info.head_offset != info.tail_offset:
        return entry  # nothing unpublished at the head
    print(
        f"large-queue: offset {info.tail_offset} is reserved and not yet published; waiting up to"
        f" {queue.hole_timeout:g} s (the hole timeout) before it is closed",
        file=sys.stderr,
    )
    return queue.dequeue(timeout=queue.hole_timeout * 1.5 + 0.1)


if __name__ == "__main__":
    sys.exit(main())
