"""What the slots of a spool dir hold, read from outside their producers: the figures of
``logsdk spool status``, the records a process left behind (``logsdk produce``), and what
a ``logsdk spool replay`` found in each slot and left there.

Invariants:
- nothing here takes a slot's lock or writes a row or a file: every read goes through a
  read-only connection (`logsdk.spool._readonly`), so a live producer is never
  disturbed;
- a read of the main file alone (no ``-wal``/``-shm`` beside it) that the file changed
  under (a producer opening or closing the slot) is made again, `ATTEMPTS` times
  in all (`read_slot()`); then its result comes with a warning;
- a slot's figures are read in one read transaction: they agree with each other;
- replay counts per slot: the records a slot held before (`look_before_replay()`,
  up to its highest seq then) are replayed, left or rejected, and nothing a producer
  added since is counted (`count_left()`).

Owner: none (functions, and `ReplaySlot`, owned by the command that made it); any
thread of any process. Warnings go to ``warn`` (the command line prints them as its own
lines), by default to the ``logsdk.spool`` logger.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from logsdk.errors import SpoolError
from logsdk.spool import _readonly
from logsdk.spool._database import DB_NAME
from logsdk.spool._dirlock import lock_pid
from logsdk.spool._slots import is_free, slot_indexes, slot_path
from logsdk.spool._state import read_state

log = logging.getLogger("logsdk.spool")

#: Reads of a slot's main file that changed under them (a producer opening or closing the
#: slot) before its figures are shown with a warning.
ATTEMPTS = 3
T = TypeVar("T")
#: Where a warning goes: one line of text.
Warn = Callable[[str], None]
_log_warning: Warn = log.warning


def spool_db(directory: Path) -> Path:
    """The database of the slot at ``directory``; `SpoolError` when ``directory``
    is not a spool dir."""
    db = directory / DB_NAME
    if not directory.is_dir():
        raise SpoolError(f"{directory} is not a directory")
    if not db.is_file():
        raise SpoolError(f"{directory} is not a spool dir (no {DB_NAME} in it)")
    return db


def read_slot(
    directory: Path,
    read: Callable[[sqlite3.Connection], T],
    *,
    attempts: int = ATTEMPTS,
    warn: Warn = _log_warning,
) -> T:
    """``read(conn)`` on a read-only connection to the slot at ``directory``: it never takes
    the producer's lock and writes neither a row nor a file (`logsdk.spool._readonly`).
    A read of the main file alone (no ``-wal``/``-shm`` beside it) that the file changed
    under is made again, ``attempts`` times in all; then its result comes with a warning
    (``warn``: each warning, one line)."""
    db = spool_db(directory)
    for attempt in range(1, attempts + 1):
        before = _readonly.file_ids(db)
        immutable = _readonly.needs_immutable(before)
        try:
            result = _read_once(directory, db, immutable, read, warn)
        except sqlite3.Error as exc:
            if immutable and attempt < attempts and _readonly.file_ids(db) != before:
                continue  # likely a torn read: the file changed under it
            raise SpoolError(f"cannot read spool {db}: {exc}") from exc
        if _readonly.misses_wal(before):
            warn(
                f"warning: {db}-wal without -shm: read without the WAL (its newest commits unseen)"
            )
        if not immutable or _readonly.file_ids(db) == before:
            return result
    warn(
        f"warning: {db} changed under each of {attempts} read(s) (a producer opening or "
        "closing it): what is shown of it may be off"
    )
    return result


def _read_once(
    directory: Path, db: Path, immutable: bool, read: Callable[[sqlite3.Connection], T], warn: Warn
) -> T:
    try:
        with _readonly.connect(db, immutable=immutable) as conn:
            return read(conn)
    except sqlite3.OperationalError:
        if immutable or os.access(directory, os.W_OK):
            raise
    # A WAL database in a directory we cannot write (its -shm cannot be used): read the
    # main file as it is; the WAL's newest commits are not seen.
    warn("warning: spool dir not writable; reading without its WAL (may be stale)")
    with _readonly.connect(db, immutable=True) as conn:
        return read(conn)


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def lock_owner(directory: Path) -> dict[str, Any]:
    """Who last took the slot's lock (the pid in ``LOCK``) and whether it still runs."""
    pid = lock_pid(directory)
    if pid is None:
        return {"pid": None, "running": False}
    try:
        os.kill(pid, 0)
        running = True
    except ProcessLookupError:
        running = False
    except PermissionError:
        running = True
    return {"pid": pid, "running": running}


