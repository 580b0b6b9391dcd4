"""``logsdk spool status|check|replay|export DIR``: look into a producer's spool, check it,
drain it.

The command line's part: the arguments, what is printed, the exit status. What is read
from the slots, and how, is the library's (`logsdk.spool._status`,
`logsdk.spool._check`); its warnings are printed here as ``logsdk: warning: ...``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import json
import shlex
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

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
from logsdk.spool._codec import decode_headers
from logsdk.spool._database import DB_NAME
from logsdk.spool._slots import slot_indexes, slot_path
from logsdk.spool._state import read_state
from logsdk.spool._status import (
    ReplaySlot,
    count_left,
    look_before_replay,
    read_slot,
    spool_db,
    spool_status,
    watch_takers,
)

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


def run_status(args: argparse.Namespace) -> int:
    """Print the summary of one spool dir: totals, then a line per slot when it has more
    than one (each slot has its own producer id and seqs)."""
    s = spool_status(args.dir, warn=err)
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
    spool_db(args.dir)
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
            n += read_slot(path, write, attempts=1, warn=err)
        out.flush()
    if args.output is not None:
        print(f"logsdk: exported {n} record(s) to {args.output}", file=sys.stderr)
    return 0


def run_replay(args: argparse.Namespace) -> int:
    """Open a producer on the dir and show progress until the free slots are delivered.

    The figures are per slot, each read before and after the replay: ``found`` is what the
    free slots held, ``left`` what they hold of it after, ``rejected`` what Kafka refused
    of it meanwhile, and ``replayed`` the rest. A slot a live producer holds is named and
    counted in none of them (nor one another process took before this replay's producer
    could). Exit status 0 when everything found is in Kafka, 1 when records are left
    (timeout, interrupted, or held by a live producer), 3 when Kafka refused records."""
    from logsdk.producer import LogProducer

    spool_db(args.dir)
    looked = []
    for index in slot_indexes(args.dir):
        path = slot_path(args.dir, index)
        if (path / DB_NAME).is_file():
            looked.append(look_before_replay(path, index, warn=err))
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
        watch_takers(looked)
        with sigterm_as_interrupt():
            try:
                timed_out = _show_progress(
                    producer,
                    sum(sl.records for sl in found),
                    args.timeout,
                    lambda: watch_takers(looked),
                )
            except KeyboardInterrupt:
                err("interrupted; what was not acknowledged stays in the spool")
                interrupted = True
        watch_takers(looked)
    finally:
        # The replay had its timeout: what is left stays in the spool, for a later run.
        producer.close(timeout=0)
    return _report(args, looked, found, held, timed_out, interrupted)


def _report(
    args: argparse.Namespace,
    looked: list[ReplaySlot],
    found: list[ReplaySlot],
    held: list[ReplaySlot],
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
        count_left(sl, warn=err)
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
        count_left(sl, everything=True, warn=err)
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
