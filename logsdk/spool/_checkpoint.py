"""WAL checkpoints of one spool database, on a thread of their own.

A checkpoint copies pages from the WAL back into the database file and fsyncs it: about
half of the time a replay's deletes took when SQLite ran it inside the commits of the
thread that writes, and that thread is the producer's pump. Here the spool's connection
has ``wal_autocheckpoint=0`` and tells the `Checkpointer` what its commits wrote
or freed; past `CHECKPOINT_BYTES` a ``PRAGMA wal_checkpoint(PASSIVE)`` runs on the
thread ``logsdk-spool-checkpoint``, on a connection of its own.

Invariants:
- a PASSIVE checkpoint neither waits for nor blocks the writer; SQLite restarts the WAL
  from its beginning at the next commit after one has copied everything, so the WAL stays
  about as large as with automatic checkpoints;
- a failed checkpoint loses nothing (the data is safe in the WAL): it is logged, counted
  (``failures``) and tried again at the next request;
- requests made while a checkpoint runs collapse into one more.

Owner: the checkpoint thread owns its connection (opened by `Checkpointer.start()`
on the spool's thread, so an error surfaces in the spool's ``open()``, and used by that
thread only afterwards) and writes ``failures`` (published: one writer). The spool's
owner calls `Checkpointer.committed()` (which alone touches the byte count) and
`Checkpointer.stop()`, which joins the thread and closes its connection.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

from logsdk._sqlite import connect as gated_connect

log = logging.getLogger("logsdk.spool")

#: Bytes written or freed by commits after which a checkpoint is asked for: about SQLite's
#: own default (wal_autocheckpoint=1000 pages of 4 KiB).
CHECKPOINT_BYTES = 4 << 20


class Checkpointer:
    """Runs ``PRAGMA wal_checkpoint(PASSIVE)`` for one spool on a thread of its own (see
    the module docstring)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._want = threading.Event()
        self._stopping = False
        self._unchecked = 0  # bytes committed since the last request (the spool's owner)
        self.failures = 0
        self._thread = threading.Thread(
            target=self._run, name="logsdk-spool-checkpoint", daemon=True
        )
        self._thread.start()

    @classmethod
    def start(
        cls, db_path: Path, synchronous: str, writer: sqlite3.Connection
    ) -> Checkpointer | None:
        """A checkpointer for the database at ``db_path``, once ``writer`` (the spool's
        connection) no longer checkpoints by itself; None when that cannot be set up
        (logged): SQLite's own checkpoints, in the writing thread, remain."""
        try:
            ck = gated_connect(db_path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.warning("spool checkpoints stay in the writing thread: %s", exc)
            return None
        try:
            # The checkpoint's fsyncs follow the checkpointing connection's setting.
            ck.execute(f"PRAGMA synchronous={synchronous}")
            writer.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.Error as exc:
            ck.close()
            log.warning("spool checkpoints stay in the writing thread: %s", exc)
            return None
        return cls(ck)

    def committed(self, nbytes: int) -> None:
        """A write transaction committed about ``nbytes``: ask for a checkpoint now and
        then (spool's owner)."""
        self._unchecked += nbytes
        if self._unchecked >= CHECKPOINT_BYTES:
            self._unchecked = 0
            self.request()

    def request(self) -> None:
        self._want.set()

    def stop(self) -> None:
        self._stopping = True
        self._want.set()
        self._thread.join()

    def _run(self) -> None:
        conn = self._conn
        try:
            while True:
                self._want.wait()
                self._want.clear()
                if self._stopping:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    self.failures += 1
                    log.warning("spool checkpoint failed (retried later): %s", exc)
        finally:
            conn.close()
