"""``logsdk spool status|check|replay|export DIR``: look into a producer's spool, check it,
drain it."""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import shlex
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from logsdk._cli._common import (
    Subparsers,
    UsageError,
    add_command,
    add_kafka_options,
    err,
    kafka_config,
    seconds,
    sigterm_as_interrupt,
)
from logsdk.errors import SpoolError
from logsdk.spool import _readonly
from logsdk.spool._check import check_spool_dir
from logsdk.spool._codec import decode_headers
from logsdk.spool._database import DB_NAME
from logsdk.spool._dirlock import LOCK_NAME
from logsdk.spool._slots import is_free, slot_indexes, slot_path
from logsdk.spool._state import read_state

if TYPE_CHECKING:
    from logsdk.producer import LogProducer


def register(sub: Subparsers) -> None:
    """Add ``logsdk spool`` and its subcommands."""
    group = add_command(
        sub,
        "spool",
        help="inspect, replay or export a producer's spool directory",
        description=(
            "A LogProducer keeps records Kafka has not acknowledged in an SQLite spool "
            "in its spool dir: one slot per live process (the dir itself is slot 0, "
            "slots/1, slots/2... the others). `status`, `check` and `export` read every "
            "slot read-only, without the producers' locks, so they work while producers "
            "run; `replay` sends to Kafka what the slots no live producer holds contain."
        ),
        examples="""
            logsdk spool status /var/lib/myapp/logsdk
            logsdk spool check /var/lib/myapp/logsdk
            logsdk spool export /var/lib/myapp/logsdk -o pending.jsonl
            logsdk spool replay /var/lib/myapp/logsdk -b kafka1:9092
        """,
    )
    actions = group.add_subparsers(dest="spool_command", required=True, metavar="ACTION")

    st = add_command(
        actions,
        "status",
        help="what the spool holds: records, bytes, oldest/newest, by topic",
        description="Summarise a spool dir (read-only; safe while its producer runs).",
        examples="""
            logsdk spool status /var/lib/myapp/logsdk
            logsdk spool status /var/lib/myapp/logsdk --json | jq .records
        """,
    )
    st.add_argument("dir", type=Path, help="the producer's spool_dir")
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.set_defaults(func=run_status)

    ck = add_command(
        actions,
        "check",
        help="check every slot: integrity, counts, seqs, identity, files (read-only)",
        description=(
            "Check what must hold in every slot of a spool dir: SQLite's integrity_check, "
            "the rows against the summary of the last clean close, no seq twice, every seq "
            "below the reservation, the identity in the database and in state.json alike, "
            "the files' owner and modes; corrupt files moved aside are named. One line per "
            "finding (problem: or note:), then a summary line. Read-only, without the "
            "producers' locks: safe while producers run (a live slot is checked too). "
            "Exit status 0 when no problem was found, 1 when one was, 2 when DIR is not a "
            "spool dir."
        ),
        examples="""
            logsdk spool check /var/lib/myapp/logsdk
            logsdk spool check /var/lib/myapp/logsdk --json | jq '.slots[].findings'
        """,
    )
    ck.add_argument("dir", type=Path, help="the producer's spool_dir")
    ck.add_argument("--json", action="store_true", help="print one JSON object")
    ck.set_defaults(func=run_check)

    ex = add_command(
        actions,
        "export",
        help="write the spooled records as JSON lines",
        description=(
            "Write every spooled record, oldest first, as one JSON object per line: "
            "id, topic, key, value, headers, timestamp (ms), seq, producer. Keys, values "
            'and header values are text when UTF-8, else {"base64": ...}. Read-only; '
            "the spool is not changed."
        ),
        examples="""
            logsdk spool export /var/lib/myapp/logsdk > pending.jsonl
            logsdk spool export /var/lib/myapp/logsdk --rejected -o rejected.jsonl
        """,
    )
    ex.add_argument("dir", type=Path, help="the producer's spool_dir")
    ex.add_argument("-o", "--output", type=Path, default=None, help="file (default: stdout)")
    ex.add_argument(
        "--rejected",
        action="store_true",
        help="export the records Kafka refused (set aside, with their error) instead",
    )
    ex.set_defaults(func=run_export)

    rp = add_command(
        actions,
        "replay",
        help="send the spooled records to Kafka, with progress, until the spool is empty",
        description=(
            "Open a LogProducer on the spool dir and wait until it replayed every record of "
            "the slots no live producer holds (oldest first, each deleted only after Kafka "
            "acknowledged it). A slot a live producer holds is that producer's to deliver: "
            "it is named, not touched, not counted. At the end it prints, per slot and in "
            "total, the records found, replayed, left in the spool and rejected by Kafka "
            "(replayed + left + rejected = found). Exit status 0 when every record found "
            "is in Kafka; 1 when records are left (not delivered within --timeout, "
            "interrupted, or held by a live producer); else 3 when Kafka refused records "
            "(set aside in the spool: `logsdk spool export DIR --rejected`)."
        ),
        examples="""
            logsdk spool replay /var/lib/myapp/logsdk -b kafka1:9092
            logsdk spool replay ./spool -b kafka1:9093 -X security.protocol=SSL --rate 5000
        """,
    )
    rp.add_argument("dir", type=Path, help="the producer's spool_dir")
    add_kafka_options(rp, bootstrap_required=True)
    rp.add_argument(
        "--topic",
        default=None,
        help="topic for health probes (default: the oldest record's); each record "
        "goes to its own topic",
    )
    rp.add_argument("--rate", type=float, default=None, help="at most this many records/s")
    rp.add_argument(
        "--timeout", type=seconds, default=300.0, help="give up after S seconds (default 300)"
    )
    rp.set_defaults(func=run_replay)


