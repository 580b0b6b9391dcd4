"""A spool's SQLite database: its schema, what an open checks and finds, and what SQLite's
errors mean for it.

Schema: the rows in ``records_all`` (id, topic, key, value, headers, ts, seq, size); the
view ``records``, the rows above the watermark (what the spool holds, for anyone reading
the file); ``meta.replayed_through``, the watermark; ``rejected``, records Kafka refused,
with their error; ``identity``, the database's copy of the producer id and the seq
reservation.

Invariants:
- `open_database()` runs ``PRAGMA quick_check`` and counts the rows and their bytes
  (reads of the whole file: about 0.2 s for 270 MB, measured) unless the summary a clean
  close left still describes the file (`unchanged_since_close()`: its size, mtime and
  inode, with no WAL beside it) and agrees with the table on two cheap looks: the
  watermark, and whether a row is left above it (the count is never trusted to say "empty"
  while a row is there: that row would never be replayed);
- ``size`` is computed by SQLite from the row itself, as `logsdk.spool._codec.row_size()`
  computes it (`insert_sql()`);
- a spool written by logsdk before the watermark (a table ``records``) is converted in
  place: the table renamed, no row copied (`create_schema()`);
- an error is a damaged file when SQLite says so (`looks_corrupt()`): such errors
  raise [`SpoolCorruptError`][logsdk.errors.SpoolCorruptError] (`spool_error()`), which a producer
  answers by rebuilding the spool (`logsdk.spool._salvage`).

Owner: none (functions). A connection `open_database()` returns belongs to the spool
that asked for it (its owning thread).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
from pathlib import Path

import sqlite_utils

from logsdk._sqlite import connect as gated_connect
from logsdk.errors import SpoolCorruptError, SpoolError
from logsdk.spool._codec import ROW_OVERHEAD

log = logging.getLogger("logsdk.spool")

DB_NAME = "spool.db"
SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_COLUMNS = "topic, key, value, headers, ts, seq, size"

#: The view of the rows in custody, the table behind it, and the watermark below which a
#: replay has acknowledged every row (see `logsdk.spool._rows`).
_VIEW_SQL = (
    "CREATE VIEW records AS SELECT * FROM records_all WHERE id > "
    "coalesce((SELECT value FROM meta WHERE name = 'replayed_through'), 0)"
)
#: The columns a record has in both the ``records`` and the ``rejected`` table.
_RECORD_COLUMNS: dict[str, type] = {
    "id": int,
    "topic": str,
    "key": bytes,
    "value": bytes,
    "headers": bytes,
    "ts": int,
    "seq": int,
}
#: Rows per multi-row INSERT, largest first (7 parameters a row: 1000 rows stay under
#: SQLite's default limit of 32766 parameters; a build with a lower one skips them). Not
#: more: preparing the statement grows with the square of its rows (with numbered
#: placeholders, measured: 1000 rows 0.1 s once per connection, 5000 rows 2.6 s).
INSERT_CHUNKS = (1000, 100, 10, 1)


def insert_sql(n: int) -> str:
    """An ``n``-row INSERT with plain ``?`` placeholders, row by row: each row's id, its 6
    fields, and its size computed from them. (Numbered placeholders such as ``?1`` warn
    with a sequence of parameters on CPython 3.12.0-3.12.3, an error under ``-W error``.)"""
    size = " + ".join(f"ifnull(length(column{c}), 0)" for c in (3, 4, 5))
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * n)
    return (
        f"INSERT INTO records_all (id, {_COLUMNS}) SELECT column1, column2, column3, "
        f"column4, column5, column6, column7, {ROW_OVERHEAD} + {size} FROM (VALUES {values})"
    )


@dataclasses.dataclass(frozen=True)
class Opened:
    """A spool database `open_database()` opened and checked, and what it found."""

    conn: sqlite3.Connection
    #: Rows above the watermark, and their bytes.
    count: int
    bytes: int
    #: The highest id a row holds, and at least the watermark: new ids go above it.
    top_id: int
    #: ``meta.replayed_through``: every row at or below it is acknowledged.
    mark: int
    #: Bytes of the rows at or below the watermark still in ``records_all``.
    garbage: int
    #: True when ``quick_check`` ran and the rows were counted (False: the summary of the
    #: last clean close stood in for them).
    checked: bool
    #: The ``identity`` table's (producer id, seq reservation); None when it holds none
    #: (or not one of text and integer).
    identity: tuple[str, int] | None
    #: 1 + the highest seq a row holds, when it was looked at (0 when it was not needed).
    seq_above_rows: int
    #: The multi-row INSERTs this SQLite takes, (rows, statement), largest first.
    inserts: list[tuple[int, str]]


def unchanged_since_close(db: Path, clean: dict[str, int] | None) -> dict[str, int] | None:
    """``clean`` (the summary a clean close left), if the database file ``db`` is still
    the one it described; else None."""
    if clean is None:
        return None
    try:
        st = os.stat(db)
        wal = os.stat(f"{db}-wal").st_size
    except FileNotFoundError:
        wal = 0
    except OSError:
        return None
    if wal or (st.st_size, st.st_mtime_ns, st.st_ino) != (
        clean["size"],
        clean["mtime_ns"],
        clean["ino"],
    ):
        return None
    return clean


def open_database(
    db: Path, synchronous: str, clean: dict[str, int] | None, known_id: str | None
) -> Opened:
    """Open (or create) the spool database ``db`` and check it (see the module
    docstring). ``clean``: the summary a clean close left, if any; ``known_id``: the
    producer id ``state.json`` names when it was read whole (None: the highest seq a row
    holds is looked up, see `read_identity()`). Raises `sqlite3.Error`: a
    damaged file when `looks_corrupt()` says so."""
    clean = unchanged_since_close(db, clean)
    conn = gated_connect(db, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        # Some builds (Debian's) default to secure_delete=ON: every page a DELETE frees
        # is zeroed and written to the WAL, doubling the I/O of deleting replayed rows.
        # FAST still zeroes deleted cells where that costs no extra I/O.
        conn.execute("PRAGMA secure_delete=FAST")
        if clean is None:
            quick_check(conn)
        create_schema(conn)
        identity, seq_above_rows = read_identity(conn, known_id)
        (mark,) = conn.execute("SELECT value FROM meta WHERE name = 'replayed_through'").fetchone()
        mark = int(mark)
        if clean is not None:
            (more,) = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM records_all WHERE id > ?)", (mark,)
            ).fetchone()
            # Two cheap checks of the summary against the table; on a mismatch, everything
            # is checked and counted.
            if clean["mark"] != mark or bool(more) != (clean["count"] > 0):
                log.warning("spool %s: summary of the last close disagrees with the "
                            "table; checking the whole file", db)  # fmt: skip
                quick_check(conn)
                clean = None
        if clean is not None:
            count, total, below = clean["count"], clean["bytes"], clean["garbage"]
            (top,) = conn.execute("SELECT coalesce(max(id), 0) FROM records_all").fetchone()
        else:
            count, total, top = conn.execute(
                "SELECT count(*), coalesce(sum(size), 0), coalesce(max(id), 0) "
                "FROM records_all WHERE id > ?",
                (mark,),
            ).fetchone()
            (below,) = conn.execute(
                "SELECT coalesce(sum(size), 0) FROM records_all WHERE id <= ?", (mark,)
            ).fetchone()
        if below and not count:
            conn.execute("DELETE FROM records_all")  # all acknowledged: truncate
            below = 0
    except BaseException:
        conn.close()
        raise
    getlimit = getattr(conn, "getlimit", None)  # Python >= 3.11; else assume the old 999
    limit = getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) if getlimit else 999
    return Opened(
        conn=conn,
        count=int(count),
        bytes=int(total),
        # New ids stay above the watermark even when the table is empty.
        top_id=max(int(top), mark),
        mark=mark,
        garbage=int(below),
        checked=clean is None,
        identity=identity,
        seq_above_rows=seq_above_rows,
        inserts=[(c, insert_sql(c)) for c in INSERT_CHUNKS if 7 * c <= limit],
    )


def create_schema(conn: sqlite3.Connection) -> None:
    """The tables, the watermark and the ``records`` view, created where missing. A
    spool written by logsdk before the watermark has a table ``records``: it becomes
    ``records_all`` (a rename, no copy) and the view takes its name."""
    db = sqlite_utils.Database(conn)
    conn.execute("BEGIN IMMEDIATE")
    try:
        kind = conn.execute("SELECT type FROM sqlite_master WHERE name = 'records'").fetchone()
        if kind == ("table",):
            conn.execute("ALTER TABLE records RENAME TO records_all")
        records = db.table("records_all")
        if not records.exists():
            records.create({**_RECORD_COLUMNS, "size": int}, pk="id")
        rejected = db.table("rejected")
        if not rejected.exists():
            rejected.create(
                {**_RECORD_COLUMNS, "error": str, "at": float},
                pk="id",
            )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)"
        )
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('replayed_through', 0)")
        if kind is None or kind == ("table",):
            conn.execute(_VIEW_SQL)
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def read_identity(
    conn: sqlite3.Connection, known_id: str | None
) -> tuple[tuple[str, int] | None, int]:
    """The database's copy of the identity (read at open, so a damaged file is handled as
    any other), and, only when it is needed (no copy, or none that matches ``known_id``),
    1 + the highest seq a row holds (a scan of the table; else 0)."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS identity "
        "(producer_id TEXT NOT NULL, seq_reserved INTEGER NOT NULL)"
    )
    row = conn.execute("SELECT producer_id, seq_reserved FROM identity").fetchone()
    ok = row is not None and isinstance(row[0], str) and isinstance(row[1], int)
    above = 0
    if not ok or known_id is None or row[0] != known_id:
        (above,) = conn.execute("SELECT coalesce(max(seq) + 1, 0) FROM records_all").fetchone()
    return ((row[0], row[1]) if ok else None), int(above)


def quick_check(conn: sqlite3.Connection) -> None:
    """Raise `sqlite3.DatabaseError` unless ``PRAGMA quick_check`` says ok."""
    row = conn.execute("PRAGMA quick_check").fetchone()
    if row is None or row[0] != "ok":
        raise sqlite3.DatabaseError(f"quick_check: {row[0] if row else 'no answer'}")


def looks_corrupt(exc: sqlite3.Error) -> bool:
    """True when SQLite's error says the file is damaged."""
    text = str(exc).lower()
    return any(w in text for w in ("malformed", "not a database", "corrupt", "quick_check"))


def spool_error(text: str, exc: sqlite3.Error) -> SpoolError:
    """The SpoolError for an SQLite error: `SpoolCorruptError` when the file is damaged."""
    return SpoolCorruptError(text) if looks_corrupt(exc) else SpoolError(text)
