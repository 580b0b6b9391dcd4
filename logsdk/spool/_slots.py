"""One ``spool_dir`` for a whole multi-process application: a slot per live producer.

Layout: ``spool_dir`` itself is slot 0, laid out as a single-process spool always was
(``spool.db``, ``state.json``, ``LOCK``), so a spool written before slots existed is slot 0
as it stands. Slot ``k >= 1`` is ``spool_dir/slots/k``, a complete spool of the same
layout. Each slot has its own producer id and seq space (its ``state.json``).

Invariants:
- a live producer owns exactly one slot, through the ``flock`` on the slot's ``LOCK``; the
  lock goes with the process (a crash, a SIGKILL, a recycled worker all free it);
- a producer takes the lowest-numbered slot whose lock is free, so the number of slots
  stays at the peak number of producers alive at once (plus slots being drained);
- records in a free slot belong to no one until a producer takes the slot as its own, or
  drains it (`orphans()` lists them): either way they go to Kafka with the slot's own
  producer id and seqs, so the dedupe headers stay unique.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from pathlib import Path

from logsdk._fork import fork_guard
from logsdk.errors import SpoolError, SpoolLockedError
from logsdk.spool import _readonly
from logsdk.spool._database import DB_NAME
from logsdk.spool._dirlock import LOCK_NAME
from logsdk.spool._spool import Spool

SLOTS_DIR = "slots"
#: More slots than any host runs producers on one spool_dir: past it, something is wrong.
MAX_SLOTS = 4096


def slot_path(root: str | os.PathLike[str], index: int) -> Path:
    """The directory of slot ``index`` under ``root`` (slot 0 is ``root`` itself)."""
    base = Path(root)
    return base if index == 0 else base / SLOTS_DIR / str(index)


def slot_indexes(root: str | os.PathLike[str]) -> list[int]:
    """The slots that exist under ``root``, in order (0 first, when ``root`` exists)."""
    base = Path(root)
    found = [0] if base.is_dir() else []
    with contextlib.suppress(OSError):
        for entry in os.scandir(base / SLOTS_DIR):
            name = entry.name
            if name.isdigit() and name == str(int(name)) and int(name) > 0 and entry.is_dir():
                found.append(int(name))
    return sorted(found)


def open_slot(
    root: str | os.PathLike[str], *, synchronous: str, max_bytes: int | None
) -> tuple[int, Spool]:
    """Open the lowest-numbered free slot under ``root`` (creating it if needed): its
    index and its spool, locked by this process until closed."""
    for index in range(MAX_SLOTS):
        path = slot_path(root, index)
        if index > 0:
            try:
                (Path(root) / SLOTS_DIR).mkdir(mode=0o700, exist_ok=True)
            except OSError as exc:
                raise SpoolError(f"cannot create {Path(root) / SLOTS_DIR}: {exc}") from exc
        try:
            return index, Spool(path, synchronous=synchronous, max_bytes=max_bytes).open()
        except SpoolLockedError:
            continue
    raise SpoolError(
        f"spool dir {root}: all {MAX_SLOTS} slots are held by live producers; "
        "is something creating producers in a loop without closing them?"
    )


def is_free(path: Path) -> bool:
    """True when no live producer holds the slot at ``path`` (a moment's answer: the
    caller must still expect `SpoolLockedError` when it opens the slot)."""
    # Under the fork guard: a child forked while the lock is taken here would keep it.
    with fork_guard:
        try:
            fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # closing the only descriptor of this open also drops the flock
    return True


def spooled_records(path: Path) -> int:
    """How many records the spool at ``path`` holds (0 when it has none), read without
    writing a file beside it (`logsdk.spool._readonly`). 1 when that cannot be told
    (an unreadable file, a WAL with commits but no ``-shm``, a file that changed under the
    read): a producer that opens the slot repairs, recovers or reports it."""
    db = path / DB_NAME
    before = _readonly.file_ids(db)
    if before[0] is None:
        return 0
    if _readonly.misses_wal(before):
        return 1
    immutable = _readonly.needs_immutable(before)
    try:
        with _readonly.connect(db, immutable=immutable) as conn:
            n = int(conn.execute("SELECT count(*) FROM records").fetchone()[0])
    except sqlite3.Error:
        return 1
    if immutable and _readonly.file_ids(db) != before:
        return 1  # a producer opened the slot meanwhile: a torn read of the main file
    return n


def orphans(root: str | os.PathLike[str], own: int) -> list[int]:
    """Slots under ``root`` other than ``own`` that no live producer holds."""
    return [i for i in slot_indexes(root) if i != own and is_free(slot_path(root, i))]


def slot_shm_name(name: str | None, index: int) -> str | None:
    """The ``shm_name`` of slot ``index``: ``name`` for slot 0, ``name-index`` beyond (None:
    derived from the slot's directory, which differs per slot already)."""
    if name is None or index == 0:
        return name
    return f"{name}-{index}"
