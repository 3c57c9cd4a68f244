"""Floors for the benchmark: an operation's own store commands, with no library code around them.

A bench phase runs on three twin queues that start alike and receive the
same operations: once timed through the library, once recorded (untimed),
and once as the recorded commands replayed against the third twin, every
command prepared ahead (:meth:`Backend.prepare`: keys, operations,
compiled conditions and policies all built before the clock starts).
Replaying the same commands from the same state gives the same outcomes
(the lock is free at each acquire, fencing tokens follow the same sequence),
so the timed replay is the least the operation can cost: its round trips
and the store's client, nothing else. Commands the operation sent as a group
(:meth:`Backend.grouped`) are replayed as one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from large_queue import errors
from large_queue.backends import Backend, RecordKey
from large_queue.backends._delegating import Delegating
from large_queue.backends.conditions import Bound
from large_queue.queue import Queue


@dataclass(frozen=True)
class Command:
    """One interface call as it was made."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    refused: bool = False  # it raised (a create-only put of an existing record, say)


#: the markers of a group's start and end in a recording (not commands)
GROUP_START, GROUP_END = "group start", "group end"


class Recording(Delegating):
    """Passes every command through to ``inner`` and appends it to ``log``."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.log: list[Command] = []

    def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run the command on the inner store and keep it, with whether it was refused."""
        try:
            result = super().relay(method, *args, **kwargs)
        except errors.LargeQueueError:
            self.log.append(Command(method, args, kwargs, refused=True))
            raise
        self.log.append(Command(method, args, kwargs))
        return result

    @contextlib.contextmanager
    def grouped(self) -> Iterator[None]:
        """The inner store's group, marked in the log."""
        self.log.append(Command(GROUP_START, (), {}))
        try:
            with self.inner.grouped():
                yield
        finally:
            self.log.append(Command(GROUP_END, (), {}))

    def waiting_at_most(self, seconds: float | None) -> contextlib.AbstractContextManager[None]:
        """The inner store's bound on waits (not logged: it sends nothing)."""
        return self.inner.waiting_at_most(seconds)

    def close(self) -> None:
        """Nothing to close: the inner store belongs to the caller."""


def _renamed(value: Any, source: Queue, target: Queue) -> Any:
    """``value`` moved from queue ``source`` to its twin ``target``.

    Keys (alone, in a list, or in (key, reads) pairs) get the twin's name,
    and guards the twin's incarnation.
    """
    if isinstance(value, RecordKey) and value.set_name == source.name:
        return replace(value, set_name=target.name)
    if isinstance(value, list) and value and isinstance(value[0], (RecordKey, tuple)):
        return [_renamed(item, source, target) for item in value]
    if isinstance(value, tuple) and value and isinstance(value[0], RecordKey):
        return tuple(_renamed(item, source, target) for item in value)  # (key, reads[, condition])
    if (
        isinstance(value, Bound)
        and target.incarnation
        and value.values.get("incarnation") == source.incarnation
    ):
        return Bound(value.template, {**value.values, "incarnation": target.incarnation})
    return value


def prepare(commands: Sequence[Command], backend: Backend, *, source: Queue, target: Queue) -> list[Replay]:
    """``commands`` recorded on queue ``source``, prepared to run on its twin ``target``."""
    replays: list[Replay] = []
    groups: list[_Group] = []
    for command in commands:
        if command.method == GROUP_START:
            groups.append(_Group(backend))
            replays.append(Replay(command, groups[-1].start))
        elif command.method == GROUP_END:
            replays.append(Replay(command, groups.pop().end))
        else:
            call = backend.prepare(
                command.method,
                *(_renamed(arg, source, target) for arg in command.args),
                **{name: _renamed(arg, source, target) for name, arg in command.kwargs.items()},
            )
            replays.append(Replay(command, call))
    return replays


class _Group:
    """A recorded group, replayed on ``backend``: entered at its start marker, left at its end."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._open: contextlib.AbstractContextManager[None] | None = None

    def start(self) -> None:
        self._open = self.backend.grouped()
        self._open.__enter__()

    def end(self) -> None:
        assert self._open is not None
        self._open.__exit__(None, None, None)
        self._open = None


@dataclass(frozen=True)
class Replay:
    """A recorded command and its prepared call on the twin queue."""

    command: Command
    call: Callable[[], object]


def command_count(replays: Sequence[Replay]) -> int:
    """The store commands among ``replays`` (a group's markers are none)."""
    return sum(1 for replay in replays if replay.command.method not in (GROUP_START, GROUP_END))


def run(replays: Sequence[Replay]) -> None:
    """Send the prepared commands in order; an outcome other than the recorded one is an error."""
    for replay in replays:
        try:
            replay.call()
        except Exception as exc:
            if replay.command.refused:
                continue
            raise errors.LargeQueueError(
                f"the floor's replay of {replay.command.method} on {replay.command.args[0]!r} failed"
                f" ({type(exc).__name__}: {exc}): the twin queue no longer matches the recorded one"
            ) from exc
        if replay.command.refused:
            raise errors.LargeQueueError(
                f"the floor's replay of {replay.command.method} on {replay.command.args[0]!r} was applied"
                " where the recorded command was refused: the twin queue no longer matches the recorded one"
            )