# -- reading a spool without its lock --------------------------------------------------------

#: Reads of a slot's main file that changed under them (a producer opening or closing the
#: slot) before its figures are shown with a warning.
_ATTEMPTS = 3
T = TypeVar("T")


def _db_path(directory: Path) -> Path:
    db = directory / DB_NAME
    if not directory.is_dir():
        raise SpoolError(f"{directory} is not a directory")
    if not db.is_file():
        raise SpoolError(f"{directory} is not a spool dir (no {DB_NAME} in it)")
    return db


def read_slot(
    directory: Path, read: Callable[[sqlite3.Connection], T], *, attempts: int = _ATTEMPTS
) -> T:
    """``read(conn)`` on a read-only connection to the slot at ``directory``: it never takes
    the producer's lock and writes neither a row nor a file (:mod:`logsdk.spool._readonly`).
    A read of the main file alone (no ``-wal``/``-shm`` beside it) that the file changed
    under is made again, ``attempts`` times in all; then its result comes with a warning."""
    db = _db_path(directory)
    for attempt in range(1, attempts + 1):
        before = _readonly.file_ids(db)
        immutable = _readonly.needs_immutable(before)
        try:
            result = _read_once(directory, db, immutable, read)
        except sqlite3.Error as exc:
            if immutable and attempt < attempts and _readonly.file_ids(db) != before:
                continue  # likely a torn read: the file changed under it
            raise SpoolError(f"cannot read spool {db}: {exc}") from exc
        if _readonly.misses_wal(before):
            err(f"warning: {db}-wal without -shm: read without the WAL (its newest commits unseen)")
        if not immutable or _readonly.file_ids(db) == before:
            return result
    err(
        f"warning: {db} changed under each of {attempts} read(s) (a producer opening or "
        "closing it): what is shown of it may be off"
    )
    return result


def _read_once(
    directory: Path, db: Path, immutable: bool, read: Callable[[sqlite3.Connection], T]
) -> T:
    try:
        with _readonly.connect(db, immutable=immutable) as conn:
            return read(conn)
    except sqlite3.OperationalError:
        if immutable or os.access(directory, os.W_OK):
            raise
    # A WAL database in a directory we cannot write (its -shm cannot be used): read the
    # main file as it is; the WAL's newest commits are not seen.
    err("warning: spool dir not writable; reading without its WAL (may be stale)")
    with _readonly.connect(db, immutable=True) as conn:
        return read(conn)


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _lock_pid(directory: Path) -> int | None:
    """The pid the producer that last took the slot's lock wrote in ``LOCK`` (the lock
    itself is never touched: trying it would make a starting producer fail)."""
    try:
        pid = int((directory / LOCK_NAME).read_text().strip() or "0")
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def _owner(directory: Path) -> dict[str, Any]:
    """Who last took the lock (pid written in LOCK) and whether it still runs."""
    pid = _lock_pid(directory)
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


