"""``logsdk spool status|check|replay|export DIR``: look into a producer's spool, check it,
drain it."""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import quote

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
from logsdk.spool._check import check_spool_dir
from logsdk.spool._slots import is_free, slot_indexes, slot_path
from logsdk.spool._spool import DB_NAME, LOCK_NAME, STATE_NAME, decode_headers

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
            "it is named, not touched. Exit status 1 if records are left at --timeout or "
            "held by a live producer."
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


def _db_path(directory: Path) -> Path:
    db = directory / DB_NAME
    if not directory.is_dir():
        raise SpoolError(f"{directory} is not a directory")
    if not db.is_file():
        raise SpoolError(f"{directory} is not a spool dir (no {DB_NAME} in it)")
    return db


@contextlib.contextmanager
def open_readonly(directory: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection: never takes the producer's lock, never writes a row."""
    db = _db_path(directory)
    uri = f"file:{quote(str(db.resolve()))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            conn.execute("SELECT count(*) FROM records").fetchone()
        except sqlite3.OperationalError:
            conn.close()
            if os.access(directory, os.W_OK):
                raise
            # A WAL database in a directory we cannot write (no -shm can be made):
            # read the main file as it is; the WAL's newest commits are not seen.
            err("warning: spool dir not writable; reading without its WAL (may be stale)")
            conn = sqlite3.connect(f"{uri}&immutable=1", uri=True)
    except sqlite3.Error as exc:
        raise SpoolError(f"cannot read spool {db}: {exc}") from exc
    try:
        yield conn
    except sqlite3.Error as exc:
        raise SpoolError(f"cannot read spool {db}: {exc}") from exc
    finally:
        conn.close()


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _owner(directory: Path) -> dict[str, Any]:
    """Who last took the lock (pid written in LOCK) and whether it still runs.

    The lock itself is never touched: trying it would make a starting producer fail.
    """
    try:
        pid = int((directory / LOCK_NAME).read_text().strip() or "0")
    except (OSError, ValueError):
        return {"pid": None, "running": False}
    if pid <= 0:
        return {"pid": None, "running": False}
    try:
        os.kill(pid, 0)
        running = True
    except ProcessLookupError:
        running = False
    except PermissionError:
        running = True
    return {"pid": pid, "running": running}


def slot_status(directory: Path) -> dict[str, Any]:
    """What one slot holds, as a dict."""
    with open_readonly(directory) as conn:
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
    try:
        state = json.loads((directory / STATE_NAME).read_text())
    except (OSError, ValueError):
        state = {}
    files = [directory / f"{DB_NAME}{s}" for s in ("", "-wal")]
    return {
        "dir": str(directory),
        "producer_id": state.get("producer_id"),
        "records": n,
        "bytes": size,
        "file_bytes": sum(f.stat().st_size for f in files if f.exists()),
        "oldest": _iso(oldest),
        "newest": _iso(newest),
        "seq_range": None if seq_lo is None else [seq_lo, seq_hi],
        "rejected": rejected,
        "corrupt_files": sorted(p.name for p in directory.glob(f"{DB_NAME}.corrupt-*")),
        "locked_by": _owner(directory),
        "topics": topics,
    }


def spool_status(directory: Path) -> dict[str, Any]:
    """Everything ``status`` shows, as a dict (see ``--json``): the totals of every slot,
    ``slots`` (each slot's own figures), and ``producer_id``/``locked_by`` of slot 0."""
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
    first = slots[0]
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
        "corrupt_files": first["corrupt_files"],
        "locked_by": first["locked_by"],
        "topics": dict(sorted(topics.items())),
        "slots": slots,
    }


