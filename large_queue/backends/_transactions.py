"""How the embedded store's commands become SQLite transactions: one per command, or one per group.

Every command is one transaction, so it is atomic across processes as an
Aerospike command is on its record. A library operation made of several
commands (an enqueue's reservation and publish; a dequeue's lock, read and
commit) may run them as a group (:meth:`Backend.grouped`): one transaction
for all of them, so one commit, one wait for the disk at
``synchronous=full``, and one turn of the cross-process writer lock instead
of one per command.

A group changes no outcome. Its commands are evaluated in order, each
against what the ones before it wrote, exactly as if sent one by one with no
other writer in between, which is one of the orders the store allowed
anyway. What it changes is what other processes can see, for the better:
they see all of the group or none of it. The timeline of a crash:

- t=0  a producer's group reserves offset 7 (the tail moves to 8, in the
  transaction only).
- t=1  the producer dies before publishing offset 7.
- t=2  SQLite rolls the transaction back: no process ever saw offset 7
  reserved, so no reader waits on a hole there, and the tail is 7 again.

A command that is refused (a guard that does not hold, a record too large)
wrote nothing, so the group goes on and commits what the others wrote, as
separate commands would have. Only a failure of SQLite itself (a full disk)
rolls the whole group back: no other process saw any of it, and the
operation reports the failure. SQLite may end the transaction on its own at
such a failure; the group's later commands are then refused (they would
otherwise each commit alone), and its end says the group was rolled back
even where its caller took each command's failure as a result.

An interrupt (``KeyboardInterrupt``, or any exception a signal handler
raises) that lands inside a command or a group, before its commit ran,
rolls its transaction back on the way out. One that lands at the very
start of its end, where none of its code runs, leaves it open with nothing
to end it: the store keeps only weak references to the open command and
group, so the thread's next command finds them gone, rolls the transaction
back and lets go of their locks before it begins (:func:`open_group`).
Either way the interrupted operation keeps nothing, and later ones are
committed, not joined to a group that nothing would commit. (Only while the
interrupt's traceback is kept, which keeps the group's object, is it not
found; a debugger's or an interactive session's last traceback does.)

A group holds the writer lock from its first command to its last, so the
code inside it must not wait for anything another process does (a busy
queue lock's back-off, say): that process could be waiting for the writer
lock in turn. Other threads of the process wait for the group to end.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from large_queue import errors

if TYPE_CHECKING:
    from large_queue.backends.embedded import EmbeddedBackend


def store_file_error(path: Path, exc: sqlite3.Error | OSError) -> errors.BackendError:
    """The library error for an SQLite failure on the store's file."""
    text = str(exc)
    lowered = text.lower()
    if "locked" in lowered or "busy" in lowered:
        return errors.BackendBusyError(
            f"store file {path} stayed locked by another process: {text}", code=-14
        )
    if "readonly" in lowered or "read-only" in lowered:
        problem = (
            "is read-only"
            if os.access(path.parent, os.W_OK | os.X_OK)
            else f"is read-only here: its directory {path.parent} is not writable, and the store writes"
            " its write-ahead log beside it"
        )
    elif "not a database" in lowered or "malformed" in lowered or "corrupt" in lowered:
        problem = "is damaged or is not a large_queue store"
    elif "unable to open" in lowered:
        problem = "cannot be opened (is it a directory, or in a directory that is not writable?)"
    else:
        problem = "failed"
    return errors.StoreFileError(f"store file {path} {problem}: {text}", code=-1)


class StaleSnapshot(Exception):
    """A deferred transaction could not become a writer: its snapshot is stale."""


class Transaction:
    """One command's transaction, or its part in the group this thread has open.

    A writer holds the cross-process writer lock for the whole transaction; a
    guarded command starts as a reader and calls :meth:`become_writer` only
    when its guard holds. In a group, the group's transaction (begun as a
    writer) serves instead.
    """

    def __init__(self, backend: EmbeddedBackend, write: bool) -> None:
        self._backend = backend
        self._write = write
        self._writer = False
        self._grouped = False

    def become_writer(self, *, wait: bool = True) -> bool:
        """Queue for the writer lock (no-op if already held); ``wait=False``: False if it is busy."""
        if not self._writer and not self._grouped:
            if not self._backend._writer_lock(True, wait=wait):
                return False
            self._writer = True
        return True

    def __enter__(self) -> sqlite3.Connection:
        backend = self._backend
        backend._lock.acquire()
        conn: sqlite3.Connection | None = None
        try:
            _let_go_of_a_command_left(backend)
            conn = backend._connection()
            group = backend._group
            if group is not None:  # this thread's: another's would hold the lock above
                self._grouped = True
                if group.failed or not conn.in_transaction:  # SQLite ended the group's transaction
                    group.failed = True
                    raise errors.StoreFileError(
                        f"store file {self._backend.path}: an earlier command of this group failed, and"
                        " SQLite rolled the whole group back; nothing of it is kept",
                        code=-1,
                    )
                return conn
            if conn.in_transaction:  # left open by a command of this thread that an interrupt cut short
                conn.execute("ROLLBACK")
            if self._write:
                self.become_writer()
            conn.execute("BEGIN IMMEDIATE" if self._write else "BEGIN")
            backend._txn_ref = weakref.ref(self)
            return conn
        except BaseException as exc:  # (an interrupt too: a transaction begun is not left open)
            if conn is not None and not self._grouped:
                backend._txn_ref = None
                _roll_back(conn)
            self._release()
            if isinstance(exc, (sqlite3.Error, OSError)):
                raise store_file_error(self._backend.path, exc) from exc
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._grouped:
            try:
                if isinstance(exc, sqlite3.Error):
                    group = self._backend._group
                    assert group is not None
                    group.failed = True
                    raise store_file_error(self._backend.path, exc) from exc
            finally:
                self._release()
            return
        conn = self._backend._conn
        try:
            self._backend._txn_ref = None
            if conn is not None:
                conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
        except sqlite3.Error as failure:
            if exc is None:
                raise store_file_error(self._backend.path, failure) from failure
        finally:
            try:
                if conn is not None:  # an interrupt before the statement ran: not left open
                    _roll_back(conn)
            finally:
                self._release()
        if isinstance(exc, sqlite3.Error):
            raise store_file_error(self._backend.path, exc) from exc

    def _release(self) -> None:
        try:
            if self._writer:
                self._backend._writer_lock(False)
                self._writer = False
        finally:
            self._backend._lock.release()


