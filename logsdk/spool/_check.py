"""Check a spool dir read-only: what must hold in each of its slots, one finding a line.

`check_spool_dir()` reads every slot (see `logsdk.spool._slots`) and returns a
`CheckResult`: per slot, findings of severity ``"problem"`` (something that must hold
does not) or ``"note"`` (what was found; nothing wrong). What is checked, per slot:

- SQLite's full ``PRAGMA integrity_check``;
- the rows against the summary a clean close left in ``state.json`` (``closed``), when the
  database file is still the one it describes: count and bytes of the rows above the
  watermark, and the watermark (``meta.replayed_through``);
- no seq twice among the rows above the watermark, nor among them and ``rejected``;
- every seq a row holds (``records_all`` and ``rejected``) below ``seq_reserved`` in
  ``state.json`` and in the ``identity`` table;
- the identity in ``state.json`` and in the ``identity`` table agree;
- the files: the rules of `check_private()`, and the corrupt
  databases a producer moved aside (``spool.db.corrupt-*``), named.

Invariants (of the check itself):
- it never takes a slot's lock and never writes into a slot's files: SQLite is opened
  with ``mode=ro`` only when the slot's ``-wal`` and ``-shm`` exist (a read-only
  connection creates them otherwise, and leaves them), else with ``immutable=1``
  (`logsdk.spool._readonly`), and
  such a read counts only if the file, its WAL and the slot's liveness did not change
  meanwhile (else the slot is read again; after three such reads it is reported as not
  judged, a note: a torn read could show damage that is not there). One race remains: a
  producer's close that removes the two files between that look and the connection's
  open; SQLite then makes them again, empty and owned as the database is (also when run
  as root), which the next open takes as no WAL, as it takes any empty WAL;
- whether a live producer holds the slot is asked with a shared ``flock`` on a separate
  open of ``LOCK``, taken and dropped at once (a producer starting in that instant takes
  another slot, as when two start together);
- a live slot is checked too, in one read transaction, with ``state.json`` read before and
  after it: a reservation is written to the database first, then to ``state.json``, and a
  row uses a seq only once both are written, so a live producer explains the database's
  reservation being ahead of the file's, never a row at or above either.

The check of a large spool reads the whole file (``integrity_check``, a scan of the rows):
about what a producer's open does after a crash. While it reads a live slot, the
producer's checkpoints cannot pass the check's snapshot; a close meanwhile leaves no
summary, so the next open checks the whole file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from logsdk.errors import SpoolError
from logsdk.spool import _readonly
from logsdk.spool._database import DB_NAME
from logsdk.spool._dirlock import LOCK_NAME, check_private, lock_pid
from logsdk.spool._readonly import FileId
from logsdk.spool._slots import slot_indexes, slot_path
from logsdk.spool._state import STATE_NAME, TMP_NAME, read_state, summary_of

__all__ = ["CheckResult", "Finding", "SlotCheck", "check_slot", "check_spool_dir"]

Severity = Literal["problem", "note"]
PROBLEM: Severity = "problem"
NOTE: Severity = "note"

#: Reads of a slot that changed under the check (a producer opening or closing it) before
#: the check gives up on a stable picture of it.
_ATTEMPTS = 3


def one_line(text: str) -> str:
    """``text`` with control characters (and undecodable file-name bytes) escaped: a file
    name or an SQLite message can never start a line of its own."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass(frozen=True)
class Finding:
    """One thing found in one slot; ``str()`` is its line: ``slot N (PATH): MESSAGE``."""

    severity: Severity
    slot: int
    path: Path
    message: str

    def __str__(self) -> str:
        return one_line(f"slot {self.slot} ({self.path}): {self.message}")


@dataclass
class SlotCheck:
    """What the check found in one slot: its figures and its findings, in check order."""

    slot: int
    path: Path
    #: A live producer holds the slot (None: could not tell; checked as if live).
    live: bool | None = None
    #: The pid written in ``LOCK`` by the producer that last took it (live slots only).
    pid: int | None = None
    #: Rows above the watermark and their bytes (None: not read).
    records: int | None = None
    bytes: int | None = None
    #: Lowest and highest seq of the rows above the watermark.
    seq_range: tuple[int, int] | None = None
    rejected: int | None = None
    findings: list[Finding] = field(default_factory=list)

    def problem(self, message: str) -> None:
        self.findings.append(Finding(PROBLEM, self.slot, self.path, message))

    def note(self, message: str) -> None:
        self.findings.append(Finding(NOTE, self.slot, self.path, message))

    @property
    def ok(self) -> bool:
        return not any(f.severity == PROBLEM for f in self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "path": str(self.path),
            "live": self.live,
            "pid": self.pid,
            "records": self.records,
            "bytes": self.bytes,
            "seq_range": list(self.seq_range) if self.seq_range else None,
            "rejected": self.rejected,
            "ok": self.ok,
            "findings": [{"severity": f.severity, "text": str(f)} for f in self.findings],
        }


