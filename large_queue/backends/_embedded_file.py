"""The embedded store's SQLite file: its one table, how a process opens it, and what it refuses.

A store's file holds one table, ``records``. A process opens it with one
connection (write-ahead log, the ``synchronous`` level asked, no
memory-mapped I/O), and a new file is set to give the pages of deleted
records back to the file system. Another program's SQLite file is refused
and left as it is. A forked child closes the connection it inherited
before it opens its own (:func:`let_go`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from pathlib import Path

from large_queue import errors

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    namespace TEXT NOT NULL,
    set_name TEXT NOT NULL,
    user_key TEXT NOT NULL,
    generation INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL,
    expires_ns INTEGER,
    bins BLOB NOT NULL,
    PRIMARY KEY (namespace, set_name, user_key)
) WITHOUT ROWID
"""

_COLUMNS = ["namespace", "set_name", "user_key", "generation", "updated_ns", "expires_ns", "bins"]


def open_connection(path: Path, busy_timeout: float, synchronous: str) -> sqlite3.Connection:
    """A connection to the store file at ``path`` (made if there is none), its table made.

    ``StoreFileError`` (the file left unchanged) for another program's file.
    """
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    # Pages freed by a removed record go back to the file system at once, in steps as small as
    # the record: set before the first table, so for new files only.
    if conn.execute("PRAGMA page_count").fetchone()[0] == 0:  # a new file
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    else:
        _refuse_a_foreign_file(conn, path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
    # No memory-mapped I/O: with it, the first command after another connection has written
    # costs about 16 us more (plain SQLite, one row read and rewritten), without it about 4 us;
    # reads and single-process rates measured the same either way.
    conn.execute("PRAGMA mmap_size=0")
    conn.execute(SCHEMA)
    return conn


def _refuse_a_foreign_file(conn: sqlite3.Connection, path: Path) -> None:
    """``StoreFileError`` for an SQLite file that is not a store's: it is left as it is.

    A store's file holds one table, ``records``, with the store's columns,
    and nothing else; another program's file with a table of that name is
    refused as well, and so is one with no table that another program has
    marked (a view, an index or a trigger, ``user_version`` or
    ``application_id``).
    """
    objects = [
        (kind, name)
        for kind, name in conn.execute("SELECT type, name FROM sqlite_master")
        if not name.startswith("sqlite_")
    ]
    tables = [name for kind, name in objects if kind == "table"]
    if not tables:
        marks = {
            pragma: conn.execute(f"PRAGMA {pragma}").fetchone()[0]
            for pragma in ("user_version", "application_id")
        }
        found = [f"{kind} {name}" for kind, name in objects] + [f"{p}={v}" for p, v in marks.items() if v]
        if found:
            _refuse(conn, path, ", ".join(found[:5]))
        return
    columns = [row[1] for row in conn.execute("PRAGMA table_info(records)")]
    if tables != ["records"] or columns != _COLUMNS or len(objects) > len(tables):
        shown = ", ".join(sorted(tables)[:5]) if tables != ["records"] else f"records ({', '.join(columns)})"
        _refuse(conn, path, f"tables {shown}")


def _refuse(conn: sqlite3.Connection, path: Path, found: str) -> None:
    conn.close()
    raise errors.StoreFileError(
        f"{path} is an SQLite database of something else ({found}), not an embedded store: it is left"
        " unchanged; name another file",
        code=-1,
    )


def let_go(inherited: sqlite3.Connection) -> None:
    """In a forked child, close the connection copied from the parent, before opening its own.

    SQLite keeps, per process, which file locks its connections hold; a
    child inherits that table but not the locks (POSIX locks are the
    parent's alone). A connection opened beside the copy would take the
    table's word and hold no lock of its own::

        t=0  the parent has the store open (a shared lock), and forks.
        t=1  the child opens its own connection: SQLite, believing the
             lock held, takes none.
        t=2  the parent closes its store: no other process holds a lock,
             so SQLite checkpoints and deletes the write-ahead log.
        t=3  the child writes on into the deleted log: no other process
             ever reads it, and every write is lost.

    Closed first, the copy takes the table with it (it unlocks nothing: the
    child holds no lock, and the parent's are the parent's), and the
    child's own connection takes real locks. The copy's close cannot delete
    the log while the parent holds its lock; where the parent has closed
    already, it is the last connection and checkpoints, as any is.
    """
    with contextlib.suppress(sqlite3.Error):
        inherited.close()


def file_id(path: Path, *, names: bool = True) -> tuple[int, int] | None:
    """The device and inode of the file at ``path`` (None if there is none).

    ``StoreFileError`` if the file has other names (hard links): SQLite
    keeps a file's write-ahead log, and the store its writer lock, beside
    the name it was opened by, so processes that open one file by two names
    each commit to a log of their own, and overwrite each other's pages::

        t=0  process A opens the store as a.db, process B as b.db (a hard
             link to it); each commits entries to its own log.
        t=1  each log is folded into the file in turn: the file holds B's
             pages over A's (acknowledged entries gone), or is damaged.

    A symbolic link is one name: SQLite opens the file it points to.
    ``names=False``: the file's names are not looked at.
    """
    try:
        found = os.stat(path)
    except OSError:
        return None
    if (
        names and found.st_nlink > 1 and stat.S_ISREG(found.st_mode)
    ):  # (a directory has several: refused elsewhere)
        raise errors.StoreFileError(
            f"store file {path} has {found.st_nlink} names (hard links): SQLite keeps its write-ahead log"
            " beside each name, so processes using different names would overwrite each other's writes;"
            " open it by one name only (a symbolic link is fine) and remove the others",
            code=-1,
        )
    return found.st_dev, found.st_ino