def records_left_by_this_process(directory: Path) -> int:
    """The records in the slots of ``directory`` whose ``LOCK`` names this process: the
    slots its producers held (each producer's own, and the free slots they drained), unless
    another process took one since. Read-only; 0 when ``directory`` holds no spool."""
    me, n = os.getpid(), 0
    for index in slot_indexes(directory):
        path = slot_path(directory, index)
        if (path / DB_NAME).is_file() and _lock_pid(path) == me:
            n += read_slot(path, _count_records)
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


def slot_status(directory: Path) -> dict[str, Any]:
    """What one slot holds, as a dict."""
    figures = read_slot(directory, _slot_figures)
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
        "locked_by": _owner(directory),
        "topics": figures["topics"],
    }


def spool_status(directory: Path) -> dict[str, Any]:
    """Everything ``status`` shows, as a dict (see ``--json``): ``slots``, each slot's own
    figures; the sums of every slot's ``records``, ``bytes``, ``file_bytes``,
    ``rejected`` and ``topics``, the oldest and newest of them, every slot's
    ``corrupt_files`` (as paths under ``directory``); and slot 0's ``producer_id``,
    ``locked_by`` and ``seq_range`` (seqs are counted per producer id: each slot has its
    own, in ``slots``)."""
    _db_path(directory)
    slots = []
    for index in slot_indexes(directory):
        path = slot_path(directory, index)
        if (path / DB_NAME).is_file():
            slots.append({"slot": index, **slot_status(path)})
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


def run_status(args: argparse.Namespace) -> int:
    """Print the summary of one spool dir: totals, then a line per slot when it has more
    than one (each slot has its own producer id and seqs)."""
    s = spool_status(args.dir)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    slots = s["slots"]
    if len(slots) == 1:
        owner = s["locked_by"]
        who = f"in use by pid {owner['pid']}" if owner["running"] else "no live producer"
    else:
        live = sum(1 for sl in slots if sl["locked_by"]["running"])
        who = f"{len(slots)} slots, {live} held by a live producer"
    print(f"spool      {s['dir']}  ({who})")
    if len(slots) == 1:
        print(f"producer   {s['producer_id']}")
    print(f"records    {s['records']}  ({s['bytes']:,} bytes counted, {s['file_bytes']:,} on disk)")
    if s["records"]:
        print(f"oldest     {s['oldest']}")
        print(f"newest     {s['newest']}")
    if len(slots) == 1 and s["seq_range"] is not None:
        print(f"seq        {s['seq_range'][0]} .. {s['seq_range'][1]}")
    print(f"rejected   {s['rejected']}  (records Kafka refused, kept for inspection)")
    for name in s["corrupt_files"]:
        print(f"corrupt    {name}  (a damaged spool moved aside; inspect or delete it)")
    if len(slots) > 1:
        print()
        print(
            f"{'slot':>4} {'records':>9} {'rejected':>9} {'bytes':>12}  {'seq':<21} "
            f"{'producer':<33} owner"
        )
        for sl in slots:
            o = sl["locked_by"]
            who = f"pid {o['pid']}" if o["running"] else "none (free)"
            seq = "-" if sl["seq_range"] is None else "{}..{}".format(*sl["seq_range"])
            print(
                f"{sl['slot']:>4} {sl['records']:>9} {sl['rejected']:>9} {sl['bytes']:>12,}  "
                f"{seq:<21} {sl['producer_id'] or '-':<33} {who}"
            )
    if s["topics"]:
        width = max(5, *(len(t) for t in s["topics"]))
        print()
        print(f"{'topic':<{width}} {'records':>9} {'bytes':>12}  oldest -> newest")
        for topic, t in s["topics"].items():
            print(
                f"{topic:<{width}} {t['records']:>9} {t['bytes']:>12,}  "
                f"{t['oldest']} -> {t['newest']}"
            )
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Print the findings of every slot and a summary line; 1 when a problem was found."""
    try:
        result = check_spool_dir(args.dir)
    except SpoolError as exc:  # not a spool dir at all: the command line is wrong
        raise UsageError(str(exc)) from exc
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        for finding in result.findings:
            print(f"{finding.severity}: {finding}")
        print(result.summary())
    return 0 if result.ok else 1


def _field(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _export_rows(
    conn: sqlite3.Connection, out: IO[str], *, rejected: bool, slot: int, producer: Any
) -> int:
    """Write one slot's records (``rejected``: its rejected rows) as JSON lines; how many."""
    table, extra = ("rejected", ", error, at") if rejected else ("records", "")
    written = 0
    cur = conn.execute(
        f"SELECT id, topic, key, value, headers, ts, seq{extra} FROM {table} ORDER BY id"
    )
    while rows := cur.fetchmany(1000):
        for row in rows:
            rid, topic, key, value, hblob, ts, seq = row[:7]
            doc: dict[str, Any] = {
                "id": rid,
                "topic": topic,
                "key": _field(key),
                "value": _field(value),
                "headers": [[k, _field(v)] for k, v in decode_headers(hblob)],
                "timestamp": ts,
                "seq": seq,
                "producer": producer,
                "slot": slot,
            }
            if rejected:
                doc["error"], doc["rejected_at"] = row[7], row[8]
            out.write(json.dumps(doc, ensure_ascii=False) + "\n")
            written += 1
    return written