@dataclass
class CheckResult:
    """The check of a whole spool dir: `ok` when no slot has a problem."""

    directory: Path
    slots: list[SlotCheck]

    @property
    def findings(self) -> list[Finding]:
        return [f for s in self.slots for f in s.findings]

    @property
    def problems(self) -> list[str]:
        """Each problem as its line, ``slot N (PATH): what is wrong``."""
        return [str(f) for f in self.findings if f.severity == PROBLEM]

    @property
    def notes(self) -> list[str]:
        return [str(f) for f in self.findings if f.severity == NOTE]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return f"{len(self.slots)} slot(s) checked, {len(self.problems)} problem(s)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "dir": str(self.directory),
            "ok": self.ok,
            "slots_checked": len(self.slots),
            "problems": len(self.problems),
            "slots": [s.as_dict() for s in self.slots],
        }


def check_spool_dir(path: str | os.PathLike[str]) -> CheckResult:
    """Check every slot of the spool dir ``path``, read-only (see the module docstring).

    Raises [`SpoolError`][logsdk.errors.SpoolError] only when ``path`` is not a spool dir at all
    (missing, not a directory, or holding no spool); whatever is wrong inside a slot is a finding.
    """
    root = Path(path)
    if not root.exists():
        raise SpoolError(f"{root} does not exist")
    if not root.is_dir():
        raise SpoolError(f"{root} is not a directory")
    indexes = slot_indexes(root)
    if not any(
        (slot_path(root, i) / name).exists()
        for i in indexes
        for name in (DB_NAME, STATE_NAME, LOCK_NAME)
    ):
        raise SpoolError(f"{root} is not a spool dir (no {DB_NAME} in it or in its slots)")
    return CheckResult(root, [check_slot(slot_path(root, i), i) for i in indexes])


def check_slot(path: Path, index: int = 0) -> SlotCheck:
    """Check the one slot at ``path`` (slot number ``index``, for the findings' lines)."""
    for attempt in range(1, _ATTEMPTS + 1):
        report = _check_once(path, index, last=attempt == _ATTEMPTS)
        if report is not None:
            return report
    raise AssertionError("unreachable: the last attempt always reports")


# -- one read of a slot ---------------------------------------------------------------------


@dataclass
class _Snapshot:
    """What one read transaction saw in ``spool.db``."""

    integrity: list[str] = field(default_factory=list)
    integrity_error: str | None = None
    error: str | None = None  # the tables could not be read (the rest is partial)
    tables: set[str] = field(default_factory=set)
    table: str = "records_all"
    mark: int | None = None
    records: int = 0
    bytes: int = 0
    seq_range: tuple[int, int] | None = None
    top_seq: dict[str, int] = field(default_factory=dict)  # table -> highest seq of any row
    repeated: tuple[int, int, int] | None = None  # (first seq, its rows, seqs repeated)
    repeated_rejected: tuple[int, int, int] | None = None
    rejected: int = 0
    identity: list[tuple[Any, Any]] | None = None  # None: no identity table


def _held(path: Path) -> bool | None:
    """True when a live producer holds the slot's lock, None when that cannot be told.
    A shared flock on an open of our own, dropped at once: never the owner's lock."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        # A link: no producer can lock it (they open LOCK with O_NOFOLLOW too).
        return False if exc.errno in (errno.ELOOP, errno.EMLINK) else None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # our descriptor's flock goes with it; the owner's is another's
    return False


def _read_state(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``state.json`` as a dict, or the reason it cannot be used (None: a link, which the
    file checks report)."""
    found = read_state(path)
    return found.state, None if found.found == "link" else found.problem


def _read_db(db: Path, immutable: bool) -> _Snapshot:
    """Everything the checks need from ``spool.db``, in one read transaction."""
    snap = _Snapshot()
    try:
        with _readonly.connect(db, immutable=immutable) as conn:
            conn.execute("BEGIN")
            try:
                try:
                    rows = conn.execute("PRAGMA integrity_check").fetchall()
                    # One message a line (SQLite may put several in one row).
                    snap.integrity = [
                        line
                        for (text,) in rows
                        for line in str(text).splitlines()
                        if line.strip() and not line.startswith("*** in database")
                    ]
                except sqlite3.Error as exc:
                    snap.integrity_error = str(exc)
                _read_tables(conn, snap)
            finally:
                conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        if snap.error is None:
            snap.error = str(exc)
    return snap