def records_left_by_this_process(directory: Path, *, warn: Warn = _log_warning) -> int:
    """The records in the slots of ``directory`` whose ``LOCK`` names this process: the
    slots its producers held (each producer's own, and the free slots they drained), unless
    another process took one since. Read-only; 0 when ``directory`` holds no spool."""
    me, n = os.getpid(), 0
    for index in slot_indexes(directory):
        path = slot_path(directory, index)
        if (path / DB_NAME).is_file() and lock_pid(path) == me:
            n += read_slot(path, _count_records, warn=warn)
    return n


def _count_records(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM records").fetchone()[0])


def _slot_figures(conn: sqlite3.Connection) -> dict[str, Any]:
    """One slot's figures, in one read transaction."""
    conn.execute("BEGIN")
    try:
        n, size, oldest, newest, seq_lo, seq_hi = conn.execute(
            "SELECT count(*), coalesce(sum(size), 0), min(ts), max(ts), min(seq), max(seq) "
            "FROM records"
        ).fetchone()
        topics = {
            topic: {"records": c, "bytes": b, "oldest": _iso(lo), "newest": _iso(hi)}
            for topic, c, b, lo, hi in conn.execute(
                "SELECT topic, count(*), coalesce(sum(size), 0), min(ts), max(ts) "
                "FROM records GROUP BY topic ORDER BY topic"
            )
        }
        rejected = conn.execute("SELECT count(*) FROM rejected").fetchone()[0]
    finally:
        conn.execute("ROLLBACK")
    return {
        "records": n,
        "bytes": size,
        "oldest": _iso(oldest),
        "newest": _iso(newest),
        "seq_range": None if seq_lo is None else [seq_lo, seq_hi],
        "rejected": rejected,
        "topics": topics,
    }


def slot_status(directory: Path, *, warn: Warn = _log_warning) -> dict[str, Any]:
    """What one slot holds, as a dict."""
    figures = read_slot(directory, _slot_figures, warn=warn)
    files = [directory / f"{DB_NAME}{s}" for s in ("", "-wal")]
    return {
        "dir": str(directory),
        "producer_id": read_state(directory).producer_id,
        "records": figures["records"],
        "bytes": figures["bytes"],
        "file_bytes": sum(f.stat().st_size for f in files if f.exists()),
        "oldest": figures["oldest"],
        "newest": figures["newest"],
        "seq_range": figures["seq_range"],
        "rejected": figures["rejected"],
        "corrupt_files": sorted(p.name for p in directory.glob(f"{DB_NAME}.corrupt-*")),
        "locked_by": lock_owner(directory),
        "topics": figures["topics"],
    }


def spool_status(directory: Path, *, warn: Warn = _log_warning) -> dict[str, Any]:
    """Everything ``status`` shows, as a dict (see ``--json``): ``slots``, each slot's own
    figures; the sums of every slot's ``records``, ``bytes``, ``file_bytes``,
    ``rejected`` and ``topics``, the oldest and newest of them, every slot's
    ``corrupt_files`` (as paths under ``directory``); and slot 0's ``producer_id``,
    ``locked_by`` and ``seq_range`` (seqs are counted per producer id: each slot has its
    own, in ``slots``)."""
    spool_db(directory)
    slots = []
    for index in slot_indexes(directory):
        path = slot_path(directory, index)
        if (path / DB_NAME).is_file():
            slots.append({"slot": index, **slot_status(path, warn=warn)})
    topics: dict[str, dict[str, Any]] = {}
    for sl in slots:
        for name, t in sl["topics"].items():
            acc = topics.setdefault(name, {"records": 0, "bytes": 0, "oldest": [], "newest": []})
            acc["records"] += t["records"]
            acc["bytes"] += t["bytes"]
            acc["oldest"].append(t["oldest"])
            acc["newest"].append(t["newest"])
    for t in topics.values():  # ISO stamps of one format: text order is time order
        t["oldest"] = min((x for x in t["oldest"] if x), default=None)
        t["newest"] = max((x for x in t["newest"] if x), default=None)
    stamps = [sl[k] for sl in slots for k in ("oldest", "newest") if sl[k]]
    (first,) = (sl for sl in slots if sl["slot"] == 0)
    return {
        "dir": str(directory),
        "producer_id": first["producer_id"],
        "records": sum(sl["records"] for sl in slots),
        "bytes": sum(sl["bytes"] for sl in slots),
        "file_bytes": sum(sl["file_bytes"] for sl in slots),
        "oldest": min(stamps) if stamps else None,
        "newest": max(stamps) if stamps else None,
        "seq_range": first["seq_range"],
        "rejected": sum(sl["rejected"] for sl in slots),
        "corrupt_files": [
            str((slot_path(directory, sl["slot"]) / name).relative_to(directory))
            for sl in slots
            for name in sl["corrupt_files"]
        ],
        "locked_by": first["locked_by"],
        "topics": dict(sorted(topics.items())),
        "slots": slots,
    }


# -- a replay's figures, per slot --------------------------------------------------------------


@dataclasses.dataclass
class ReplaySlot:
    """One slot as replay saw it before it started, and what became of it."""

    index: int
    path: Path
    records: int
    #: Its rejected rows at the look: of seqs up to ``top_seq``, and all of them.
    rejected: int
    rejected_all: int
    #: The highest seq among its records at the look (None: none): a producer that takes
    #: the slot later writes higher ones, which are not this replay's.
    top_seq: int | None
    topic: str | None
    free: bool
    #: The pid in LOCK at the look (the last producer that held it).
    pid: int | None
    #: This process held it during the replay (the producer, or one of its drains).
    ours: bool = False
    #: Another process (pid) took it during the replay before this one did.
    taken_by: int | None = None
    #: After the replay, of the records of the look (all records, for a slot taken over).
    left: int = 0
    rejected_now: int = 0

    @property
    def newly_rejected(self) -> int:
        return self.rejected_now - self.rejected

    @property
    def replayed(self) -> int:
        return self.records - self.left - self.newly_rejected


def _seq_bound(top_seq: int | None) -> tuple[str, tuple[int, ...]]:
    """The rows of seqs up to ``top_seq`` (rows without a seq, of old spools, included)."""
    if top_seq is None:
        return "seq IS NULL", ()
    return "(seq IS NULL OR seq <= ?)", (top_seq,)


def look_before_replay(path: Path, index: int, *, warn: Warn = _log_warning) -> ReplaySlot:
    """A slot's figures before the replay (one read transaction)."""

    def figures(conn: sqlite3.Connection) -> tuple[int, int | None, str | None, int, int]:
        conn.execute("BEGIN")
        try:
            n, top, topic = conn.execute(
                "SELECT count(*), max(seq), (SELECT topic FROM records ORDER BY id LIMIT 1) "
                "FROM records"
            ).fetchone()
            where, params = _seq_bound(top)
            (rejected,) = conn.execute(
                f"SELECT count(*) FROM rejected WHERE {where}", params
            ).fetchone()
            (rejected_all,) = conn.execute("SELECT count(*) FROM rejected").fetchone()
        finally:
            conn.execute("ROLLBACK")
        return int(n), top, topic, int(rejected), int(rejected_all)

    n, top, topic, rejected, rejected_all = read_slot(path, figures, warn=warn)
    free, pid = is_free(path), lock_pid(path)
    return ReplaySlot(index, path, n, rejected, rejected_all, top, topic, free, pid)


def count_left(sl: ReplaySlot, *, everything: bool = False, warn: Warn = _log_warning) -> None:
    """Set what the slot holds now of the records it held at the look (records a
    producer added since have higher seqs: not counted), or all it holds (``everything``)."""
    where, params = ("1", ()) if everything else _seq_bound(sl.top_seq)

    def figures(conn: sqlite3.Connection) -> tuple[int, int]:
        conn.execute("BEGIN")
        try:
            (left,) = conn.execute(f"SELECT count(*) FROM records WHERE {where}", params).fetchone()
            (rej,) = conn.execute(f"SELECT count(*) FROM rejected WHERE {where}", params).fetchone()
        finally:
            conn.execute("ROLLBACK")
        return int(left), int(rej)

    sl.left, sl.rejected_now = read_slot(sl.path, figures, warn=warn)


def watch_takers(slots: list[ReplaySlot]) -> None:
    """Note, from the pid in each slot's LOCK, which slots this process took (the replay's
    producer and its drains) and which another process took first. LOCK keeps the pid of
    the last producer that took the slot, also once it let go."""
    me = os.getpid()
    for sl in slots:
        pid = lock_pid(sl.path)
        if pid == me:
            sl.ours = True
        elif pid is not None and pid != sl.pid and not sl.ours and sl.taken_by is None:
            sl.taken_by = pid
