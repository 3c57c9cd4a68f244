"""The embedded store: Aerospike's record semantics in one SQLite file.

It needs no server and is the default store. Several processes may use one
file at once (Spark workers, multi-process consumers): every command is one
SQLite transaction, and commands that write take the database's write lock
first (``BEGIN IMMEDIATE``), so a read-check-write on one record is atomic
across processes exactly as an Aerospike ``operate`` is on its record.

Like Aerospike it keeps a generation per record, evaluates the same
conditions, enforces 15-byte bin names and a record size limit (1 MiB by
default, at most 8 MiB), honours TTLs and judges "time since last update" on
its own clock, which tests may replace to make locks expire without sleeping.

Values are stored as msgpack (encoded and decoded by msgspec, the fastest
codec for it in Python), which keeps every Aerospike-native type apart (int,
float, str, bytes, bool, None, list, dict). Maps come back as Aerospike gives
them back: keys in order, integers before strings before bytes, each sorted.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # not POSIX: SQLite's busy handler alone serialises writers
    fcntl = None  # type: ignore[assignment]

from large_queue import errors
from large_queue._frozen import frozen
from large_queue._msgpack import pack
from large_queue.backends._base import (
    MISUSE,
    READ_OPERATIONS,
    Backend,
    Operation,
    ReadBeside,
    Record,
    RecordCommand,
    RecordKey,
    WriteMode,
    check_bin_names,
    check_bin_values,
    check_overwriting_reads,
    check_reads,
    check_ttl,
    misuse,
)
from large_queue.backends._embedded_bins import apply, fail
from large_queue.backends._embedded_decode import RecordDecoder
from large_queue.backends._embedded_decode import unpack_record as _unpack
from large_queue.backends._embedded_file import file_id, let_go, open_connection
from large_queue.backends._transactions import Group, StaleSnapshot, Transaction, open_group, store_file_error
from large_queue.backends.conditions import Clock, Condition, evaluate

DEFAULT_RECORD_SIZE_LIMIT = 1024 * 1024
MAX_RECORD_SIZE_LIMIT = 8 * 1024 * 1024
DEFAULT_BUSY_TIMEOUT_MS = 30_000
#: a write waits for the file at most a day (SQLite keeps the wait in milliseconds, in an int)
MAX_BUSY_TIMEOUT = 86400.0
MAX_SET_NAME_BYTES = 63

# keys one SELECT of a batch get asks for (well under SQLite's limit of bound variables)
_KEYS_PER_SELECT = 500
# records remembered as refusing this process's guarded writes (forgotten all at once past this)
_MOST_REFUSED = 1024
# bin names remembered as valid (past this, names are checked at every command)
_MOST_GOOD_BINS = 256


#: every embedded store open in this process, for the child of a fork (see _after_fork)
_OPEN: weakref.WeakSet[EmbeddedBackend] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: each store's thread lock anew, and no group open.

    Only the forking thread lives on in the child. Had another thread of the
    parent been inside a command at the fork, the child's copy of the lock
    would stay held for ever, and the child's first command would wait on
    it for good. The child's connection is opened anew at its first command
    (:meth:`EmbeddedBackend._connection`).
    """
    for backend in list(_OPEN):
        backend._lock = threading.RLock()
        backend._group_ref = backend._txn_ref = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


#: seconds between the looks of a process that only reads at whether its file is still at the path
_LOOK_AT_THE_FILE_EVERY = 1.0
#: Aerospike keeps a record's generation in 16 bits, and goes from the last to 1 (0 is "no record")
_LAST_GENERATION = 0xFFFF


def _after(generation: int) -> int:
    """The generation a write gives a record at ``generation``: as Aerospike, 65535 is followed by 1."""
    return generation + 1 if generation < _LAST_GENERATION else 1


