"""Salvage: a damaged spool database set aside, and every row that can still be read
copied into a fresh one.

Invariants:
- the damaged file is never written and never deleted: it is renamed (with its ``-wal``
  and ``-shm``) to ``spool.db.corrupt-<time>-<random>`` beside the new one
  (`move_aside()`), read read-only (`logsdk.spool._readonly`), and left there
  for inspection (``logsdk spool status`` names it);
- every row copied keeps its id, and the watermark (``meta.replayed_through``) is copied
  too, so a replay in progress goes on over the same ids and no acknowledged row comes
  back;
- an id range that cannot be read is skipped, not guessed at: it is reported
  (`Salvage.unreadable`), and the rows past it are copied as any other.

Owner: none (functions). Called by the spool's owner, on the new database's connection,
before anything else uses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
import time
import uuid
from pathlib import Path

from logsdk.spool import _readonly
from logsdk.spool._codec import row_size

log = logging.getLogger("logsdk.spool")


def move_aside(db: Path) -> Path:
    """Rename the database ``db`` and its ``-wal`` and ``-shm`` (those that exist) to a
    new ``<name>.corrupt-*`` beside it; the new path of the database."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = db.with_name(f"{db.name}.corrupt-{stamp}-{uuid.uuid4().hex[:6]}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{db}{suffix}")
        if src.exists():
            os.replace(src, f"{target}{suffix}")
    return target


@dataclasses.dataclass
class Salvage:
    """What `salvage()` read from a damaged database."""

    rows: int = 0
    rejected: int = 0
    #: Id ranges (first, last) that could not be read (rows may or may not have been there).
    unreadable: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    @property
    def unreadable_ids(self) -> int:
        return sum(b - a + 1 for a, b in self.unreadable)

    def __str__(self) -> str:
        """What became of the rows, as the spool's log line says it."""
        text = f"{self.rows} row(s) read from it into a fresh spool and delivered as usual"
        if self.unreadable:
            lost = ", ".join(f"{a}-{b}" for a, b in self.unreadable[:10])
            more = " ..." if len(self.unreadable) > 10 else ""
            text += (
                f"; rows with ids {lost}{more} ({self.unreadable_ids} id(s)) could not be "
                "read and stay in that file"
            )
        return text


#: Rows read (and written) at a time by a salvage.
SALVAGE_BATCH = 1000


def salvage(src: Path, dst: sqlite3.Connection) -> Salvage:
    """Copy every row of the damaged spool database ``src`` that can still be read into
    ``dst`` (a fresh spool's connection), with its id, and the watermark; then the
    rejected rows, if their table can be read whole.

    Rows are read in id order, a batch at a time; where a read fails (a damaged page), the
    next id from which reading works is found by probing ever further ahead, then
    bisecting back, and the ids skipped are noted as unreadable. Nothing of ``src`` is
    written: it is opened read-only (`logsdk.spool._readonly`, by the URI of its
    absolute path), and stays where it is for inspection."""
    out = Salvage()
    ids = _readonly.file_ids(src)
    # A WAL that holds commits is read through (mode=ro, which makes a missing -shm: the
    # rows are worth that file); otherwise the file is read as it is, making no file.
    immutable = ids[1] is None or ids[1][1] == 0
    with contextlib.ExitStack() as stack:
        try:
            conn = stack.enter_context(_readonly.connect(src, immutable=immutable))
        except sqlite3.Error as exc:
            log.error("spool %s: cannot open it to salvage rows: %s", src, exc)
            return out
        try:
            (mark,) = conn.execute(
                "SELECT value FROM meta WHERE name = 'replayed_through'"
            ).fetchone()
            mark = int(mark)
        except (sqlite3.Error, TypeError, ValueError):
            mark = 0
        dst.execute("UPDATE meta SET value = ? WHERE name = 'replayed_through'", (mark,))
        after, limit = mark, SALVAGE_BATCH
        while True:
            try:
                rows = conn.execute(
                    "SELECT id, topic, key, value, headers, ts, seq FROM records_all "
                    "WHERE id > ? ORDER BY id LIMIT ?",
                    (after, limit),
                ).fetchall()
            except sqlite3.Error:
                if limit > 1:  # a row of this batch is unreadable: go on one row at a time
                    limit = 1
                    continue
                # The very next row cannot be read: skip to where reading works again.
                resume = _next_readable(conn, after)
                if resume is None:  # nothing readable above: up to the last id, if known
                    try:
                        (top,) = conn.execute("SELECT max(id) FROM records_all").fetchone()
                    except sqlite3.Error:
                        top = None
                    out.unreadable.append((after + 1, max(after + 1, int(top or 0))))
                    break
                out.unreadable.append((after + 1, resume))
                after = resume
                continue
            if not rows:
                break
            dst.execute("BEGIN")
            dst.executemany(
                "INSERT INTO records_all (id, topic, key, value, headers, ts, seq, size) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(*r, row_size(r[1:])) for r in rows],
            )
            dst.execute("COMMIT")
            out.rows += len(rows)
            after = rows[-1][0]
            if len(rows) < limit:
                break
            if limit < SALVAGE_BATCH:  # past the damage: batches again, growing back
                limit = min(SALVAGE_BATCH, limit * 2)
        try:
            rejected = conn.execute(
                "SELECT topic, key, value, headers, ts, seq, error, at FROM rejected"
            ).fetchall()
        except sqlite3.Error as exc:
            log.error("spool %s: its rejected rows cannot be read (%s); left there", src, exc)
        else:
            dst.execute("BEGIN")
            dst.executemany(
                "INSERT INTO rejected (topic, key, value, headers, ts, seq, error, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rejected,
            )
            dst.execute("COMMIT")
            out.rejected = len(rejected)
    return out


def _next_readable(conn: sqlite3.Connection, after: int) -> int | None:
    """A read of the rows above ``after`` failed: the smallest ``p > after`` found from
    which a read works (rows above ``p`` can be read, or there are none), or None when
    none works below 2^62."""

    def works(p: int) -> bool:
        try:
            conn.execute(
                "SELECT id FROM records_all WHERE id > ? ORDER BY id LIMIT 1", (p,)
            ).fetchall()
        except sqlite3.Error:
            return False
        return True

    lo, step, hi = after, 1, None
    while step < 1 << 62:
        if works(after + step):
            hi = after + step
            break
        lo = after + step
        step *= 2
    if hi is None:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if works(mid):
            hi = mid
        else:
            lo = mid
    return hi