def _read_tables(conn: sqlite3.Connection, snap: _Snapshot) -> None:
    try:
        snap.tables = {
            name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if "records_all" not in snap.tables:
            if "records" not in snap.tables:
                return
            snap.table = "records"  # written by a logsdk before the watermark
        t = snap.table
        mark = 0
        if "meta" in snap.tables:
            row = conn.execute("SELECT value FROM meta WHERE name = 'replayed_through'").fetchone()
            if row is None or type(row[0]) is not int:
                snap.mark = None
            else:
                mark = snap.mark = row[0]
        elif t == "records":
            snap.mark = 0
        n, size, lo, hi = conn.execute(
            f"SELECT count(*), coalesce(sum(size), 0), min(seq), max(seq) FROM {t} WHERE id > ?",
            (mark,),
        ).fetchone()
        snap.records, snap.bytes = int(n), int(size)
        snap.seq_range = None if lo is None else (int(lo), int(hi))
        (top,) = conn.execute(f"SELECT max(seq) FROM {t}").fetchone()
        if top is not None:
            snap.top_seq[t] = int(top)
        snap.repeated = _repeated(
            conn, f"SELECT seq FROM {t} WHERE id > ? AND seq IS NOT NULL", (mark,)
        )
        if "rejected" in snap.tables:
            k, top = conn.execute("SELECT count(*), max(seq) FROM rejected").fetchone()
            snap.rejected = int(k)
            if top is not None:
                snap.top_seq["rejected"] = int(top)
            # Seqs held more than once once rejected rows count: at least one of them a
            # rejected row (the rows' own repeats are reported above).
            snap.repeated_rejected = _repeated(
                conn,
                f"SELECT seq FROM {t} WHERE id > ? AND seq IS NOT NULL "
                "UNION ALL SELECT seq FROM rejected WHERE seq IS NOT NULL",
                (mark,),
                only_in="rejected",
            )
        if "identity" in snap.tables:
            snap.identity = [
                (p, s) for p, s in conn.execute("SELECT producer_id, seq_reserved FROM identity")
            ]
    except sqlite3.Error as exc:
        snap.error = str(exc)


def _repeated(
    conn: sqlite3.Connection, seqs_sql: str, params: tuple[Any, ...], only_in: str | None = None
) -> tuple[int, int, int] | None:
    """(the lowest seq held more than once, how many times, how many seqs are) among the
    seqs ``seqs_sql`` selects; None when each is held once."""
    where = f"WHERE seq IN (SELECT seq FROM {only_in})" if only_in else ""
    groups = f"SELECT seq, count(*) AS n FROM ({seqs_sql}) GROUP BY seq HAVING n > 1"
    k, first = conn.execute(f"SELECT count(*), min(seq) FROM ({groups}) {where}", params).fetchone()
    if not k:
        return None
    (n,) = conn.execute(
        f"SELECT count(*) FROM ({seqs_sql}) WHERE seq = ?", (*params, first)
    ).fetchone()
    return int(first), int(n), int(k)


def _check_once(path: Path, index: int, last: bool) -> SlotCheck | None:
    """One read of the slot and its findings, the slot's status line first; None when
    the slot changed under the read in a way that makes the read not one moment's (see
    the module docstring), unless this is the ``last`` attempt."""
    report = SlotCheck(index, path)
    live = _held(path)
    db = path / DB_NAME
    _check_files(path, report)
    if not db.exists():
        report.live = live
        _, error = _read_state(path)
        if error and (path / STATE_NAME).exists():
            report.problem(error)
        report.findings.insert(
            0,
            Finding(
                NOTE,
                index,
                path,
                f"{'live' if live is not False else 'free'}; no {DB_NAME} (a producer "
                "stopped before creating it, or is creating it now)",
            ),
        )
        return report

    state1, state_error = _read_state(path)
    before = _readonly.file_ids(db)
    # mode=ro would create a missing -wal or -shm (files of ours, left behind): without
    # both, the main file is read as it is and the read counts only if nothing changed.
    immutable = _readonly.needs_immutable(before)
    snap = _read_db(db, immutable)
    state2, _ = _read_state(path)
    after = _readonly.file_ids(db)
    live_after = _held(path)
    changed = immutable and (before != after or live != live_after)
    if changed and not last:
        return None
    live = True if True in (live, live_after) else (None if None in (live, live_after) else False)
    report.live = live
    report.pid = lock_pid(path) if live else None
    if changed:
        # A read of a file that changed under it may be torn: nothing it saw is judged.
        status = (
            f"{'live' if live is not False else 'free'}; not judged: {DB_NAME} changed under "
            f"each of {_ATTEMPTS} reads (a producer opening or closing the slot); check again"
        )
        report.findings.insert(0, Finding(NOTE, index, path, status))
        return report
    if state_error:
        report.problem(state_error)
    if _readonly.misses_wal(before):
        report.note(
            f"{DB_NAME}-wal without {DB_NAME}-shm: read without the WAL (its newest commits "
            "are not seen)"
        )
    status = _judge(
        report, snap, state1, state2 if state2 is not None else state1, after[0], after[1]
    )
    report.findings.insert(0, Finding(NOTE, index, path, status))
    return report


def _check_files(path: Path, report: SlotCheck) -> None:
    """The rules a producer's open applies (check_private), to every file of the slot."""
    try:
        check_private(path, directory=True)
    except SpoolError as exc:
        report.problem(str(exc))
    names = [DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", STATE_NAME, LOCK_NAME, TMP_NAME]
    for name in names:
        try:
            check_private(path / name, missing_ok=True)
        except SpoolError as exc:
            report.problem(str(exc))
    try:
        corrupt = sorted(path.glob(f"{DB_NAME}.corrupt-*"))
    except OSError:
        corrupt = []
    for file in corrupt:
        try:
            size = os.lstat(file).st_size
        except OSError:
            continue
        report.note(
            f"{file.name} ({size:,} bytes): a damaged spool a producer moved aside; "
            "inspect or delete it"
        )
        try:
            check_private(file)
        except SpoolError as exc:
            report.problem(str(exc))


def _judge(
    report: SlotCheck,
    snap: _Snapshot,
    state1: dict[str, Any] | None,
    state2: dict[str, Any] | None,
    db_stat: FileId | None,
    wal_stat: FileId | None,
) -> str:
    """The findings from one read (``state1``/``state2``: ``state.json`` as read before
    and after the database's read transaction); returns the slot's status line."""
    live = report.live is not False
    who = f"live (pid {report.pid})" if live and report.pid else "live" if live else "free"
    if snap.error and not snap.tables:
        report.problem(f"{DB_NAME} cannot be read: {snap.error}")
        return f"{who}; no figures (the database cannot be read)"
    if snap.integrity_error is not None:
        report.problem(f"integrity_check could not run: {snap.integrity_error}")
    elif snap.integrity != ["ok"]:
        more = f" (and {len(snap.integrity) - 1} more)" if len(snap.integrity) > 1 else ""
        first = snap.integrity[0] if snap.integrity else "no answer"
        report.problem(f"integrity_check failed: {first}{more}")
    if not snap.tables:
        return f"{who}; {DB_NAME} holds no tables yet (a producer stopped creating it?)"
    if snap.table not in snap.tables:
        report.problem(f"{DB_NAME} has no records_all table (tables: {sorted(snap.tables)})")
        return f"{who}; no figures (no records_all table)"
    if snap.error:
        damaged = snap.integrity_error is not None or snap.integrity != ["ok"]
        (report.note if damaged else report.problem)(f"the tables cannot be read: {snap.error}")
        return f"{who}; no figures (the tables cannot be read)"
    report.records, report.bytes = snap.records, snap.bytes
    report.seq_range, report.rejected = snap.seq_range, snap.rejected
    seqs = f"seq {snap.seq_range[0]}..{snap.seq_range[1]}" if snap.seq_range else "no seq"
    figures = f"{snap.records} record(s) ({snap.bytes:,} bytes), {seqs}, {snap.rejected} rejected"
    status = f"{who}; {figures}; {_judge_summary(report, snap, state1, db_stat, wal_stat)}"
    if snap.table == "records":
        report.note("written by a logsdk before the watermark (the next open converts it)")
    if snap.mark is None:
        report.problem("meta holds no replayed_through watermark (an integer)")
    if "rejected" not in snap.tables:
        report.problem(f"{DB_NAME} has no rejected table")
    if snap.repeated:
        seq, n, k = snap.repeated
        report.problem(
            f"seq {seq} is held by {n} rows of {snap.table} above the watermark "
            f"({k} seq(s) held more than once)"
        )
    if snap.repeated_rejected:
        seq, n, k = snap.repeated_rejected
        report.problem(
            f"seq {seq} is held {n} times by rows of rejected and {snap.table} above the "
            f"watermark together ({k} seq(s) so)"
        )
    _judge_identity(report, snap, state1, state2)
    return status


def _judge_summary(
    report: SlotCheck,
    snap: _Snapshot,
    state: dict[str, Any] | None,
    db_stat: FileId | None,
    wal_stat: FileId | None,
) -> str:
    """Compare the rows with the summary of the last clean close, when it stands; returns
    what the slot's line says of the summary."""
    if report.live is not False:
        return "counts as found (no summary while a producer holds it)"
    closed = state.get("closed") if state else None
    if closed is None:
        return "counts as found (no summary of a clean close)"
    summary = summary_of(closed)
    if summary is None:
        return "counts as found (the summary in state.json is malformed: not used at open)"
    described = (summary["ino"], summary["size"], summary["mtime_ns"])
    # As the producer's open judges it: an empty WAL is no WAL.
    if db_stat is None or (wal_stat is not None and wal_stat[1]) or db_stat[:3] != described:
        return (
            f"counts as found (the summary of the last close no longer describes {DB_NAME}: "
            "not used at open)"
        )
    said = (summary["count"], summary["bytes"], summary["mark"])
    found = (snap.records, snap.bytes, snap.mark)
    if said != found:
        report.problem(
            f"the summary of the last clean close in {STATE_NAME} says {said[0]} record(s), "
            f"{said[1]} bytes, watermark {said[2]}, and still describes {DB_NAME}; its "
            f"table holds {found[0]} record(s), {found[1]} bytes, watermark {found[2]} "
            "(the next open would take the summary's)"
        )
        return "the summary of the last close disagrees with the table"
    return "the summary of the last close matches"


def _judge_identity(
    report: SlotCheck,
    snap: _Snapshot,
    state1: dict[str, Any] | None,
    state2: dict[str, Any] | None,
) -> None:
    """The identity in the database and in ``state.json`` agree, and every seq a row holds
    is below both reservations."""
    live = report.live is not False
    db_id: tuple[str, int] | None = None
    if snap.identity is None:
        report.note("no identity table (a spool of an older logsdk: the next open adds it)")
    elif not snap.identity:
        report.note("the identity table is empty (the next open writes it)")
    elif len(snap.identity) > 1:
        report.problem(f"the identity table holds {len(snap.identity)} rows, not one")
    else:
        pid, res = snap.identity[0]
        if not isinstance(pid, str) or type(res) is not int:
            report.problem(f"the identity table holds ({pid!r}, {res!r}), not (text, integer)")
        else:
            db_id = (pid, res)
    # state2 was read after the transaction: a row uses a seq only once its reservation
    # is in state.json, so state2 covers every row the transaction saw.
    file_res = state2.get("seq_reserved", 0) if state2 else None
    for table, top in sorted(snap.top_seq.items()):
        if file_res is not None and top >= file_res:
            report.problem(
                f"seq {top} in {table} is not below seq_reserved {file_res} in {STATE_NAME}"
            )
        if db_id is not None and top >= db_id[1]:
            report.problem(
                f"seq {top} in {table} is not below seq_reserved {db_id[1]} in the identity table"
            )
    if db_id is None or state1 is None or state2 is None:
        return
    if state1["producer_id"] != db_id[0] and state2["producer_id"] != db_id[0]:
        report.problem(
            f"producer_id {state2['producer_id']} in {STATE_NAME} differs from {db_id[0]} in "
            "the identity table"
        )
        return
    res, before, after = db_id[1], state1.get("seq_reserved", 0), state2.get("seq_reserved", 0)
    if res in (before, after) or (live and before <= res <= after):
        return  # equal, or a live producer reserved while the check read
    if res > max(before, after):
        # The database is written first, state.json second (Spool.reserve_seq).
        why = (
            "a live producer is reserving seqs (the database is written first)"
            if live
            else "a reservation stopped between the database and state.json (a crash?); "
            "harmless: the next open takes the higher"
        )
        report.note(
            f"seq_reserved {res} in the identity table is ahead of {after} in {STATE_NAME}: {why}"
        )
        return
    report.problem(
        f"seq_reserved {res} in the identity table is below {after} in {STATE_NAME} (the "
        "database is written first, so it is never behind: was spool.db replaced?)"
    )