class EmbeddedBackend(Backend):
    """A durable single-file store with Aerospike's record semantics.

    ``clock`` returns the store's time in nanoseconds (default: the wall
    clock, shared by every process on the machine). ``synchronous`` is
    SQLite's durability setting: ``"normal"`` (default) survives a crash of
    any process; ``"full"`` also survives power loss, at a cost in speed.
    ``busy_timeout`` (seconds, 0 to fail at once) is how long a write waits
    for the file while another process writes before it fails with
    ``BackendBusyError``.
    ``create=False`` refuses to make a file (or its directory) that is not there.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        namespaces: Iterable[str] = ("test",),
        record_size_limit: int = DEFAULT_RECORD_SIZE_LIMIT,
        clock: Callable[[], int] = time.time_ns,
        synchronous: str = "normal",
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT_MS / 1000,
        create: bool = True,
    ) -> None:
        super().__init__()
        if (
            not isinstance(busy_timeout, (int, float))
            or isinstance(busy_timeout, bool)
            or not 0 <= busy_timeout <= MAX_BUSY_TIMEOUT
        ):
            raise errors.InvalidArgumentError(
                f"busy_timeout must be a number of seconds from 0 to {MAX_BUSY_TIMEOUT:g},"
                f" got {busy_timeout!r}"
            )
        if not 1024 <= record_size_limit <= MAX_RECORD_SIZE_LIMIT:
            raise errors.InvalidArgumentError(
                f"record_size_limit must be between 1024 and {MAX_RECORD_SIZE_LIMIT} bytes,"
                f" got {record_size_limit}"
            )
        if synchronous not in ("normal", "full"):
            raise errors.InvalidArgumentError(f"synchronous must be 'normal' or 'full', got {synchronous!r}")
        self.path = Path(path)
        self.namespaces = frozenset(namespaces)
        if not self.namespaces:
            raise errors.InvalidArgumentError("the embedded store needs at least one namespace")
        self.default_namespace = sorted(self.namespaces)[0] if "test" not in self.namespaces else "test"
        self.record_size_limit = record_size_limit
        self.clock = clock
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._lock = threading.RLock()  # made anew in a forked child (see _after_fork)
        self._waits = threading.local()  # a thread's deadline for the writer lock (see waiting_at_most)
        self._conn: sqlite3.Connection | None = None
        self._writer_file: IO[bytes] | None = None
        self._pid = -1
        self._file_id: tuple[int, int] | None = None  # device and inode of the file the connection opened
        self._look_again_at = 0.0  # when a command looks again at whether the file is still at the path
        self._refused: set[RecordKey] = set()  # records whose last guarded write from here was refused
        self._decoder = RecordDecoder()
        self._good_bins: set[str] = set()  # bin names already found valid (a queue uses a dozen)
        #: the group of commands open, seen only by the thread holding _lock (see _transactions.open_group)
        self._group_ref: weakref.ref[Group] | None = None
        #: the command open outside a group (so that one left without its end is seen)
        self._txn_ref: weakref.ref[Transaction] | None = None
        self._create = create
        if not create and not self.path.is_file():
            raise errors.StoreFileError(f"there is no store file at {self.path}", code=-1)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise errors.StoreFileError(f"store file {self.path} cannot be created: {exc}", code=-1) from None
        with self._transaction(write=False):
            pass  # opens the file now, so that a bad path fails here
        _OPEN.add(self)

    @property
    def _group(self) -> Group | None:
        return open_group(self)

    @_group.setter
    def _group(self, group: Group | None) -> None:
        self._group_ref = None if group is None else weakref.ref(group)

    def __repr__(self) -> str:
        return f"EmbeddedBackend({str(self.path)!r}, namespaces={sorted(self.namespaces)!r})"

    # --- connection handling ------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        # A forked child must not share the parent's SQLite handle.
        if self._conn is None or self._pid != os.getpid():
            if self._conn is not None:
                self._let_go_of_the_parents()
            self._file_id = file_id(self.path)  # (refused before anything is opened: several names)
            if self._file_id is None and not self._create:  # gone since: not made anew here either
                raise errors.StoreFileError(f"there is no store file at {self.path}", code=-1)
            self._conn = open_connection(self.path, self._busy_timeout, self._synchronous)
            # named after the file itself, as SQLite names its log: one lock whatever link opened it
            self._writer_file = open(f"{os.path.realpath(self.path)}.writer-lock", "ab")  # noqa: SIM115
            self._pid = os.getpid()
            self._file_id = self._file_id or file_id(self.path)  # made by the connection
            self._look_again_at = time.monotonic() + _LOOK_AT_THE_FILE_EVERY
        elif self._group is None and (now := time.monotonic()) >= self._look_again_at:
            # A process that only reads (a consumer polling an empty queue) never takes the writer
            # lock, where the file is looked at: it would read a deleted file for ever, while
            # another process makes a new one at the path and fills it.
            self._look_again_at = now + _LOOK_AT_THE_FILE_EVERY
            if self._file_id is not None and file_id(self.path, names=False) != self._file_id:
                raise self._let_go_of_a_file_gone("")
        return self._conn

    def _let_go_of_a_file_gone(self, written: str) -> errors.StoreFileError:
        """Close this process's handles on a file no longer at the path; the error that says so."""
        if self._conn is not None:
            self._conn.close()
        if self._writer_file is not None:
            self._writer_file.close()
        self._conn, self._writer_file, self._file_id = None, None, None
        return errors.StoreFileError(
            f"store file {self.path} was deleted or replaced while this process had it open:{written}"
            " the next command opens the file that is there now (or makes a new one)",
            code=-1,
        )

    def _let_go_of_the_parents(self) -> None:
        """In a forked child: the connection and writer file copied from the parent, closed (see
        :func:`~large_queue.backends._embedded_file.let_go`) before the child opens its own."""
        inherited, self._conn = self._conn, None
        assert inherited is not None
        let_go(inherited)
        if self._writer_file is not None:  # its flock is the parent's too: closing a copy keeps it
            self._writer_file.close()
            self._writer_file = None

    def _writer_lock(self, hold: bool, *, wait: bool = True) -> bool:
        """Take or drop the cross-process writer lock.

        A writer tries for the lock without waiting and, while another
        process holds it, tries again after a sleep that starts at 20 us and
        doubles up to 200 us (SQLite's own busy handler sleeps in steps of a
        millisecond or more, longer than most commands hold the lock). It
        gives up after ``busy_timeout`` with ``BackendBusyError``. With
        ``wait=False`` it tries once: False if another process holds it. The
        timeline it guards against::

            t=0    process A starts a command (or a lock holder's group of
                   commands) and takes the writer lock.
            t=0.1  A is stopped (SIGSTOP, a debugger, a VM pause) inside it.
            t=0.1  every other process's writes wait for the file.
            t=30   they fail with BackendBusyError naming the file, instead
                   of waiting for as long as A stays stopped; their reads go
                   on meanwhile. A's queue lock has expired by then, and is
                   broken by the first writer after A's command ends.
        """
        if fcntl is None or self._writer_file is None:
            return True
        if not hold:
            fcntl.flock(self._writer_file, fcntl.LOCK_UN)
            return True
        deadline = None
        delay = 0.00002
        while True:
            try:
                fcntl.flock(self._writer_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._still_the_file()
                return True
            except BlockingIOError:
                if not wait:
                    return False
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._busy_timeout
                callers = getattr(self._waits, "deadline", None)  # see waiting_at_most
                waited = f"{self._busy_timeout:g} s"
                if callers is not None and callers < deadline:
                    deadline, waited = callers, "as long as the caller would wait"
            elif now >= deadline:
                raise errors.BackendBusyError(
                    f"store file {self.path} stayed locked by another process for {waited}"
                    " (a process stopped or paused inside a command holds every writer up)",
                    code=-14,
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.0002)

    def _still_the_file(self) -> None:
        """(holding the writer lock) ``StoreFileError`` if the file at the path is not the one open.

        SQLite writes on through its open handle to a file deleted (or
        replaced) under it, where no other process will ever read: every
        write from then on would be lost without a word. A writer checks
        first (one ``stat``), drops its handle and says so; the next command
        opens whatever file is at the path then, as a new process would.
        """
        assert fcntl is not None and self._writer_file is not None
        try:
            now = file_id(self.path)
        except errors.StoreFileError:  # given another name since it was opened: nothing written
            fcntl.flock(self._writer_file, fcntl.LOCK_UN)
            raise
        if self._file_id is None or now == self._file_id:
            return
        fcntl.flock(self._writer_file, fcntl.LOCK_UN)
        raise self._let_go_of_a_file_gone(" nothing was written;")

    @contextlib.contextmanager
    def waiting_at_most(self, seconds: float | None) -> Iterator[None]:
        """Commands this thread sends inside wait for another process's writer lock ``seconds`` at
        most (``BackendBusyError``), not ``busy_timeout``: a caller's deadline (``dequeue(timeout=)``)."""
        if seconds is None:
            yield
            return
        outer = getattr(self._waits, "deadline", None)
        self._waits.deadline = time.monotonic() + seconds
        try:
            yield
        finally:
            self._waits.deadline = outer

    def grouped(self) -> Group:
        """The commands sent inside, in one SQLite transaction (see :mod:`._transactions`)."""
        return Group(self)

    def close(self) -> None:
        """Close this process's handle on the file."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
                if self._writer_file is not None:
                    self._writer_file.close()
            self._conn = None
            self._writer_file = None

    # --- validation ------------------------------------------------------------

    def _check_key(self, key: RecordKey) -> None:
        if key.namespace not in self.namespaces:
            raise fail(
                errors.NamespaceNotFoundError,
                f"namespace {key.namespace!r} is not configured on the embedded store"
                f" (configured: {', '.join(sorted(self.namespaces))})",
            )
        if len(key.set_name.encode()) > MAX_SET_NAME_BYTES:
            raise errors.BackendUsageError(
                f"set name {key.set_name!r} is longer than {MAX_SET_NAME_BYTES} bytes", code=-2
            )

    def _check_bins(self, names: Iterable[str]) -> None:
        good = self._good_bins
        for name in names:
            if name in good:
                continue
            check_bin_names([name])
            if len(good) < _MOST_GOOD_BINS:
                good.add(name)

    # --- storage primitives ----------------------------------------------------

    def _load(
        self,
        conn: sqlite3.Connection,
        key: RecordKey,
        command: tuple[Sequence[Operation], Condition | None] | None = None,
    ) -> tuple[dict[str, Any], int, int, int, int | None] | None:
        """A record's bins, generation, last update (ns), stored size (bytes) and expiry (ns, None:
        never); None if there is none. ``command``: the operations and condition it is read for, where
        large bins they do not name may stay encoded (:mod:`._embedded_decode`)."""
        row = conn.execute(
            "SELECT bins, generation, updated_ns, expires_ns FROM records"
            " WHERE namespace=? AND set_name=? AND user_key=?",
            (key.namespace, key.set_name, key.user_key),
        ).fetchone()
        if row is None:
            return None
        if row[3] is not None and row[3] <= self.clock():
            return None
        return (
            self._decoder.decode(row[0], key, command),
            row[1],
            row[2],
            len(row[0]),
            row[3],
        )

    def _store(
        self,
        conn: sqlite3.Connection,
        key: RecordKey,
        bins: dict[str, Any],
        generation: int,
        expires_ns: int | None,
        *,
        stored_size: int | None,
    ) -> None:
        """Write a record's bins; ``stored_size``: the size of the record this command read, if any.

        A record that keeps its size (a slot overwritten by an entry as
        large: a queue's every lap after its first) is rewritten with
        ``UPDATE``, which SQLite does in place, writing only the pages whose
        bytes changed; other writes are ``INSERT OR REPLACE``, which deletes
        the row and inserts it anew (also an expired row still there), and
        costs less than ``UPDATE`` where the row grows. Rewriting an 11 KB
        buffer record took 37-46 us that way here, 31 us in place, 16 us in
        place where one slot's page changed; a row growing, 37-39 us and 41 us.
        """
        if not bins:  # as Aerospike does: a record whose last bin is removed is removed
            conn.execute(
                "DELETE FROM records WHERE namespace=? AND set_name=? AND user_key=?",
                (key.namespace, key.set_name, key.user_key),
            )
            return
        try:
            blob = pack(bins)
        except (TypeError, OverflowError, UnicodeEncodeError) as exc:  # a value written by an operation
            raise errors.BackendUsageError(
                f"record {key.set_name}/{key.user_key} cannot hold a value written to it: {exc}", code=-2
            ) from None
        if len(blob) > self.record_size_limit:
            raise fail(
                errors.RecordTooLargeError,
                f"record {key.set_name}/{key.user_key} would be {len(blob)} bytes,"
                f" over the {self.record_size_limit}-byte record size limit",
            )
        if stored_size == len(blob):
            conn.execute(
                "UPDATE records SET generation=?, updated_ns=?, expires_ns=?, bins=?"
                " WHERE namespace=? AND set_name=? AND user_key=?",
                (generation, self.clock(), expires_ns, blob, key.namespace, key.set_name, key.user_key),
            )
            return
        conn.execute(
            "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key.namespace, key.set_name, key.user_key, generation, self.clock(), expires_ns, blob),
        )

    def _clock_for(self, updated_ns: int, now_ns: int | None = None) -> Clock:
        """The store's clock for a command on a record last written at ``updated_ns``."""
        now = self.clock() if now_ns is None else now_ns
        return frozen(Clock, now_ms=now // 1_000_000, since_update_ms=(now - updated_ns) // 1_000_000)

    def _transaction(self, write: bool) -> Transaction:
        return Transaction(self, write)

    # --- the interface ----------------------------------------------------------

    def sets_holding(self, namespace: str, user_key: str) -> list[str]:
        """The sets of ``namespace`` that hold a record with key ``user_key``, sorted."""
        self._count()
        self._check_key(RecordKey(namespace, "", user_key))
        with self._transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT set_name, expires_ns FROM records WHERE namespace=? AND user_key=? ORDER BY set_name",
                (namespace, user_key),
            ).fetchall()
        now = self.clock()
        return [set_name for set_name, expires_ns in rows if expires_ns is None or expires_ns > now]

    def max_record_bytes(self, namespace: str) -> int:
        """The store's record size limit (the same in every namespace)."""
        self._check_key(RecordKey(namespace, "", ""))
        return self.record_size_limit

    def get(self, key: RecordKey, bins: Sequence[str] | None = None) -> Record | None:
        """Read a record (only ``bins`` where given), or None if it does not exist."""
        self._count()
        self._check_key(key)
        with self._transaction(write=False) as conn:
            loaded = self._load(conn, key)
        if loaded is None:
            return None
        if bins is None:
            return Record(loaded[0], loaded[1])
        if not bins:  # as Aerospike: a select of no bin is a malformed request
            raise misuse(key, ValueError("a read of no bin: give bin names, or None for the whole record"))
        return Record({name: loaded[0][name] for name in bins if name in loaded[0]}, loaded[1])

    def put(
        self,
        key: RecordKey,
        bins: dict[str, Any],
        *,
        mode: WriteMode = WriteMode.UPSERT,
        generation: int | None = None,
        ttl: int | None = None,
    ) -> None:
        """Write bins; ``mode`` and ``generation`` guard the write."""
        self._count()
        self._check_key(key)
        if not bins:
            raise errors.BackendUsageError(f"a put to {key.set_name}/{key.user_key} names no bin", code=-2)
        self._check_bins(bins)
        check_bin_values(key, bins)
        if mode is WriteMode.REPLACE and any(value is None for value in bins.values()):
            raise errors.BackendUsageError(  # as Aerospike, which refuses it and keeps the record
                f"a put to {key.set_name}/{key.user_key} that replaces the record cannot also remove a bin"
                " (None): leave the bin out",
                code=4,
            )
        with self._transaction(write=True) as conn:
            loaded = self._load(conn, key)
            if loaded is not None and mode is WriteMode.CREATE_ONLY:
                raise fail(errors.RecordExistsError, f"record {key.set_name}/{key.user_key} exists")
            nothing = all(value is None for value in bins.values())  # it only removes bins
            if loaded is None and (nothing or mode in (WriteMode.UPDATE_ONLY, WriteMode.REPLACE)):
                raise fail(errors.RecordNotFoundError, f"record {key.set_name}/{key.user_key} not found")
            # a missing record is at generation 0, as on Aerospike
            if generation is not None and (0 if loaded is None else loaded[1]) != generation:
                raise fail(
                    errors.GenerationMismatchError,
                    f"record {key.set_name}/{key.user_key} is not at generation {generation}",
                )
            merged = {} if loaded is None or mode is WriteMode.REPLACE else dict(loaded[0])
            for name, value in bins.items():
                if value is None:
                    merged.pop(name, None)
                else:
                    merged[name] = value
            seconds = check_ttl(ttl)
            expires = None if seconds is None else self.clock() + seconds * 1_000_000_000
            if loaded is None:
                self._store(conn, key, merged, 1, expires, stored_size=None)
            else:
                self._store(conn, key, merged, _after(loaded[1]), expires, stored_size=loaded[3])

    def operate(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        *,
        condition: Condition | None = None,
        generation: int | None = None,
    ) -> dict[str, Any]:
        """Apply operations atomically to an existing record; return the reads."""
        self._count()
        self._check_key(key)
        if not operations:  # as Aerospike, which takes no command without an operation
            raise misuse(key, ValueError("a command needs at least one operation"))
        writes = False
        for op in operations:
            if not isinstance(op, READ_OPERATIONS):
                writes = True
                break
        try:
            self._check_bins([op.bin for op in operations])
            if writes:
                check_overwriting_reads(operations)  # refused before the record is read, as on Aerospike
        except (AttributeError, TypeError) as exc:  # not an operation, or a read its write would hide
            raise misuse(key, exc) from None
        guarded = condition is not None or generation is not None
        refused = self._refused
        # Optimistic (a reader until the guard holds) only where this process's
        # last guarded write to the record was refused: a busy queue lock is
        # likely busy still, while a producer's reservation usually succeeds.
        optimistic = guarded and bool(refused) and key in refused
        try:
            results = self._operate_once(key, operations, condition, generation, writes, optimistic)
        except StaleSnapshot:  # another process wrote first: evaluate again, holding the writer lock
            results = self._operate_once(key, operations, condition, generation, writes, False)
        except (errors.ConditionNotMetError, errors.GenerationMismatchError):
            if guarded and writes:
                if len(self._refused) >= _MOST_REFUSED:
                    self._refused.clear()
                self._refused.add(key)
            raise
        if optimistic:
            refused.discard(key)
        return results

    def _operate_once(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        condition: Condition | None,
        generation: int | None,
        writes: bool,
        optimistic: bool,
    ) -> dict[str, Any]:
        # An optimistic guarded write starts as a reader and takes the write
        # lock only if its guard holds, so refused attempts (a busy queue lock,
        # say) never queue behind writers. SQLite refuses the upgrade if anyone
        # wrote since our read (a stale snapshot); the command is then evaluated
        # again as a writer from the start. Other writes hold the writer lock
        # from the start: writers contending on a record (producers reserving
        # offsets) would otherwise read again and again.
        transaction = self._transaction(write=writes and not optimistic)
        with transaction as conn:
            loaded = self._load(conn, key, (operations, condition))
            if loaded is None:
                raise fail(errors.RecordNotFoundError, f"record {key.set_name}/{key.user_key} not found")
            bins, current_generation, updated_ns, stored_size, expires_ns = loaded
            if generation is not None and writes and current_generation != generation:  # as Aerospike
                raise fail(
                    errors.GenerationMismatchError,
                    f"record {key.set_name}/{key.user_key} is not at generation {generation}",
                )
            clock = self._clock_for(updated_ns)
            try:
                met = condition is None or evaluate(condition, bins, clock) is True
                results = apply(key, bins, operations, clock) if met else {}
            except MISUSE as exc:
                raise misuse(key, exc) from None
            if not met:
                raise fail(
                    errors.ConditionNotMetError,
                    f"condition not met on record {key.set_name}/{key.user_key}",
                )
            if writes:
                if not transaction.become_writer(wait=not optimistic):
                    # Another process writes now. Waiting here would hold this read's snapshot, which
                    # a checkpoint that process runs (compact()) waits for in turn, each until the busy
                    # timeout: evaluated again as a writer instead, which waits holding no snapshot.
                    raise StaleSnapshot()
                try:
                    # as Aerospike's operate (TTL_DONT_UPDATE): a record with a TTL keeps it
                    self._store(
                        conn, key, bins, _after(current_generation), expires_ns, stored_size=stored_size
                    )
                except sqlite3.OperationalError as exc:
                    if optimistic and ("locked" in str(exc) or "busy" in str(exc)):
                        raise StaleSnapshot() from exc
                    raise
        return results

    def remove(self, key: RecordKey) -> bool:
        """Delete a record; False if it did not exist."""
        self._count()
        self._check_key(key)
        with self._transaction(write=True) as conn:
            gone = conn.execute(
                "DELETE FROM records WHERE namespace=? AND set_name=? AND user_key=? RETURNING expires_ns",
                (key.namespace, key.set_name, key.user_key),
            ).fetchall()
            # an expired row still stored goes too, but was no record (as Aerospike says once its
            # expiry thread has reaped it; before, Aerospike says True)
            removed = bool(gone) and (gone[0][0] is None or gone[0][0] > self.clock())
            group = self._group
            if gone and group is not None:
                group.reclaim = True  # vacuuming now would end the group's transaction: it does so at its end
        if gone and group is None:
            self._reclaim()
        return removed

    def compact(self) -> None:
        """Rewrite the file without its free pages, and switch it to giving them back as they free.

        For files made before the store reclaimed space on delete: ``VACUUM``
        copies the whole file, so it holds the writer lock for as long.
        """
        # the last step copies what VACUUM wrote to the write-ahead log into the file itself, now
        self._maintain("PRAGMA auto_vacuum=INCREMENTAL; VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")

    def _reclaim(self) -> None:
        """Give the file's free pages back to the file system: the pages a removed record held."""
        self._maintain("PRAGMA incremental_vacuum;")

    def _maintain(self, script: str) -> None:
        """Run SQL outside any command's transaction, under the writer lock.

        ``executescript`` steps each statement to its end (``execute`` would
        free one page of an incremental vacuum).
        """
        with self._lock:
            try:
                conn = self._connection()
            except (sqlite3.Error, OSError) as exc:
                raise store_file_error(self.path, exc) from exc
            self._writer_lock(True)
            try:
                conn.executescript(script)
            except sqlite3.Error as exc:
                raise store_file_error(self.path, exc) from exc
            finally:
                self._writer_lock(False)

    def batch_get(self, keys: Sequence[RecordKey]) -> list[Record | None]:
        """Read many records in one command; None where a record is missing."""
        self._count()
        with self._transaction(write=False) as conn:
            return self._records(conn, keys)

    def _records(self, conn: sqlite3.Connection, keys: Sequence[RecordKey]) -> list[Record | None]:
        for key in keys:
            self._check_key(key)
        wanted: dict[tuple[str, str], list[str]] = {}
        for key in keys:
            wanted.setdefault((key.namespace, key.set_name), []).append(key.user_key)
        found: dict[tuple[str, str, str], Record] = {}
        now = self.clock()
        for (namespace, set_name), user_keys in wanted.items():
            for first in range(0, len(user_keys), _KEYS_PER_SELECT):
                part = user_keys[first : first + _KEYS_PER_SELECT]
                rows = conn.execute(
                    "SELECT user_key, bins, generation, expires_ns FROM records"
                    f" WHERE namespace=? AND set_name=? AND user_key IN ({','.join('?' * len(part))})",
                    (namespace, set_name, *part),
                )
                for user_key, blob, generation, expires_ns in rows:
                    if expires_ns is None or expires_ns > now:
                        where = (namespace, set_name, user_key)
                        found[where] = Record(_unpack(blob, where), generation)
        return [found.get((key.namespace, key.set_name, key.user_key)) for key in keys]

    def batch_read(
        self, reads: Sequence[tuple[RecordKey, Sequence[Operation] | None]]
    ) -> list[dict[str, Any] | None]:
        """Read from many records in one command: each record's read operations, or all its bins."""
        self._count()
        check_reads(reads)
        for key, _ in reads:
            self._check_key(key)
        results: list[dict[str, Any] | None] = []
        with self._transaction(write=False) as conn:
            now = self.clock()
            for key, operations in reads:
                loaded = self._load(conn, key)
                if loaded is None or operations is None:
                    results.append(None if loaded is None else loaded[0])
                else:
                    bins, _, updated_ns, _, _ = loaded
                    try:
                        results.append(apply(key, bins, operations, self._clock_for(updated_ns, now)))
                    except MISUSE as exc:
                        raise misuse(key, exc) from None
        return results

    def operate_each(self, commands: Sequence[RecordCommand]) -> list[dict[str, Any] | errors.BackendError]:
        """``operate`` on several records in one transaction (:meth:`Backend.operate_each`).

        A malformed command undoes the commands before it: none of the batch is applied.
        """
        with self.grouped(), self._undone_if_malformed():
            return super().operate_each(commands)

    def operate_and_read(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        read: ReadBeside,
        *,
        condition: Condition | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``operate`` and a read of another record, in one transaction (:meth:`Backend.operate_and_read`).

        A malformed read undoes the write before it.
        """
        with self.grouped(), self._undone_if_malformed():
            return super().operate_and_read(key, operations, read, condition=condition)

    @contextlib.contextmanager
    def _undone_if_malformed(self) -> Iterator[None]:
        """Inside a group: what the commands inside wrote is undone if one is malformed (a savepoint)."""
        conn = self._conn
        assert conn is not None and self._group is not None
        conn.execute("SAVEPOINT malformed")
        try:
            yield
        except (errors.BackendUsageError, errors.BinNameError):
            conn.execute("ROLLBACK TO malformed")
            raise
        finally:
            if conn.in_transaction:  # else SQLite itself failed and rolled the group back: that error goes on
                conn.execute("RELEASE malformed")
