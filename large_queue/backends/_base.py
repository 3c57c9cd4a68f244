"""The record-level interface that every store implements.

The queue algorithm is written once against this interface. Each method is
exactly one single-record command (one network round trip on Aerospike); a
batch get is one command for many records. ``Backend.commands`` counts them,
which is how the benchmark reports round trips per queue operation.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from large_queue import errors
from large_queue._entries import INT64_MAX, INT64_MIN, unstorable
from large_queue.backends.conditions import Condition

MAX_BIN_NAME_BYTES = 15


def check_bin_names(names: Iterable[Any]) -> None:
    """``BinNameError`` for the first name that is not a str of 1 to 15 bytes (UTF-8): both stores' rule."""
    for name in names:
        if type(name) is not str or not name or len(name.encode()) > MAX_BIN_NAME_BYTES:
            raise errors.BinNameError(
                f"bin name {name!r} must be a str of 1 to {MAX_BIN_NAME_BYTES} bytes", code=21, in_doubt=False
            )


def check_bin_values(key: RecordKey, bins: dict[str, Any]) -> None:
    """``BackendUsageError`` for the first value of ``bins`` that a store would change or refuse.

    The same rule on both stores, before anything is sent: Aerospike's
    client refuses some such values and keeps others changed (a map with a
    float key comes back empty, a str is cut at a NUL), while msgpack would
    keep a tuple as a list. None is not a value: it deletes the bin. An
    operation's values are the caller's to check (the queue checks its
    entries before it writes them: checking them again at every command
    would cost every enqueue); one that no bin can hold at all is a
    ``BackendUsageError`` from either store. There the stores differ: in an
    operation, Aerospike refuses a tuple, a set or an int past 64 bits, which
    the embedded store keeps (as a list, as an unsigned int).
    """
    for name, value in bins.items():
        if value is not None and (problem := unstorable(value)) is not None:
            raise errors.BackendUsageError(
                f"bin {name!r} of record {key.set_name}/{key.user_key}{problem}", code=-2, in_doubt=False
            )


#: the longest time to live a record may be given, in seconds: ten years, as Aerospike's default ``max-ttl``
MAX_TTL = 10 * 365 * 86400


def check_ttl(ttl: object) -> int | None:
    """``ttl`` if it is None (never expires) or whole seconds from 1 to :data:`MAX_TTL`.

    Anything else is ``BackendUsageError``.

    Aerospike reads 0, -1 and -2 as "the namespace's default", "never" and
    "keep the current one"; no store is asked to guess which one was meant.
    """
    if ttl is None or (type(ttl) is int and 1 <= ttl <= MAX_TTL):
        return ttl
    raise errors.BackendUsageError(
        f"ttl must be None (never expires) or whole seconds from 1 to {MAX_TTL}, got {ttl!r}", code=-2
    )


#: what Python raises for an operation or condition built of the wrong parts (a str to increment by,
#: a template missing a value, something that is no operation): the caller's mistake, raised as
#: ``BackendUsageError`` by :func:`misuse`
MISUSE = (TypeError, ValueError, KeyError, AttributeError, IndexError)


def misuse(key: RecordKey, exc: Exception) -> errors.BackendUsageError:
    """The library's error for a command the store cannot even build (see :data:`MISUSE`)."""
    return errors.BackendUsageError(
        f"a command on record {key.set_name}/{key.user_key} is malformed: {type(exc).__name__}: {exc}",
        code=-2,
        in_doubt=False,
    )


@dataclass(frozen=True)
class RecordKey:
    """Where a record lives: namespace, set and the record's own key (all str)."""

    namespace: str
    set_name: str
    user_key: str

    def __post_init__(self) -> None:
        if not (type(self.namespace) is str and type(self.set_name) is str and type(self.user_key) is str):
            raise errors.BackendUsageError(
                f"a record key's namespace, set and key are str, got {self.namespace!r}, {self.set_name!r},"
                f" {self.user_key!r}",
                code=-2,
            )


@dataclass(frozen=True)
class Record:
    """A record as read: its bins and its generation (write count)."""

    bins: dict[str, Any]
    generation: int


class WriteMode(enum.Enum):
    """What ``put`` requires of the record's prior existence."""

    UPSERT = "upsert"
    CREATE_ONLY = "create_only"
    UPDATE_ONLY = "update_only"
    REPLACE = "replace"


# --- bin operations for ``operate`` -----------------------------------------


@dataclass(frozen=True)
class Read:
    """Return the bin's value (absent from the result if the bin is missing)."""

    bin: str


@dataclass(frozen=True)
class Write:
    """Set the bin to ``value`` (never None: the store deletes a bin written with None)."""

    bin: str
    value: Any


