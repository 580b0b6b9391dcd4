"""The on-disk spool: SQLite in WAL mode, one database per producer directory.

Invariants:
- a row is the durable copy of a record that Kafka has not acknowledged; it leaves the
  spool only after its acknowledgement (:meth:`Spool.delete` by id, or
  :meth:`Spool.delete_through` during a replay), so at any instant every accepted record
  is in Kafka, in the spool, or still in the producer's memory;
- the rows live in the table ``records_all``; ``meta.replayed_through`` is a watermark:
  a replay acknowledged every row at or below it. :meth:`Spool.delete_through` moves the
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
  at 1): the producer's replay cursor and :meth:`Spool.delete_through` rely on it;
- one live producer per directory (an exclusive ``flock`` on ``LOCK``:
  :mod:`logsdk.spool._dirlock`);
- the producer id and the sequence high-water mark live in ``state.json``
  beside the database (:mod:`logsdk.spool._state`), so they survive a corrupt database
  being moved aside;
- ``PRAGMA quick_check`` and the scans that count the rows and their bytes read the whole
  file (about 0.2 s for 270 MB, measured): an open runs them unless ``state.json`` holds
  the summary a clean :meth:`Spool.close` left (``closed``: the gauges, and the database
  file's size, mtime and inode, with no WAL beside it) and the file still matches it (and
  a row above the watermark exists exactly when the summary counts one). An
  open removes that summary (written, fsynced) before the database is touched, so a
  crash, a write by anything else, or a failed close always leads to a full check;
- WAL checkpoints run on a thread of their own (:mod:`logsdk.spool._checkpoint`), not
  inside the commits of the thread that writes (the producer's pump).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

from logsdk._owner import Owner
from logsdk._sqlparams import blob_params
from logsdk.errors import ConfigError, SpoolError
from logsdk.spool._checkpoint import Checkpointer
from logsdk.spool._codec import (
    Columns,
    ReplayRow,
    Row,
    StoredRow,
    columns_bytes,
    transpose,
)
from logsdk.spool._database import (
    DB_NAME,
    SYNCHRONOUS,
    Opened,
    looks_corrupt,
    open_database,
    spool_error,
)
from logsdk.spool._dirlock import DirLock, check_private
from logsdk.spool._salvage import move_aside, salvage
from logsdk.spool._state import STATE_NAME, read_state, summary_of, write_state

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


class Spool:
    """A durable FIFO of records for one producer directory.

    Not thread-safe, and owned by one thread (:attr:`owner`): the thread that opens it,
    until it hands it on (a producer's constructor hands it to the pump thread, and
    ``close()`` takes it back once the pump has ended). Every use of its SQLite connection
    is checked against the owner while ownership is checked (:mod:`logsdk._owner`). The
    gauges ``count`` and ``bytes`` are written by the owner only and may be read by any
    thread (one attribute read: a whole value, possibly one commit old).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        max_bytes: int | None = None,
    ) -> None:
        sync = synchronous.upper()
        if sync not in SYNCHRONOUS:
            raise ConfigError(
                f"spool synchronous must be one of {SYNCHRONOUS}, got {synchronous!r}"
            )
        if max_bytes is not None and max_bytes <= 0:
            raise ConfigError(f"spool_max_bytes must be > 0 or None, got {max_bytes!r}")
        self.directory = Path(directory)
        self.owner = Owner(f"spool {self.directory}")
        self.synchronous = sync
        self.max_bytes = max_bytes
        self.count = 0
        self.bytes = 0
        self.corrupt_files_moved = 0
        #: Ids in ranges of a damaged database that could not be read (see rebuild()).
        self.unreadable_ids = 0
        self._lock: DirLock | None = None
        self._conn: sqlite3.Connection | None = None
        self._state: dict[str, Any] = {}
        self._chunks: list[tuple[int, str]] = []
        self._top_id = 0  # the highest id this spool has held since it was opened
        self._replayed_through = 0  # meta.replayed_through: every row <= it is acknowledged
        self._garbage = 0  # bytes of the rows <= the watermark still in records_all
        self._checkpointer: Checkpointer | None = None
        self._clean: dict[str, int] | None = None  # the summary a clean close left
        self._state_trusted = False  # state.json was read whole at open
        self._db_identity: tuple[str, int] | None = None  # the database's copy of the id
        self._seq_above_rows = 0  # 1 + the highest seq a row holds, when it was looked at
        self.checked_at_open = True  # False: the summary stood in for quick_check
        self._gauges_exact = True  # count/bytes match the table (a failed recount: not)
        self._recounted_from = -1  # the count recount_if_off() last found to be off

    # -- open / close --------------------------------------------------------------------

    def open(self) -> Spool:
        """Take the directory lock, open (or re-create) the database, load the state."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # holds log data
        except OSError as exc:
            raise SpoolError(f"cannot create spool dir {self.directory}: {exc}") from exc
        check_private(self.directory, directory=True)
        self._lock = DirLock.take(self.directory)
        try:
            try:
                self._load_state()
            except OSError as exc:
                raise SpoolError(
                    f"spool state {self.directory / STATE_NAME} cannot be written: {exc}"
                ) from exc
            self._conn = self._open_db()
            self._reconcile_identity()
        except BaseException:
            self._release_lock()
            raise
        self._start_checkpointer()
        return self

    def _start_checkpointer(self) -> None:
        """Move WAL checkpoints to their own thread; without one, SQLite's own remain."""
        self._checkpointer = Checkpointer.start(self.db_path, self.synchronous, self.conn)

    def _committed(self, nbytes: int) -> None:
        """A write transaction committed about ``nbytes``: the checkpointer decides when
        to checkpoint."""
        if self._checkpointer is not None:
            self._checkpointer.committed(nbytes)

    def close(self) -> None:
        """Checkpoint and close the database and release the directory lock."""
        self.owner.check("close the spool")
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        if self._conn is not None:
            checkpointed = False
            with contextlib.suppress(sqlite3.Error):
                busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                checkpointed = busy == 0
            self._conn.close()
            self._conn = None
            if checkpointed and self._gauges_exact:
                self._leave_summary()
        self._release_lock()

    def _leave_summary(self) -> None:
        """Write the gauges and the file's identity to ``state.json`` (still under the
        directory lock), so the next open can skip the full-file checks."""
        try:
            if os.path.exists(f"{self.db_path}-wal"):
                return  # SQLite removes it when the last connection closes cleanly
            st = os.stat(self.db_path)
            self._state["closed"] = {
                "count": self.count,
                "bytes": self.bytes,
                "garbage": self._garbage,
                "mark": self._replayed_through,
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "ino": st.st_ino,
            }
            self._write_state()
        except OSError as exc:
            self._state.pop("closed", None)
            log.warning("spool %s: no summary left at close (%s); the next open checks the "
                        "whole file", self.db_path, exc)  # fmt: skip

    @property
    def db_path(self) -> Path:
        """Path of the SQLite database."""
        return self.directory / DB_NAME

    def _release_lock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def _open_db(self) -> sqlite3.Connection:
        for suffix in ("", "-wal", "-shm"):
            check_private(Path(f"{self.db_path}{suffix}"), missing_ok=True)
        try:
            return self._use(self._connect_and_check())
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and not looks_corrupt(exc):
                raise SpoolError(f"cannot open spool {self.db_path}: {exc}") from exc
            return self._set_aside_and_salvage(str(exc))

    def _set_aside_and_salvage(self, why: str) -> sqlite3.Connection:
        """The database is damaged: move it aside (kept, named ``spool.db.corrupt-*``),
        start a fresh one, and copy into it every row that can still be read, under its
        own id (a replay in progress goes on over the same ids). Returns the connection."""
        moved = move_aside(self.db_path)
        self.corrupt_files_moved += 1
        self._clean = None
        try:
            conn = self._connect_and_check().conn
            try:
                found = salvage(moved, conn)
            finally:
                conn.close()
            opened = self._connect_and_check()  # the gauges, ids and seqs of what it holds now
        except sqlite3.Error as exc:
            raise SpoolError(f"cannot create a fresh spool {self.db_path}: {exc}") from exc
        self.unreadable_ids += found.unreadable_ids
        log.error("spool %s is damaged (%s): set aside as %s; %s", self.db_path, why,
                  moved.name, found)  # fmt: skip
        return self._use(opened)

    def rebuild(self, why: str) -> None:
        """The open database was found damaged (a read or write said so): set it aside and
        go on with a fresh one holding every row that can still be read, under the same
        ids (see :meth:`_set_aside_and_salvage`). Owner only; raises :class:`SpoolError`
        when even a fresh database cannot be made."""
        self.owner.check("rebuild the spool")
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        self._conn = self._set_aside_and_salvage(why)
        self._gauges_exact = True
        self._recounted_from = -1
        self._reconcile_identity()
        self._start_checkpointer()

    def _connect_and_check(self) -> Opened:
        """Open the database and check it (:func:`~logsdk.spool._database.open_database`),
        with the summary of the last clean close, once."""
        clean, self._clean = self._clean, None
        known = self.producer_id if self._state_trusted else None
        return open_database(self.db_path, self.synchronous, clean, known)

    def _use(self, opened: Opened) -> sqlite3.Connection:
        """Take on what the open found in the database; its connection."""
        self.checked_at_open = opened.checked
        self._db_identity, self._seq_above_rows = opened.identity, opened.seq_above_rows
        self.count, self.bytes = opened.count, opened.bytes
        self._top_id = opened.top_id
        self._replayed_through, self._garbage = opened.mark, opened.garbage
        self._chunks = opened.inserts
        return opened.conn

    # -- state (producer id, sequence high-water) -----------------------------------------

    def _load_state(self) -> None:
        path = self.directory / STATE_NAME
        found = read_state(self.directory)
        self._state_trusted = found.state is not None
        if found.state is not None:
            self._state = found.state
        elif found.found in ("link", "directory"):
            raise SpoolError(f"spool state {path} is a symbolic link or a directory: remove it")
        elif found.found == "unreadable":
            raise SpoolError(f"spool state {path} cannot be used: {found.problem}")
        else:
            if found.found == "malformed":
                # The database keeps a copy of the identity (_reconcile_identity): this
                # fresh one stands only if it holds none.
                log.error("spool state %s unreadable (%s); taking the identity from the "
                          "database", path, found.problem)  # fmt: skip
            self._state = {"producer_id": uuid.uuid4().hex, "seq_reserved": 0}
            self._write_state()
        clean = self._state.pop("closed", None)
        if clean is None:
            return
        # Gone from the file before the database is opened: only the close that follows
        # this open may leave a summary again. Not removed: not used either (a full check).
        try:
            self._write_state()
        except OSError as exc:
            log.warning("spool state %s not rewritten (%s); checking the whole file", path, exc)
            return
        self._clean = summary_of(clean)

    def _reconcile_identity(self) -> None:
        """The producer id and seq reservation live twice: in ``state.json`` (which survives
        a corrupt database moved aside) and in the database's ``identity`` table (which
        survives a lost or damaged ``state.json``). Rows keep the id they were sent under:
        when the two disagree and the spool holds rows, the database's id stands. The
        reservation is the highest of both and of every seq a row holds, so a seq once
        used is never used again under the same id."""
        state_id, state_seq = self.producer_id, self.seq_reserved
        reserved = max(state_seq, self._seq_above_rows)
        db = self._db_identity
        if db is not None:
            db_id, db_seq = db
            if db_id != state_id and (not self._state_trusted or self.count > 0):
                if self._state_trusted:
                    log.warning(
                        "spool %s: state.json names producer %s, the database %s; "
                        "its rows keep theirs",
                        self.directory,
                        state_id,
                        db_id,
                    )
                self._state["producer_id"] = db_id
                reserved = max(db_seq, self._seq_above_rows)
            elif db_id == state_id:
                reserved = max(reserved, db_seq)
        elif not self._state_trusted and self.count:
            log.error("spool %s: the producer id of its %d row(s) is lost; they are sent "
                      "under the new id %s, whose seqs start above theirs",
                      self.directory, self.count, state_id)  # fmt: skip
        if db != (self.producer_id, reserved) or state_seq != reserved or not self._state_trusted:
            self.reserve_seq(reserved)

    def _write_state(self) -> None:
        write_state(self.directory, self._state)

    @property
    def producer_id(self) -> str:
        """The stable id of the producer that owns this directory."""
        return str(self._state["producer_id"])

    @property
    def seq_reserved(self) -> int:
        """Sequence numbers below this may have been used; a restart starts here."""
        value = self._state.get("seq_reserved", 0)
        return value if isinstance(value, int) else 0

    def reserve_seq(self, upto: int) -> None:
        """Persist, in the database and in ``state.json``, that sequence numbers up to
        ``upto`` may be used. Raises :class:`SpoolError` if either write fails: no seq of
        the reservation may be used then."""
        with self._transaction("seq reservation"):
            self.conn.execute("DELETE FROM identity")
            self.conn.execute(
                "INSERT INTO identity VALUES (?, ?)", (self._state["producer_id"], upto)
            )
        self._state["seq_reserved"] = upto
        try:
            self._write_state()
        except OSError as exc:
            raise SpoolError(f"cannot persist the sequence number: {exc}") from exc

    # -- records ---------------------------------------------------------------------------

    @property
    def conn(self) -> sqlite3.Connection:
        """The spool's SQLite connection: its owner's only (checked, see :attr:`owner`)."""
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
    def _transaction(self, what: str, recount: bool = False) -> Iterator[sqlite3.Connection]:
        """``BEGIN`` ... ``COMMIT`` on the spool's connection. On an SQLite error: roll
        back, recount the gauges from the table when asked (rows may have gone meanwhile),
        and raise :class:`SpoolError` ("spool <what> failed")."""
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
        """:meth:`append` of rows already transposed (:func:`transpose`); ``total_bytes``
        is their :func:`columns_bytes`, if the caller has it."""
        topics, keys, values, headers, tss, seqs = cols
        n = len(topics)
        if not n:
            return
        garbage = self._garbage
        with self._transaction("write") as conn:
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
        """As :meth:`read_after` without the ``size`` column, which a replay never uses
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
        with self._transaction("delete", recount=True):
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
        with self._transaction("delete", recount=True) as conn:
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
        with self._transaction("drop", recount=True) as conn:
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
            with self._transaction("write") as conn:
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
        with self._transaction("write") as conn:
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
