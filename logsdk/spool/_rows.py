"""The rows of an open spool database: what the spool holds, and how it comes and goes.

Invariants:
- a row is the durable copy of a record that Kafka has not acknowledged; it leaves the
  spool only after its acknowledgement (`Rows.delete()` by id, or
  `Rows.delete_through()` during a replay), so at any instant every accepted record
  is in Kafka, in the spool, or still in the producer's memory;
- the rows live in the table ``records_all``; ``meta.replayed_through`` is a watermark:
  a replay acknowledged every row at or below it. `Rows.delete_through()` moves the
  watermark instead of deleting rows one by one (in SQLite that cost about 1.2 µs per
  1 KiB row, a fifth of the replaying thread's time); the rows below it are removed when
  no row is left above it (one ``DELETE`` without ``WHERE``: SQLite's truncate
  optimisation, no per-row work), or by the next append once they hold 64 MiB (a quarter
  of the cap, if smaller), so that new rows reuse their pages instead of growing the
  file. The view ``records`` shows the rows above the watermark: what the spool holds,
  for anyone reading the file;
- rows are read back in insertion order (``id``), which is send order, so
  per-partition order survives spill and replay;
- while a spool is open its ids only grow, even when it empties (SQLite would restart
  at 1): the producer's replay cursor and `Rows.delete_through()` rely on it;
- every write is one transaction (`Rows.transaction()`): on an error nothing of it
  is committed, and the gauges are counted again from the table where rows may have gone;
- the gauges ``count`` and ``bytes`` are the rows above the watermark and their bytes;
  a gauge found off (below zero, or "empty" while a row is left) is counted again from
  the table, never shown negative.

Owner: the spool's (`logsdk.spool.Spool.owner`, shared), checked on every use of
the connection. ``count`` and ``bytes`` are published: written by the owner only, read by
any thread (one attribute read: a whole value, possibly one commit old).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

from logsdk._owner import Owner
from logsdk._sqlparams import blob_params
from logsdk.errors import SpoolError
from logsdk.spool._codec import Columns, ReplayRow, Row, StoredRow, columns_bytes, transpose
from logsdk.spool._database import Opened, spool_error

log = logging.getLogger("logsdk.spool")

#: Bytes of acknowledged rows below the watermark past which an append deletes them first
#: (a quarter of spool_max_bytes if that is smaller).
_GARBAGE_BYTES = 64 << 20


def id_runs(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Distinct ids as sorted runs of consecutive ids, ``(first, last)`` inclusive."""
    ordered = sorted(set(ids))
    if not ordered:
        return []
    runs: list[tuple[int, int]] = []
    lo = hi = ordered[0]
    for i in ordered[1:]:
        if i != hi + 1:
            runs.append((lo, hi))
            lo = i
        hi = i
    runs.append((lo, hi))
    return runs