def _count_at_least(name: str, value: object, least: int) -> None:
    """``BackendUsageError`` unless ``value`` is an int (not a bool) of at least ``least``.

    Checked where the operation is made, so a malformed one never reaches
    a store: Aerospike reads a negative list index from the list's end,
    where the embedded store would refuse it.
    """
    if type(value) is not int or value < least:
        raise errors.BackendUsageError(f"{name} must be an int of at least {least}, got {value!r}", code=-2)


@dataclass(frozen=True)
class Increment:
    """Add ``by`` (a 64-bit int) to an integer bin (a missing bin counts as 0).

    The sum wraps around at 64 bits, as Aerospike adds: 2**63 - 1 plus 1
    is -2**63, on every store.
    """

    bin: str
    by: int

    def __post_init__(self) -> None:
        if type(self.by) is not int or not INT64_MIN <= self.by <= INT64_MAX:
            raise errors.BackendUsageError(f"an increment is a 64-bit int, got {self.by!r}", code=-2)


@dataclass(frozen=True)
class ListSet:
    """Set element ``index`` of a list bin; an ``index`` equal to the list's length appends.

    An ``index`` past that is ``BinTypeError``, nothing written, on every store.
    """

    bin: str
    index: int
    value: Any

    def __post_init__(self) -> None:
        _count_at_least("a list index", self.index, 0)


@dataclass(frozen=True)
class ListSetRange:
    """Set ``len(values)`` consecutive elements of a list bin, from ``index`` (a list slice's assignment).

    The list grows where the range runs past its end; an ``index`` past the
    end is ``BinTypeError``, nothing written, on every store.
    """

    bin: str
    index: int
    values: list[Any]

    def __post_init__(self) -> None:
        _count_at_least("a list index", self.index, 0)
        if type(self.values) is not list:
            raise errors.BackendUsageError(f"a range's values are a list, got {self.values!r}", code=-2)


@dataclass(frozen=True)
class ListGetRange:
    """Return ``count`` elements of a list bin from ``index`` (fewer where the list ends first)."""

    bin: str
    index: int
    count: int

    def __post_init__(self) -> None:
        _count_at_least("a list index", self.index, 0)
        _count_at_least("a count of list elements", self.count, 0)


@dataclass(frozen=True)
class ReadSinceUpdate:
    """Return, under the name ``bin``, milliseconds since the record was last written (store's clock)."""

    bin: str


@dataclass(frozen=True)
class Compute:
    """Set the bin to the value of ``expression`` (a :mod:`conditions` operand), computed by the store.

    ``values`` binds the expression's :class:`~conditions.Param` operands;
    operations before it in the same command are already applied. The
    expression is a template: build it once, as conditions are.
    """

    bin: str
    expression: Any
    values: dict[str, int | str] | None = None


@dataclass(frozen=True)
class Evaluate:
    """Return, under the name ``bin``, the value of ``expression`` (a :mod:`conditions` operand) now.

    Unlike :class:`Read`, its result is never replaced by a later write to
    the same bin in the command (Aerospike answers every operation of a
    command that computes expressions, and a write answers None).
    """

    bin: str
    expression: Any
    values: dict[str, int | str] | None = None


@dataclass(frozen=True)
class MapGet:
    """Return, under the bin's name, the value of ``key`` in a map bin (absent if the key or bin is)."""

    bin: str
    key: str


@dataclass(frozen=True)
class LogPut:
    """Put ``key: [item...]`` into a map bin kept as a bounded log, computed by the store.

    The items are :mod:`conditions` operands (the first is the entry's time
    on the store's clock, ``NowMs()``); entries are ranked by their items.
    Before the put, entries whose first item is below ``now - max_age_ms``
    are removed, then all but the ``keep - 1`` highest-ranked (the newest),
    so the log never holds more than ``keep``. A missing bin is an empty log.
    ``values`` binds the :class:`~conditions.Param` operands (the key may be one);
    the operation is a template, built once like a condition.
    """

    bin: str
    key: Any
    items: tuple[Any, ...]
    keep: int
    max_age_ms: int
    values: dict[str, int | str] | None = None

    def __post_init__(self) -> None:
        if type(self.keep) is not int or self.keep < 2:
            raise errors.BackendUsageError(f"a log keeps at least 2 entries, not {self.keep!r}", code=-2)


Operation = (
    Read
    | Write
    | Increment
    | ListSet
    | ListSetRange
    | ListGetRange
    | ReadSinceUpdate
    | Compute
    | Evaluate
    | MapGet
    | LogPut
)
READ_OPERATIONS = (Read, ListGetRange, ReadSinceUpdate, Evaluate, MapGet)
OPERATIONS = (
    *READ_OPERATIONS,
    Write,
    Increment,
    ListSet,
    ListSetRange,
    Compute,
    LogPut,
)


