"""Read a slot's ``spool.db`` from outside its producer, writing nothing beside it.

Used by the spool check, the scan of free slots (`logsdk.spool._slots.spooled_records()`)
and ``logsdk spool status|export|replay``.

Invariants:
- the database is named by a ``file:`` URI of its absolute path, percent-encoded
  (`pathlib.Path.as_uri()`): spaces, ``#``, ``?``, ``%`` and non-ASCII characters in
  the path are the path's, never a fragment, a query or an escape;
- a ``mode=ro`` connection to a WAL database creates the ``-wal`` and ``-shm`` files when
  they are missing, and leaves them (owned by whoever read: root's files in a producer's
  dir, which the producer's open then refuses). So ``mode=ro`` is used only when both
  exist (a live producer's slot, or a crashed one's); otherwise the file is opened with
  ``immutable=1``, read as it is, and such a read counts only when the files did not
  change under it (`file_ids()` before and after): a producer that opens the slot
  meanwhile may rewrite pages an immutable reader does not know changed;
- a ``-wal`` that holds commits but has no ``-shm`` cannot be read without writing one:
  an immutable read does not see those commits (`misses_wal()`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from logsdk._sqlite import connect as gated_connect

#: (inode, size, mtime_ns, device) of a file.
FileId = tuple[int, int, int, int]
#: The ids of ``spool.db``, its ``-wal`` and its ``-shm`` (None: missing).
FileIds = tuple[FileId | None, FileId | None, FileId | None]

#: Seconds a read waits for a lock SQLite needs (a producer recovering its WAL).
BUSY_TIMEOUT = 5.0


def file_id(path: Path) -> FileId | None:
    """(inode, size, mtime_ns, device) of ``path``, None when it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_dev)


def file_ids(db: Path) -> FileIds:
    """The ids of ``db`` and of its ``-wal`` and ``-shm``: compare two to tell whether the
    files changed between them."""
    return (file_id(db), file_id(Path(f"{db}-wal")), file_id(Path(f"{db}-shm")))


def needs_immutable(ids: FileIds) -> bool:
    """True when a ``mode=ro`` open would create a missing ``-wal`` or ``-shm``: read the
    main file as it is (``immutable=1``) instead."""
    return ids[1] is None or ids[2] is None


def misses_wal(ids: FileIds) -> bool:
    """True when a ``-wal`` with commits has no ``-shm``: an immutable read (the only one
    that writes nothing) does not see those commits."""
    wal = ids[1]
    return ids[2] is None and wal is not None and wal[1] > 0


def uri(db: Path, *, immutable: bool) -> str:
    """The ``file:`` URI that opens ``db`` read-only (see the module docstring)."""
    return Path(os.path.abspath(db)).as_uri() + ("?immutable=1" if immutable else "?mode=ro")


@contextlib.contextmanager
def connect(
    db: Path, *, immutable: bool, timeout: float = BUSY_TIMEOUT
) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``db`` (``query_only`` as well; autocommit: a caller that
    wants one snapshot for several reads says ``BEGIN``), closed on the way out. Raises
    `sqlite3.Error` when it cannot be opened."""
    conn = gated_connect(
        uri(db, immutable=immutable), uri=True, timeout=timeout, isolation_level=None
    )
    try:
        conn.execute("PRAGMA query_only=ON")
        yield conn
    finally:
        conn.close()
