"""The on-disk spool: SQLite in WAL mode, one database per producer directory.

`Spool` is what a producer holds: it opens a slot's directory and composes its
parts, one idea each, in modules of their own:

- the directory: one live producer per directory, an exclusive ``flock`` on ``LOCK``, and
  only this user's files in it (`logsdk.spool._dirlock`);
- the identity: the producer id and the seq reservation, in ``state.json``
  (`logsdk.spool._state`), which survives a corrupt database moved aside, and in the
  database's ``identity`` table, which survives a lost or damaged ``state.json``; the two
  are reconciled at every open (`Spool._reconcile_identity()`);
- the database file: its schema and the checks an open makes
  (`logsdk.spool._database`); a damaged one set aside and what can be read of it
  copied into a fresh one (`logsdk.spool._salvage`); its WAL checkpoints, on a
  thread of their own (`logsdk.spool._checkpoint`), not inside the commits of the
  thread that writes (the producer's pump);
- the rows, their watermark and their gauges (`logsdk.spool._rows`), which the spool
  offers under its own name (``append``, ``read_replay``, ``delete_through``, ...).

Invariants held here:
- ``PRAGMA quick_check`` and the scans that count the rows and their bytes read the whole
  file (about 0.2 s for 270 MB, measured): an open runs them unless ``state.json`` holds
  the summary a clean `Spool.close()` left (``closed``: the gauges, and the database
  file's size, mtime and inode, with no WAL beside it) and the file still matches it (and
  a row above the watermark exists exactly when the summary counts one). An open removes
  that summary (written, fsynced) before the database is touched, so a crash, a write by
  anything else, or a failed close always leads to a full check; a close leaves one only
  after a checkpoint that emptied the WAL, with gauges known to be exact;
- a seq once reserved is never used again under the same producer id: the reservation
  is written to the database first, then to ``state.json`` (`Spool.reserve_seq()`),
  and an open takes the highest of both and of every seq a row holds.

Owner: see `Spool`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from logsdk._owner import Owner
from logsdk.errors import ConfigError, SpoolError
from logsdk.spool._checkpoint import Checkpointer
from logsdk.spool._codec import (
    Columns,
    ReplayRow,
    Row,
    StoredRow,
)
from logsdk.spool._database import (
    DB_NAME,
    SYNCHRONOUS,
    Opened,
    looks_corrupt,
    open_database,
)
from logsdk.spool._dirlock import DirLock, check_private
from logsdk.spool._rows import Rows
from logsdk.spool._salvage import move_aside, salvage
from logsdk.spool._state import STATE_NAME, read_state, summary_of, write_state

log = logging.getLogger("logsdk.spool")


class Spool:
    """A durable FIFO of records for one producer directory.

    Not thread-safe, and owned by one thread (`owner`): the thread that opens it,
    until it hands it on (a producer's constructor hands it to the pump thread, and
    ``close()`` takes it back once the pump has ended). Its parts have the same owner:
    `rows` (the rows, their gauges and the SQLite connection), the directory lock,
    and the checkpointer's requests (its thread has a connection of its own). Every use of
    the SQLite connection is checked against the owner while ownership is checked
    (`logsdk._owner`). The gauges ``count`` and ``bytes`` are written by the owner
    only and may be read by any thread (one attribute read: a whole value, possibly one
    commit old).
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
        self.rows = Rows(self.owner, self.db_path, max_bytes, self._committed)
        self.corrupt_files_moved = 0
        #: Ids in ranges of a damaged database that could not be read (see rebuild()).
        self.unreadable_ids = 0
        self._lock: DirLock | None = None
        self._state: dict[str, Any] = {}
        self._checkpointer: Checkpointer | None = None
        self._clean: dict[str, int] | None = None  # the summary a clean close left
        self._state_trusted = False  # state.json was read whole at open
        self._db_identity: tuple[str, int] | None = None  # the database's copy of the id
        self._seq_above_rows = 0  # 1 + the highest seq a row holds, when it was looked at
        self.checked_at_open = True  # False: the summary stood in for quick_check

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
            self._use(self._open_db())
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
        conn = self.rows.detach()
        if conn is not None:
            checkpointed = False
            with contextlib.suppress(sqlite3.Error):
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                checkpointed = busy == 0
            conn.close()
            if checkpointed and self.rows.gauges_exact:
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
                "garbage": self.rows.garbage,
                "mark": self.rows.mark,
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

    def _open_db(self) -> Opened:
        for suffix in ("", "-wal", "-shm"):
            check_private(Path(f"{self.db_path}{suffix}"), missing_ok=True)
        try:
            return self._connect_and_check()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and not looks_corrupt(exc):
                raise SpoolError(f"cannot open spool {self.db_path}: {exc}") from exc
            return self._set_aside_and_salvage(str(exc))

    def _set_aside_and_salvage(self, why: str) -> Opened:
        """The database is damaged: move it aside (kept, named ``spool.db.corrupt-*``),
        start a fresh one, and copy into it every row that can still be read, under its
        own id (a replay in progress goes on over the same ids). Returns what the open of
        the fresh one found."""
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
        return opened

    def rebuild(self, why: str) -> None:
        """The open database was found damaged (a read or write said so): set it aside and
        go on with a fresh one holding every row that can still be read, under the same
        ids (see `_set_aside_and_salvage()`). Owner only; raises `SpoolError`
        when even a fresh database cannot be made."""
        self.owner.check("rebuild the spool")
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        conn = self.rows.detach()
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._use(self._set_aside_and_salvage(why))
        self._reconcile_identity()
        self._start_checkpointer()

    def _connect_and_check(self) -> Opened:
        """Open the database and check it (`open_database()`),
        with the summary of the last clean close, once."""
        clean, self._clean = self._clean, None
        known = self.producer_id if self._state_trusted else None
        return open_database(self.db_path, self.synchronous, clean, known)

    def _use(self, opened: Opened) -> None:
        """Go on with the database just opened, and with what the open found in it."""
        self.checked_at_open = opened.checked
        self._db_identity, self._seq_above_rows = opened.identity, opened.seq_above_rows
        self.rows.attach(opened)

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
        ``upto`` may be used. Raises `SpoolError` if either write fails: no seq of
        the reservation may be used then."""
        with self.rows.transaction("seq reservation") as conn:
            conn.execute("DELETE FROM identity")
            conn.execute("INSERT INTO identity VALUES (?, ?)", (self._state["producer_id"], upto))
        self._state["seq_reserved"] = upto
        try:
            self._write_state()
        except OSError as exc:
            raise SpoolError(f"cannot persist the sequence number: {exc}") from exc

    # -- the rows (logsdk.spool._rows) ----------------------------------------------------

    @property
    def conn(self) -> sqlite3.Connection:
        """The spool's SQLite connection: its owner's only (checked, see `owner`)."""
        return self.rows.conn

    @property
    def count(self) -> int:
        """Rows the spool holds (published: any thread may read it)."""
        return self.rows.count

    @property
    def bytes(self) -> int:
        """Their bytes, as counted against ``max_bytes`` (published)."""
        return self.rows.bytes

    @property
    def top_id(self) -> int:
        """The highest row id this spool has held: every row written later has a higher
        one."""
        return self.rows.top_id

    def room(self) -> int | None:
        """Bytes left under ``max_bytes`` (None: no cap)."""
        return self.rows.room()

    def append(self, rows: Sequence[Row]) -> None:
        """`Rows.append`."""
        self.rows.append(rows)

    def append_columns(self, cols: Columns, total_bytes: int | None = None) -> None:
        """`Rows.append_columns`."""
        self.rows.append_columns(cols, total_bytes)

    def read_after(self, after_id: int, limit: int) -> list[StoredRow]:
        """`Rows.read_after`."""
        return self.rows.read_after(after_id, limit)

    def read_replay(self, after_id: int, limit: int) -> list[ReplayRow]:
        """`Rows.read_replay`."""
        return self.rows.read_replay(after_id, limit)

    def delete(self, ids: Iterable[int], freed_bytes: int | None = None) -> int:
        """`Rows.delete`."""
        return self.rows.delete(ids, freed_bytes)

    def delete_through(self, last_id: int) -> int:
        """`Rows.delete_through`."""
        return self.rows.delete_through(last_id)

    def holds_rows(self) -> bool:
        """`Rows.holds_rows`."""
        return self.rows.holds_rows()

    def drop_oldest(self, need_bytes: int, after_id: int = 0) -> int:
        """`Rows.drop_oldest`."""
        return self.rows.drop_oldest(need_bytes, after_id)

    def move_to_rejected(self, pairs: Sequence[tuple[int, str]]) -> None:
        """`Rows.move_to_rejected`."""
        self.rows.move_to_rejected(pairs)

    def reject(self, rows: Sequence[tuple[Row, str]]) -> None:
        """`Rows.reject`."""
        self.rows.reject(rows)

    def rejected_count(self) -> int:
        """`Rows.rejected_count`."""
        return self.rows.rejected_count()

    def recount_if_off(self) -> None:
        """`Rows.recount_if_off`."""
        self.rows.recount_if_off()