def run_export(args: argparse.Namespace) -> int:
    """Write the records (or the rejected ones) of every slot as JSON lines, slot by
    slot, oldest first in each."""
    _db_path(args.dir)
    out: IO[str]
    n = 0
    with contextlib.ExitStack() as stack:
        out = (
            stack.enter_context(args.output.open("w", encoding="utf-8"))
            if args.output is not None
            else sys.stdout
        )
        for index in slot_indexes(args.dir):
            path = slot_path(args.dir, index)
            if not (path / DB_NAME).is_file():
                continue
            producer = read_state(path).producer_id
            write = functools.partial(
                _export_rows, out=out, rejected=args.rejected, slot=index, producer=producer
            )
            # Rows are written as they are read: a slot read again would be written twice,
            # so a read the file changed under is only said on stderr.
            n += read_slot(path, write, attempts=1)
        out.flush()
    if args.output is not None:
        print(f"logsdk: exported {n} record(s) to {args.output}", file=sys.stderr)
    return 0


@dataclasses.dataclass
class _ReplaySlot:
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


def _look(path: Path, index: int) -> _ReplaySlot:
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

    n, top, topic, rejected, rejected_all = read_slot(path, figures)
    free, pid = is_free(path), _lock_pid(path)
    return _ReplaySlot(index, path, n, rejected, rejected_all, top, topic, free, pid)


def _left(sl: _ReplaySlot, *, everything: bool = False) -> None:
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

    sl.left, sl.rejected_now = read_slot(sl.path, figures)


def _watch(slots: list[_ReplaySlot]) -> None:
    """Note, from the pid in each slot's LOCK, which slots this process took (the replay's
    producer and its drains) and which another process took first. LOCK keeps the pid of
    the last producer that took the slot, also once it let go."""
    me = os.getpid()
    for sl in slots:
        pid = _lock_pid(sl.path)
        if pid == me:
            sl.ours = True
        elif pid is not None and pid != sl.pid and not sl.ours and sl.taken_by is None:
            sl.taken_by = pid


def run_replay(args: argparse.Namespace) -> int:
    """Open a producer on the dir and show progress until the free slots are delivered.

    The figures are per slot, each read before and after the replay: ``found`` is what the
    free slots held, ``left`` what they hold of it after, ``rejected`` what Kafka refused
    of it meanwhile, and ``replayed`` the rest. A slot a live producer holds is named and
    counted in none of them (nor one another process took before this replay's producer
    could). Exit status 0 when everything found is in Kafka, 1 when records are left
    (timeout, interrupted, or held by a live producer), 3 when Kafka refused records."""
    from logsdk.producer import LogProducer

    _db_path(args.dir)
    looked = []
    for index in slot_indexes(args.dir):
        path = slot_path(args.dir, index)
        if (path / DB_NAME).is_file():
            looked.append(_look(path, index))
    found = [sl for sl in looked if sl.free and sl.records]
    held = [sl for sl in looked if not sl.free and sl.records]
    for sl in held:
        err(
            f"slot {sl.index}: {sl.records} record(s) held by pid {sl.pid}, in use by another "
            "LogProducer, which delivers them itself; not touched"
        )
    if not found:
        if not held:
            print(f"logsdk: spool {args.dir} is empty; nothing to replay", file=sys.stderr)
        return 1 if held else 0
    topic = args.topic or next((sl.topic for sl in found if sl.topic), None)
    if not topic:
        raise UsageError("the spooled records name no topic: give one with --topic")
    kw: dict[str, Any] = {"kafka_config": kafka_config(args)}
    if args.rate is not None:
        kw["replay_max_rate"] = args.rate
    timed_out = interrupted = False
    producer = LogProducer(args.bootstrap, topic, args.dir, **kw)
    try:
        _watch(looked)
        with sigterm_as_interrupt():
            try:
                timed_out = _show_progress(
                    producer, sum(sl.records for sl in found), args.timeout, lambda: _watch(looked)
                )
            except KeyboardInterrupt:
                err("interrupted; what was not acknowledged stays in the spool")
                interrupted = True
        _watch(looked)
    finally:
        # The replay had its timeout: what is left stays in the spool, for a later run.
        producer.close(timeout=0)
    return _report(args, looked, found, held, timed_out, interrupted)