class Group:
    """One transaction for every command sent inside it (see the module's timeline).

    Entered again by the thread that holds it, it joins the open group.
    """

    def __init__(self, backend: EmbeddedBackend) -> None:
        self._backend = backend
        self._joined = False
        self.failed = False  # SQLite failed a command: the whole group is rolled back
        self.reclaim = False  # a record was removed: give its pages back once the group ends

    def __enter__(self) -> None:
        backend = self._backend
        backend._lock.acquire()
        _let_go_of_a_command_left(backend)
        if backend._group is not None:
            self._joined = True
            return
        writer = False
        conn: sqlite3.Connection | None = None
        try:
            conn = backend._connection()
            backend._writer_lock(True)
            writer = True
            if conn.in_transaction:  # left open by a command of this thread that an interrupt cut short
                conn.execute("ROLLBACK")
            conn.execute("BEGIN IMMEDIATE")
            backend._group = self
        except BaseException as exc:  # (an interrupt too: nothing begun is left open)
            if backend._group is self:
                backend._group = None
            if conn is not None:
                _roll_back(conn)
            if writer:
                backend._writer_lock(False)
            backend._lock.release()
            if isinstance(exc, (sqlite3.Error, OSError)):
                raise store_file_error(backend.path, exc) from exc
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        backend = self._backend
        if self._joined:
            backend._lock.release()
            return
        conn = backend._conn
        try:
            backend._group = None
            assert conn is not None
            if self.failed:
                if conn.in_transaction:  # else SQLite rolled it back itself (a full disk, say)
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error as failure:
                        if exc is None:
                            raise store_file_error(backend.path, failure) from failure
                if exc is None:  # its commands' failures were taken as results (operate_each): said now
                    raise errors.StoreFileError(
                        f"store file {backend.path} failed inside a group of commands: the whole group was"
                        " rolled back, none of it is kept",
                        code=-1,
                    )
            else:
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error as failure:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    if exc is None:
                        raise store_file_error(backend.path, failure) from failure
        finally:
            try:
                if conn is not None:  # an interrupt before the commit ran: not left open
                    _roll_back(conn)
            finally:
                backend._writer_lock(False)
                backend._lock.release()
        if self.reclaim:
            backend._reclaim()


def _roll_back(conn: sqlite3.Connection) -> None:
    """End ``conn``'s transaction if one is still open (its commit or rollback never ran)."""
    with contextlib.suppress(sqlite3.Error):  # SQLite ended it itself meanwhile, or it was closed
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def open_group(backend: EmbeddedBackend) -> Group | None:
    """The group of commands open in ``backend`` (by the thread holding its lock), or None.

    A group is held by the code that will end it (a ``with`` statement, a
    lock's holding); the store keeps only a weak reference. A group whose
    object is gone was left without its end (an interrupt that landed at
    the very start of it, where none of its code could run): nothing would
    ever commit it, and commands that joined it would be lost at the close.
    It is rolled back here (the interrupted operation keeps nothing) and its
    locks let go, and the command that asked runs on its own.
    """
    ref = backend._group_ref
    if ref is None:
        return None
    group = ref()
    if group is None and backend._lock._is_owned():  # type: ignore[attr-defined]
        backend._group_ref = None
        _let_go(backend)
    return group


def _let_go_of_a_command_left(backend: EmbeddedBackend) -> None:
    """(holding the lock) If a command of this thread was left without its end, roll it back, let go."""
    if backend._txn_ref is not None and backend._txn_ref() is None:
        _let_go(backend)


def _let_go(backend: EmbeddedBackend) -> None:
    """Roll back what a group or command left without its end had open; let go of its locks."""
    backend._txn_ref = None
    conn = backend._conn
    if conn is not None:
        _roll_back(conn)
    backend._writer_lock(False)
    backend._lock.release()  # its own hold (the caller holds the lock too)