#: writes whose result Aerospike returns under their bin's name in a read's place (a list's new
#: size, an expression write's nil): a command that reads a bin and then writes it so is refused
OVERWRITING_READS = (ListSetRange, Compute, LogPut)


def check_not_read_before(operations: Sequence[Any], index: int) -> None:
    """``TypeError`` (a malformed command) if an operation before ``operations[index]`` reads its bin.

    For the writes of :data:`OVERWRITING_READS`: Aerospike would give back
    the write's result instead of what the read saw, so neither store takes it.
    """
    name = operations[index].bin
    for op in operations[:index]:
        if type(op) in READ_OPERATIONS and op.bin == name:
            raise TypeError(
                f"bin {name!r} is read and then written by {type(operations[index]).__name__} in one command:"
                " the read's result would be lost on Aerospike; read it in another command"
            )


def check_overwriting_reads(operations: Sequence[Any]) -> None:
    """:func:`check_not_read_before` for every write of :data:`OVERWRITING_READS` in ``operations``."""
    for index, op in enumerate(operations):
        if index and type(op) in OVERWRITING_READS:
            check_not_read_before(operations, index)


def check_reads(reads: Sequence[tuple[RecordKey, Sequence[Any] | None]]) -> None:
    """``BackendUsageError`` unless each of a batch read's commands is read operations (or None: all bins)."""
    for key, operations in reads:
        if operations is not None and not all(isinstance(op, READ_OPERATIONS) for op in operations):
            raise misuse(key, TypeError(f"a read takes read operations only, got {list(operations)!r}"))
        if operations is not None:
            check_bin_names(op.bin for op in operations)


def check_commands(commands: Iterable[tuple[RecordKey, Sequence[Any]]]) -> None:
    """``BackendUsageError`` naming the record if a command holds something that is no operation,
    or a bin name no store takes: checked before any command is sent."""
    for key, operations in commands:
        if not operations:  # Aerospike takes no command without an operation
            raise misuse(key, ValueError("a command needs at least one operation"))
        for op in operations:
            if not isinstance(op, OPERATIONS):
                raise misuse(key, TypeError(f"not an operation: {op!r}"))
        check_bin_names(op.bin for op in operations)


#: a read sent beside another command (``Backend.operate_and_read``): its key, read operations, condition
ReadBeside = tuple[RecordKey, Sequence[Operation], Condition | None]
#: one record's part of ``Backend.operate_each``: its key, operations and condition
RecordCommand = tuple[RecordKey, Sequence[Operation], Condition | None]