def _report(
    args: argparse.Namespace,
    looked: list[_ReplaySlot],
    found: list[_ReplaySlot],
    held: list[_ReplaySlot],
    timed_out: bool,
    interrupted: bool,
) -> int:
    """Say what became of each slot and in total; the exit status (see run_replay)."""
    counted = []
    for sl in found:
        if sl.taken_by is not None:
            err(
                f"slot {sl.index}: taken by another LogProducer (pid {sl.taken_by}) before this "
                f"replay could; its {sl.records} record(s) are that producer's to deliver, "
                "not counted here"
            )
            continue
        _left(sl)
        counted.append(sl)
        err(
            f"slot {sl.index}: replayed {sl.replayed} of {sl.records} record(s); "
            f"{sl.left} left, {sl.newly_rejected} rejected by Kafka"
        )
        if sl.left and not sl.ours:
            err(f"slot {sl.index}: this replay could not take it (see above); run it again")
    # A slot a live producer held at the look that this replay's producer took over once
    # that producer had let go of it: delivered from too, not counted as found.
    taken_over = [sl for sl in looked if sl.ours and not sl.free]
    for sl in taken_over:
        _left(sl, everything=True)
        err(
            f"slot {sl.index}: pid {sl.pid} let go of it during the replay, which delivered "
            f"from it too (not counted here): {sl.left} record(s) left, "
            f"{sl.rejected_now - sl.rejected_all} rejected by Kafka"
        )
    total = sum(sl.records for sl in counted)
    left = sum(sl.left for sl in counted)
    rejected = sum(sl.newly_rejected for sl in counted)
    replayed = sum(sl.replayed for sl in counted)
    print(
        f"logsdk: replayed {replayed} of {total} record(s); "
        f"{left} left in the spool, {rejected} rejected by Kafka",
        file=sys.stderr,
    )
    if left and timed_out:
        err(f"{left} record(s) not delivered within {args.timeout:g}s")
    refused = rejected + sum(sl.rejected_now - sl.rejected_all for sl in taken_over)
    if refused:
        err(
            f"{refused} record(s) Kafka refused are kept in the spool, set aside: "
            f"`logsdk spool export {shlex.quote(str(args.dir))} --rejected` shows them with "
            "Kafka's error"
        )
    live = held or any(sl.taken_by is not None for sl in found)
    if interrupted or left or live or any(sl.left for sl in taken_over):
        return 1
    return 3 if refused else 0


def _show_progress(
    producer: LogProducer, total: int, timeout: float, every_second: Callable[[], None]
) -> bool:
    """A progress bar on a terminal (a line a second otherwise) until the producer has
    nothing left to deliver; True when ``timeout`` passed first. ``every_second`` is
    called about once a second meanwhile."""
    tty = sys.stderr.isatty()
    deadline = time.monotonic() + timeout
    next_line = 0.0
    while True:
        s = producer.stats()
        left = int(s["undelivered"])
        done = max(0, total - left)
        finished = left == 0
        now = time.monotonic()
        if tty or finished or now >= next_line:
            width = 30
            filled = width * done // max(total, 1)
            bar = "#" * filled + "-" * (width - filled)
            line = f"[{bar}] {done}/{total} ({100 * done // max(total, 1)}%) {s['state']}"
            if tty:
                print(f"\r{line}", end="\n" if finished else "", file=sys.stderr, flush=True)
            else:
                print(line, file=sys.stderr, flush=True)
        if now >= next_line:
            every_second()
            next_line = now + 1.0
        if finished:
            return False
        if now >= deadline:
            if tty:
                print(file=sys.stderr)
            return True
        time.sleep(0.1 if tty else 0.05)