def run_status(args: argparse.Namespace) -> int:
    """Print the summary of one spool dir."""
    s = spool_status(args.dir)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    owner = s["locked_by"]
    who = f"in use by pid {owner['pid']}" if owner["running"] else "no live producer"
    print(f"spool      {s['dir']}  ({who})")
    print(f"producer   {s['producer_id']}")
    print(f"records    {s['records']}  ({s['bytes']:,} bytes counted, {s['file_bytes']:,} on disk)")
    if s["records"]:
        print(f"oldest     {s['oldest']}")
        print(f"newest     {s['newest']}")
        print(f"seq        {s['seq_range'][0]} .. {s['seq_range'][1]}")
    print(f"rejected   {s['rejected']}  (records Kafka refused, kept for inspection)")
    for name in s["corrupt_files"]:
        print(f"corrupt    {name}  (a damaged spool moved aside; inspect or delete it)")
    if len(s["slots"]) > 1:
        print()
        print(f"{'slot':>4} {'records':>9} {'bytes':>12}  producer                          owner")
        for sl in s["slots"]:
            o = sl["locked_by"]
            who = f"pid {o['pid']}" if o["running"] else "none (free)"
            print(
                f"{sl['slot']:>4} {sl['records']:>9} {sl['bytes']:>12,}  "
                f"{sl['producer_id'] or '-':<33} {who}"
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


def run_export(args: argparse.Namespace) -> int:
    """Write the records (or the rejected ones) of every slot as JSON lines, slot by
    slot, oldest first in each."""
    _db_path(args.dir)
    table, extra = ("rejected", ", error, at") if args.rejected else ("records", "")
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
            try:
                producer = json.loads((path / STATE_NAME).read_text()).get("producer_id")
            except (OSError, ValueError, AttributeError):
                producer = None
            with open_readonly(path) as conn:
                cur = conn.execute(
                    f"SELECT id, topic, key, value, headers, ts, seq{extra} FROM {table} "
                    "ORDER BY id"
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
                            "slot": index,
                        }
                        if args.rejected:
                            doc["error"], doc["rejected_at"] = row[7], row[8]
                        out.write(json.dumps(doc, ensure_ascii=False) + "\n")
                        n += 1
        out.flush()
    if args.output is not None:
        print(f"logsdk: exported {n} record(s) to {args.output}", file=sys.stderr)
    return 0


def run_replay(args: argparse.Namespace) -> int:
    """Open a producer on the dir and show progress until the free slots are delivered."""
    from logsdk.producer import LogProducer

    _db_path(args.dir)
    total, first_topic, held = 0, None, []
    for index in slot_indexes(args.dir):
        path = slot_path(args.dir, index)
        if not (path / DB_NAME).is_file():
            continue
        with open_readonly(path) as conn:
            n, topic = conn.execute(
                "SELECT count(*), (SELECT topic FROM records ORDER BY id LIMIT 1) FROM records"
            ).fetchone()
        if n and is_free(path):
            total += n
            first_topic = first_topic or topic
        elif n:
            held.append((index, n, _owner(path)["pid"]))
    for index, n, pid in held:
        err(
            f"slot {index}: {n} record(s) held by pid {pid}, in use by another LogProducer, "
            "which delivers them itself; not touched"
        )
    if total == 0:
        if not held:
            print(f"logsdk: spool {args.dir} is empty; nothing to replay", file=sys.stderr)
        return 1 if held else 0
    topic = str(args.topic or first_topic)
    kw: dict[str, Any] = {"kafka_config": kafka_config(args)}
    if args.rate is not None:
        kw["replay_max_rate"] = args.rate
    producer = LogProducer(args.bootstrap, topic, args.dir, **kw)
    try:
        with sigterm_as_interrupt():
            try:
                left = _show_progress(producer, total, args.timeout)
            except KeyboardInterrupt:
                err("interrupted; what was not acknowledged stays in the spool")
                left = -1
    finally:
        # The replay had its timeout: what is left stays in the spool, for a later run.
        producer.close(timeout=0)
    rest = sum(sl["records"] for sl in spool_status(args.dir)["slots"]) - sum(n for _, n, _ in held)
    s = producer.stats()
    print(
        f"logsdk: replayed {max(0, total - rest)} of {total} record(s); "
        f"{rest} left in the spool, {s['rejected']} rejected by Kafka",
        file=sys.stderr,
    )
    if rest:
        if left >= 0:
            err(f"{rest} record(s) not delivered within {args.timeout:g}s")
        return 1
    return 1 if held else 0


def _show_progress(producer: LogProducer, total: int, timeout: float) -> int:
    """A progress bar on a terminal (a line a second otherwise); returns records left."""
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
            next_line = now + 1.0
        if finished:
            return 0
        if now >= deadline:
            if tty:
                print(file=sys.stderr)
            return left
        time.sleep(0.1 if tty else 0.05)