class Rows:
    """The rows of one spool's open database and the connection they go through (see the
    module docstring). The spool attaches it to each database it opens
    (`attach()`) and detaches it to close it; ``committed`` is told the bytes each
    write transaction committed or freed (the spool's checkpointer)."""

    def __init__(
        self,
        owner: Owner,
        db_path: Path,
        max_bytes: int | None,
        committed: Callable[[int], None],
    ) -> None:
        self.owner = owner
        self.db_path = db_path
        self.max_bytes = max_bytes
        self.count = 0
        self.bytes = 0
        self._committed = committed
        self._conn: sqlite3.Connection | None = None
        self._chunks: list[tuple[int, str]] = []
        self._top_id = 0  # the highest id this spool has held since it was opened
        self._replayed_through = 0  # meta.replayed_through: every row <= it is acknowledged
        self._garbage = 0  # bytes of the rows <= the watermark still in records_all
        self._gauges_exact = True  # count/bytes match the table (a failed recount: not)
        self._recounted_from = -1  # the count recount_if_off() last found to be off

    def attach(self, opened: Opened) -> None:
        """Go on with the database just opened: its connection, and the gauges, ids and
        watermark the open found."""
        self._conn = opened.conn
        self.count, self.bytes = opened.count, opened.bytes
        self._top_id = opened.top_id
        self._replayed_through, self._garbage = opened.mark, opened.garbage
        self._chunks = opened.inserts
        self._gauges_exact = True
        self._recounted_from = -1

    def detach(self) -> sqlite3.Connection | None:
        """The connection, for the spool to close; no row is read or written after this
        (until `attach()`)."""
        conn, self._conn = self._conn, None
        return conn

    @property
    def garbage(self) -> int:
        """Bytes of the rows at or below the watermark still in ``records_all``."""
        return self._garbage

    @property
    def mark(self) -> int:
        """The watermark: every row at or below it is acknowledged."""
        return self._replayed_through

    @property
    def gauges_exact(self) -> bool:
        """False after a recount failed: ``count`` and ``bytes`` may be off."""
        return self._gauges_exact

    @property
    def conn(self) -> sqlite3.Connection:
        """The spool's SQLite connection: its owner's only (checked, see `owner`)."""
        self.owner.check("use the spool's SQLite connection")
        if self._conn is None:
            raise SpoolError("the spool is closed")
        return self._conn

    @property
    def top_id(self) -> int:
        """The highest row id this spool has held: every row written later has a higher
        one."""
        return self._top_id

    def room(self) -> int | None:
        """Bytes left under ``max_bytes`` (None: no cap)."""
        return None if self.max_bytes is None else max(0, self.max_bytes - self.bytes)

    @contextlib.contextmanager
    def transaction(self, what: str, recount: bool = False) -> Iterator[sqlite3.Connection]:
        """``BEGIN`` ... ``COMMIT`` on the spool's connection. On an SQLite error: roll
        back, recount the gauges from the table when asked (rows may have gone meanwhile),
        and raise `SpoolError` ("spool <what> failed")."""
        conn = self.conn
        if conn.in_transaction:
            # An earlier ROLLBACK failed (SQLite left the transaction open): every BEGIN
            # would fail from now on. Undo it first, so one bad write does not end the spool.
            log.warning("spool %s: a transaction was left open; rolling it back", self.db_path)
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise SpoolError(
                    f"spool {what} failed: cannot end an open transaction: {exc}"
                ) from exc
            self._recount()
        try:
            conn.execute("BEGIN")
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if recount:
                self._recount()
            raise spool_error(f"spool {what} failed: {exc}", exc) from exc
        except BaseException:  # not SQLite's (a bad parameter, an interrupt): still undone
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def append(self, rows: Sequence[Row]) -> None:
        """Commit ``rows`` in one transaction; on error nothing is committed. Each row's
        ``size`` column is computed by SQLite from the row itself."""
        self.append_columns(transpose(rows))

    def append_columns(self, cols: Columns, total_bytes: int | None = None) -> None:
        """`append()` of rows already transposed (`transpose()`); ``total_bytes``
        is their `columns_bytes()`, if the caller has it."""
        topics, keys, values, headers, tss, seqs = cols
        n = len(topics)
        if not n:
            return
        garbage = self._garbage
        with self.transaction("write") as conn:
            if garbage and garbage >= self._garbage_limit():
                # Free the acknowledged rows' pages for these to reuse (see the docstring).
                conn.execute("DELETE FROM records_all WHERE id <= ?", (self._replayed_through,))
                garbage = 0
            # Many rows per statement: one sqlite3_step (the GIL released) inserts them
            # all, where executemany releases and re-takes the GIL per row (a sender
            # thread then holds it up to a switch interval each time); the parameters are
            # the rows' ids and fields, row by row, interleaved in C (zip, then flattened;
            # blobs as blob_params). Ids are given, from the highest this spool has held:
            # SQLite would number an emptied table from 1 again, under ids the producer has
            # already replayed and deleted (its replay cursor is past them).
            blobs = [blob_params(keys), blob_params(values), blob_params(headers)]
            top = self._top_id
            i = 0
            for size, sql in self._chunks:
                while n - i >= size:
                    j = i + size
                    params = list(
                        chain.from_iterable(
                            zip(
                                range(top + 1, top + 1 + size),
                                topics[i:j],
                                blobs[0][i:j],
                                blobs[1][i:j],
                                blobs[2][i:j],
                                tss[i:j],
                                seqs[i:j],
                                strict=True,
                            )
                        )
                    )
                    conn.execute(sql, params)
                    i = j
                    top += size
        added = columns_bytes(cols) if total_bytes is None else total_bytes
        self.count += n
        self.bytes += added
        self._top_id = top
        self._garbage = garbage
        self._committed(added)

    def read_after(self, after_id: int, limit: int) -> list[StoredRow]:
        """Up to ``limit`` rows with id > ``after_id``, oldest first."""
        return self._read("id, topic, key, value, headers, ts, seq, size", after_id, limit)

    def read_replay(self, after_id: int, limit: int) -> list[ReplayRow]:
        """As `read_after()` without the ``size`` column, which a replay never uses
        (one Python int less to build per row: about 15% of the read's cost), and with
        ``seq`` as the bytes of its ``logsdk.seq`` header (SQLite formats it in C)."""
        return self._read("id, topic, key, value, headers, ts, CAST(seq AS BLOB)", after_id, limit)

    def _read(self, columns: str, after_id: int, limit: int) -> list[Any]:
        try:
            cur = self.conn.execute(
                f"SELECT {columns} FROM records_all WHERE id > ? ORDER BY id LIMIT ?",
                (max(after_id, self._replayed_through), limit),
            )
            return cur.fetchall()
        except sqlite3.Error as exc:
            raise spool_error(f"spool read failed: {exc}", exc) from exc

    def delete(self, ids: Iterable[int], freed_bytes: int | None = None) -> int:
        """Delete acknowledged rows; ``freed_bytes`` (their sizes, if known) saves a query.
        Returns how many rows left the spool (ids already gone, dropped by ``when_full``
        meanwhile, are not counted).

        The ids are deleted as runs of consecutive ids, one ``BETWEEN`` per run: replayed
        rows are read in id order, so the acknowledged ones are mostly a few long runs.
        """
        runs = id_runs(ids)
        if not runs:
            return 0
        n = sum(hi - lo + 1 for lo, hi in runs)
        conn = self.conn
        before = conn.total_changes
        with self.transaction("delete", recount=True):
            if freed_bytes is None:
                freed = 0
                for lo, hi in runs:
                    (size,) = conn.execute(
                        "SELECT coalesce(sum(size), 0) FROM records_all "
                        "WHERE id BETWEEN ? AND ? AND id > ?",
                        (lo, hi, self._replayed_through),
                    ).fetchone()
                    freed += int(size)
                freed_bytes = freed
            conn.executemany(
                "DELETE FROM records_all WHERE id BETWEEN ? AND ? AND id > ?",
                [(lo, hi, self._replayed_through) for lo, hi in runs],
            )
        deleted = conn.total_changes - before
        if deleted != n:
            self._recount()  # some rows were already gone (dropped by policy): recount
        else:
            self._take_off(n, freed_bytes)
        self._committed(freed_bytes)
        return deleted

    def delete_through(self, last_id: int) -> int:
        """Every row with id <= ``last_id`` is acknowledged: they leave the spool; returns
        how many did.

        One watermark for the lot (replayed rows are acknowledged per partition, so the
        acknowledged ids of a batch are thousands of short runs), moved in one transaction
        with the rows' count and bytes; the rows themselves go when nothing is left above
        it (a truncate) or once they hold enough bytes (see the module docstring).
        """
        mark = self._replayed_through
        if last_id <= mark:
            return 0
        garbage = self._garbage
        with self.transaction("delete", recount=True) as conn:
            n, freed = conn.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM records_all WHERE id > ? AND id <= ?",
                (mark, last_id),
            ).fetchone()
            conn.execute("UPDATE meta SET value = ? WHERE name = 'replayed_through'", (last_id,))
            garbage += int(freed)
            more = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM records_all WHERE id > ?)", (last_id,)
            ).fetchone()[0]
            if not more:
                conn.execute("DELETE FROM records_all")  # truncate optimisation: no row work
                garbage = 0
        self._replayed_through, self._garbage = last_id, garbage
        self._take_off(int(n), int(freed))
        self._committed(int(freed))
        return int(n)

    def _take_off(self, rows: int, nbytes: int) -> None:
        """Rows left the spool: lower the gauges. Below zero they were off (a bug): they
        are counted again from the table, and never shown negative."""
        self.count -= rows
        self.bytes -= nbytes
        if self.count < 0 or self.bytes < 0:
            log.error(
                "spool %s: gauges went below zero (%d rows, %d bytes); counted again",
                self.db_path,
                self.count,
                self.bytes,
            )
            self._recount()
            self.count, self.bytes = max(0, self.count), max(0, self.bytes)

    def holds_rows(self) -> bool:
        """True when a row is left above the watermark, asked of the table itself (not of
        the gauges): the producer asks before it calls a replay done. If the gauges said
        none, they are counted again."""
        try:
            (more,) = self.conn.execute(
                "SELECT EXISTS (SELECT 1 FROM records_all WHERE id > ?)",
                (self._replayed_through,),
            ).fetchone()
        except sqlite3.Error as exc:
            raise spool_error(f"spool read failed: {exc}", exc) from exc
        if more and self.count == 0:
            log.error("spool %s: gauges said empty while rows remain; counted again", self.db_path)
            self._recount()
        return bool(more)

    def _garbage_limit(self) -> int:
        cap = self.max_bytes
        return _GARBAGE_BYTES if cap is None else min(_GARBAGE_BYTES, cap // 4)

    def drop_oldest(self, need_bytes: int, after_id: int = 0) -> int:
        """Delete the oldest rows with id > ``after_id`` until ``need_bytes`` are free.

        Rows up to ``after_id`` are being replayed (or are already acknowledged): they
        are not the policy's to drop. Returns the number of rows dropped.
        """
        dropped = freed = 0
        after_id = max(after_id, self._replayed_through)
        last = after_id
        with self.transaction("drop", recount=True) as conn:
            # Walk (id, size) lazily, oldest first, to the last row to drop; then one
            # range DELETE. Never the whole spool in memory.
            cur = conn.execute(
                "SELECT id, size FROM records_all WHERE id > ? ORDER BY id", (after_id,)
            )
            while freed < need_bytes:
                chunk = cur.fetchmany(1000)
                if not chunk:
                    break
                for rid, size in chunk:
                    last = rid
                    dropped += 1
                    freed += int(size)
                    if freed >= need_bytes:
                        break
            cur.close()
            if dropped:
                conn.execute("DELETE FROM records_all WHERE id > ? AND id <= ?", (after_id, last))
        self._take_off(dropped, freed)
        self._committed(freed)
        return dropped

    def move_to_rejected(self, pairs: Sequence[tuple[int, str]]) -> None:
        """Move rows (id, error) from ``records`` to ``rejected``: Kafka refused them."""
        now = time.time()
        try:
            with self.transaction("write") as conn:
                for rid, err in pairs:
                    conn.execute(
                        "INSERT INTO rejected (topic, key, value, headers, ts, seq, error, at) "
                        "SELECT topic, key, value, headers, ts, seq, ?, ? FROM records_all "
                        "WHERE id = ? AND id > ?",
                        (err, now, rid, self._replayed_through),
                    )
                    conn.execute(
                        "DELETE FROM records_all WHERE id = ? AND id > ?",
                        (rid, self._replayed_through),
                    )
        finally:
            self._recount()

    def reject(self, rows: Sequence[tuple[Row, str]]) -> None:
        """Set records aside in the ``rejected`` table: bad data kept for inspection."""
        now = time.time()
        with self.transaction("write") as conn:
            conn.executemany(
                "INSERT INTO rejected (topic, key, value, headers, ts, seq, error, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(*r, err, now) for r, err in rows],
            )

    def rejected_count(self) -> int:
        """Rows set aside as rejected (bad data), kept for inspection."""
        return int(self.conn.execute("SELECT count(*) FROM rejected").fetchone()[0])

    def recount_if_off(self) -> None:
        """Called when no row is left to replay: set the gauges from the table if they say
        otherwise, and say so (once per wrong count)."""
        if self.count == 0 or self.count == self._recounted_from:
            return
        before = (self.count, self.bytes)
        self._recounted_from = self.count
        self._recount()
        if (self.count, self.bytes) != before:
            log.warning(
                "spool %s: gauges said %d rows (%d bytes), the table holds %d (%d); recounted",
                self.db_path, *before, self.count, self.bytes,
            )  # fmt: skip

    def _recount(self) -> None:
        self._gauges_exact = False  # until the count below succeeds
        with contextlib.suppress(sqlite3.Error):
            c, b = self.conn.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM records_all WHERE id > ?",
                (self._replayed_through,),
            ).fetchone()
            self.count, self.bytes = int(c), int(b)
            self._gauges_exact = True