class Backend(ABC):
    """A store with Aerospike's record semantics.

    ``operate`` applies its operations in order, atomically, on one record; a
    read sees the writes before it in the same call. Callers put at most one
    read per bin, after the writes to that bin, so the result maps each bin to
    one value.
    """

    #: the namespace used when a queue is opened without one
    default_namespace: str = "test"
    #: True where :meth:`operate_and_read` is one round trip (a server's batch command), not two commands
    reads_beside: bool = False
    #: True where :meth:`operate_each` is one round trip for all its records, not a command each
    operates_together: bool = False

    def __init__(self) -> None:
        self._commands = 0
        self._count_lock = threading.Lock()

    @property
    def commands(self) -> int:
        """Single-record commands (and batch gets) issued so far: round trips."""
        return self._commands

    def _count(self) -> None:
        with self._count_lock:
            self._commands += 1

    @abstractmethod
    def get(self, key: RecordKey, bins: Sequence[str] | None = None) -> Record | None:
        """Read a record (only ``bins`` where given: the others are absent), or None if it does not exist."""

    @abstractmethod
    def put(
        self,
        key: RecordKey,
        bins: dict[str, Any],
        *,
        mode: WriteMode = WriteMode.UPSERT,
        generation: int | None = None,
        ttl: int | None = None,
    ) -> None:
        """Write bins; ``mode`` and ``generation`` guard the write.

        ``ttl`` is the record's time to live in seconds; None means it never
        expires (queue records never do).
        """

    @abstractmethod
    def operate(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        *,
        condition: Condition | None = None,
        generation: int | None = None,
    ) -> dict[str, Any]:
        """Apply operations atomically to an existing record; return the reads.

        Raises ``RecordNotFoundError`` if the record is missing,
        ``ConditionNotMetError`` if ``condition`` is not true and
        ``GenerationMismatchError`` if ``generation`` does not match; in each
        case nothing was applied.
        """

    @abstractmethod
    def remove(self, key: RecordKey) -> bool:
        """Delete a record; False if it did not exist."""

    @abstractmethod
    def batch_get(self, keys: Sequence[RecordKey]) -> list[Record | None]:
        """Read many records in one command; None where a record is missing."""

    @abstractmethod
    def batch_read(
        self, reads: Sequence[tuple[RecordKey, Sequence[Operation] | None]]
    ) -> list[dict[str, Any] | None]:
        """Read from many records in one command: each record's read operations, or all its bins (None).

        Returns what each record's reads saw (as ``operate`` does), None where a record is missing.
        """

    def operate_and_read(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        read: ReadBeside,
        *,
        condition: Condition | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``operate`` on ``key``, and a read of another record, in one round trip where the store can.

        The first command's outcome, result and errors are ``operate``'s.
        ``read`` (a key, read operations and a condition) is a guess its
        caller checks before using what it saw: it is not ordered with the
        first command (it may see the other record as it was before it or
        after it), and whatever stops it (a missing record, a condition not
        met, a timeout, a damaged record) gives None, never an error. A
        malformed command, either of the two, is ``BackendUsageError`` and
        writes nothing. Where :attr:`reads_beside` is False the two go one
        after the other, as two commands.
        """
        read_key, read_operations, read_condition = read
        check_commands([(key, operations), (read_key, read_operations)])
        check_reads([(read_key, read_operations)])
        result = self.operate(key, operations, condition=condition)
        try:
            other: dict[str, Any] | None = self.operate(read_key, read_operations, condition=read_condition)
        except errors.BackendUsageError:
            raise  # a malformed read is the caller's mistake, not the record's outcome
        except errors.LargeQueueError:
            other = None
        return result, other

    def operate_each(self, commands: Sequence[RecordCommand]) -> list[dict[str, Any] | errors.BackendError]:
        """``operate`` on several records, in one round trip where the store can (:attr:`operates_together`).

        Each record's command is atomic on its record and has its own
        outcome, in the order given: what its reads saw, or the error
        ``operate`` would have raised for it (a condition not met, a missing
        record, a timeout in doubt). The commands are not ordered with each
        other: a store may apply them in any order, and some of them only.
        Where :attr:`operates_together` is False they go one after the other.
        A command the store cannot take at all (something that is no
        operation, a bad bin name, a template missing a value, a value no bin
        can hold) is the caller's mistake, not a record's outcome: it is
        raised (``BackendUsageError``, ``BinNameError``) and no command of
        the batch is applied.
        """
        check_commands((key, operations) for key, operations, _ in commands)
        outcomes: list[dict[str, Any] | errors.BackendError] = []
        for key, operations, condition in commands:
            try:
                outcomes.append(self.operate(key, operations, condition=condition))
            except (errors.BinNameError, errors.BackendUsageError):
                raise
            except errors.BackendError as exc:
                outcomes.append(exc)
        return outcomes

    @abstractmethod
    def sets_holding(self, namespace: str, user_key: str) -> list[str]:
        """The sets of ``namespace`` that hold a record with key ``user_key``, sorted.

        A scan of the namespace: for administration, not for operations.
        """

    @abstractmethod
    def max_record_bytes(self, namespace: str) -> int:
        """The largest record the store keeps in ``namespace``, in bytes."""

    def operation(
        self, key: RecordKey, operations: Sequence[Operation], *, condition: Condition | None = None
    ) -> Callable[[], dict[str, Any]]:
        """``operate`` with these arguments, prepared once to be sent many times.

        Each call is one command, counted, with the same result and errors as
        ``operate``; a store may build its arguments once (keys, operations,
        compiled condition, policy) instead of at every call.
        """
        return functools.partial(self.operate, key, operations, condition=condition)

    def waiting_at_most(self, seconds: float | None) -> contextlib.AbstractContextManager[None]:
        """Commands this thread sends inside wait ``seconds`` at most for other processes' commands.

        Where a store makes commands wait on each other (the embedded
        store's writer lock), a caller's deadline bounds that wait
        (``BackendBusyError`` past it); elsewhere it changes nothing.
        """
        return contextlib.nullcontext()

    def grouped(self) -> contextlib.AbstractContextManager[None]:
        """Commands sent inside this context, in one transaction where the store has them.

        Each command is still one command, with its own outcome, in order;
        the embedded store runs them all in one SQLite transaction, so other
        processes see all of them or none (see
        :mod:`large_queue.backends._transactions`), and Aerospike sends them as
        ever. Nothing inside may wait for another process (a busy lock's
        back-off): on the embedded store that process may wait for the group.
        """
        return contextlib.nullcontext()

    def prepare(self, method: str, *args: Any, **kwargs: Any) -> Callable[[], object]:
        """One command with every argument prepared ahead, as the store itself takes it.

        Calling the result sends the command and returns the store's raw
        answer, with none of this interface's work around it: the benchmark's
        floor. A store that is a library of its own (the embedded one) has no
        lower layer, so its prepared command is the interface call itself.
        """
        return functools.partial(getattr(self, method), *args, **kwargs)

    @abstractmethod
    def close(self) -> None:
        """Release connections and files."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
