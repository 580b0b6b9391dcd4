"""The checker: what the producers accepted against what the sink holds, and why.

Rules:

- Every record a producer's ``send()`` accepted (its progress report, written after
  ``send()`` returned) must be in the sink exactly once, except, per producer, at most as
  many as that producer's own counters say its overflow policy dropped or its close lost
  (a record its policy dropped may still have reached Kafka, so drops explain at most
  themselves, and only for the producer that counted them).
- The topic, read once the producers are done, tells where a missing record went
  missing: never in Kafka (producer or broker side) or in Kafka and not stored
  (consumer side). It also gives the wire duplicates, the per-partition order, and the
  holes in each partition's offsets.
- An order violation is a failure unless the record's own delivery report was
  unconfirmed (`logsdk.testing.chaos._history`): such a record was resent and lands
  after records sent later; those are counted apart.
- Any ownership violation a process of the run logged, and any problem ``logsdk spool
  check`` found in a producer's spool, fails the run.

Everything here reads files the run's children wrote, after they ended (the sink may
still be written by the consumers while `wait_for_sink()` polls it: SQLite's locking
keeps the reads whole); it runs on the main thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from logsdk.testing._check import DeliveryReport
from logsdk.testing.chaos._history import Report, delivery_history
from logsdk.testing.chaos._workload import TOPIC, Run

log = logging.getLogger("logsdk.chaos")


@dataclass
class Expected:
    """What the producers' reports say, per producer id."""

    #: The seqs each producer accepted.
    seqs: dict[str, set[int]]
    #: Records its overflow policy dropped, and records its close lost.
    dropped: dict[str, int]
    lost_on_close: dict[str, int]
    #: The total time the producers spent degraded.
    degraded_s: float


@dataclass
class InTopic:
    """What a plain reader found in the topic once the producers were done."""

    wire: DeliveryReport
    #: Holes in each partition's offsets (see `offset_gaps()`).
    gaps: list[str]
    #: Per producer id, the expected seqs the topic holds.
    seqs: dict[str, set[int]]

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.seqs.values())


def expected(reports: list[Path]) -> Expected:
    """From the producers' progress reports: each process's last line counts (a line torn
    by SIGKILL is skipped)."""
    seqs: dict[str, set[int]] = {}
    dropped: dict[str, int] = {}
    lost_on_close: dict[str, int] = {}
    degraded = 0.0
    for path in reports:
        lifetimes: dict[int, dict[str, Any]] = {}
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line torn by SIGKILL
            lifetimes[rec["pid"]] = rec
        for rec in lifetimes.values():
            pid = rec["producer_id"]
            seqs.setdefault(pid, set()).update(
                range(rec["start_seq"], rec["start_seq"] + rec["accepted"])
            )
            dropped[pid] = dropped.get(pid, 0) + rec["dropped"]
            lost_on_close[pid] = lost_on_close.get(pid, 0) + rec.get("lost_on_close", 0)
            degraded += rec["degraded_s"]
    return Expected(seqs, dropped, lost_on_close, degraded)


def read_back(bootstrap: str, exp: Expected) -> InTopic:
    """Read the whole topic once the producers are done: the consumers must store all of
    it. Waiting on this (not on a count) tells a slow consumer from a loss."""
    from logsdk.testing import check_delivery, read_topic

    # The durable broker serves each produced batch as one object from its (moto) S3
    # store: reading ~700k records takes minutes. Give up only after 5 minutes without a record.
    msgs = read_topic(bootstrap, TOPIC, timeout=3600, stall_timeout=300)
    wire = check_delivery(msgs)
    gaps = offset_gaps(msgs)
    del msgs
    seqs = {pid: wire.seqs.get(pid, set()) & want for pid, want in exp.seqs.items()}
    return InTopic(wire, gaps, seqs)


def wait_for_sink(db: Path, want: int, stall_s: float = 90) -> None:
    """Wait until the sink holds ``want`` records, or made no progress for ``stall_s``."""
    last_n, last_change = -1, time.monotonic()
    while True:
        n = sink_count(db)
        if n >= want:
            return
        if n != last_n:
            last_n, last_change = n, time.monotonic()
        elif time.monotonic() - last_change > stall_s:
            log.error("consumers made no progress for %.0f s at %d of %d records", stall_s, n, want)
            return
        time.sleep(0.5)


def sink(db: Path) -> tuple[dict[str, set[int]], int]:
    """The sink's seqs per producer id, and its row count."""
    conn = sqlite3.connect(db, timeout=60)
    try:
        rows = conn.execute("SELECT producer, seq FROM records").fetchall()
    finally:
        conn.close()
    found: dict[str, set[int]] = {}
    for producer, seq in rows:
        found.setdefault(str(producer), set()).add(int(seq))
    return found, len(rows)


def sink_count(db: Path) -> int:
    """Rows in the sink; 0 before the consumers made it."""
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(db, timeout=30)
        try:
            return int(conn.execute("SELECT count(*) FROM records").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.OperationalError:
        return 0


def explain_missing(
    reports: dict[str, dict[int, list[Report]]],
    missing: dict[str, set[int]],
    db: Path,
    limit: int = 5,
) -> dict[str, Any]:
    """What the producers' delivery reports say about each missing record.

    ``unconfirmed``: its last "delivered" report had no offset to confirm it (a duplicate
    sequence reply, see `delivery_history()`);
    ``acked_taken``: acknowledged at an offset where the topic holds another record;
    ``acked_empty``: acknowledged at an offset nobody holds; ``failed_only``: only failure
    reports; ``no_report``: none.
    """
    want = {pid: seqs for pid, seqs in missing.items() if seqs}
    if not want:
        return {}
    conn = sqlite3.connect(db, timeout=60)
    try:
        kinds: dict[str, int] = {}
        examples: list[str] = []
        for pid, seqs in want.items():
            for seq in sorted(seqs):
                got = reports.get(pid, {}).get(seq, [])
                oks = [r for r in got if r[2] == 0]
                if not got:
                    kind = "no_report"
                elif not oks:
                    kind = "failed_only"
                elif oks[-1][3]:
                    kind = "unconfirmed"
                else:
                    part, off = oks[-1][0], oks[-1][1]
                    # By the sink's index (topic, partition, offset): one lookup, not a scan.
                    row = conn.execute(
                        "SELECT producer, seq FROM records "
                        'WHERE topic=? AND partition=? AND "offset"=?',
                        (TOPIC, part, off),
                    ).fetchone()
                    kind = "acked_empty" if row is None else "acked_taken"
                kinds[kind] = kinds.get(kind, 0) + 1
                if len(examples) < limit:
                    examples.append(f"{pid[:8]}:{seq} {kind} {got}")
    finally:
        conn.close()
    return {**kinds, "examples": examples}


def offset_gaps(msgs: list[Any]) -> list[str]:
    """Holes in each partition's offsets, as ``"p<partition>: <first>-<last>"``."""
    by_part: dict[int, list[int]] = {}
    for m in msgs:
        by_part.setdefault(m.partition(), []).append(m.offset())
    out = []
    for part, offsets in sorted(by_part.items()):
        offsets.sort()
        prev = -1  # read from the beginning of a topic nothing was deleted from
        for off in offsets:
            if off > prev + 1:
                out.append(f"p{part}: {prev + 1}-{off - 1}")
            prev = max(prev, off)
    return out


def ownership_violations(work: Path) -> list[str]:
    """The ownership violations the run's children logged (their logs are in ``work``)
    and this process saw."""
    from logsdk import _owner

    found = list(_owner.violations())
    for path in sorted(work.glob("*.log")):
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                if "ownership violation:" in line:
                    found.append(f"{path.name}: {line.strip()}")
    return found


def unexplained_missing(
    lost: dict[str, set[int]], dropped: dict[str, int], lost_on_close: dict[str, int]
) -> dict[str, int]:
    """Per producer id, the missing records its own counters (dropped by policy, lost on
    close) do not explain; producers with none left out."""
    out = {}
    for pid, seqs in lost.items():
        n = len(seqs) - dropped.get(pid, 0) - lost_on_close.get(pid, 0)
        if n > 0:
            out[pid] = n
    return out


def verdict(run: Run, exp: Expected, topic: InTopic, t_start: float) -> dict[str, Any]:
    """The run's verdict: every figure, and ``"ok"`` or ``"FAIL"`` (``t_start``: when the
    run began, by ``time.monotonic()``)."""
    found, rows = sink(run.db)
    in_sink = sum(len(v) for v in found.values())
    lost_sets = {pid: exp.seqs[pid] - found.get(pid, set()) for pid in exp.seqs}
    missing = sum(len(seqs) for seqs in lost_sets.values())
    # Where the missing ones are: never in Kafka (producer/broker side), or in Kafka but
    # not stored (consumer side).
    not_in_topic = sum(len(exp.seqs[pid] - topic.seqs[pid]) for pid in exp.seqs)
    not_consumed = sum(len(topic.seqs[pid] - found.get(pid, set())) for pid in exp.seqs)
    latency = 0.0
    for c in run.consumers:
        with contextlib.suppress(OSError, ValueError):
            latency = max(latency, float((run.work / f"{c.name}.latency").read_text()))
    duplicates = rows - in_sink
    violations = ownership_violations(run.work)
    unexplained = unexplained_missing(lost_sets, exp.dropped, exp.lost_on_close)
    # The delivery reports of the producers whose counters do not explain their missing.
    want = {pid: lost_sets[pid] for pid in unexplained}
    unconfirmed, reports = delivery_history(run.work, want)
    why = explain_missing(reports, want, run.db)
    # A record whose "delivered" report no offset confirmed is resent (the broker did not
    # store it, or it would be a duplicate), so it lands after records sent later: an
    # order violation the broker caused, counted apart.
    wire = topic.wire
    after_unconfirmed = len(wire.split_order_violators(unconfirmed)[0])
    ok = (
        not unexplained
        and duplicates == 0
        and wire.order_violations == after_unconfirmed
        and not violations
        and not run.spool_problems
    )
    return {
        "seed": run.seed,
        "duration_s": run.duration,
        "wall_s": round(time.monotonic() - t_start, 1),
        "accepted": sum(len(v) for v in exp.seqs.values()),
        "in_sink": in_sink,
        "missing": sum(unexplained.values()),
        "missing_raw": missing,
        "not_in_topic": not_in_topic,
        "in_topic_not_in_sink": not_consumed,
        "duplicates": duplicates,
        "dropped": sum(exp.dropped.values()),
        "lost_on_close": sum(exp.lost_on_close.values()),
        "wire_duplicates": wire.duplicates,
        "order_violations": wire.order_violations,
        "order_violations_after_unconfirmed": after_unconfirmed,
        "unconfirmed_reports": sum(len(v) for v in unconfirmed.values()),
        # Offsets the broker assigned but cannot serve: with no transactions a partition's
        # offsets are contiguous, so a hole is a batch the broker appended and then lost
        # (after a SIGKILL). Not a loss by itself: a batch whose ack never arrived is resent.
        # Lost records *without* a hole nearby were never appended at all.
        "offset_gaps": topic.gaps,
        # The producers' delivery reports of the missing records (see explain_missing).
        "missing_reports": why,
        "max_latency_s": round(latency, 3),
        "degraded_s": round(exp.degraded_s, 1),
        "shm": run.shm,
        "max_in_flight": run.max_in_flight,
        "events": [f"{t}s {k}" for t, k in run.events],
        "producer_restarts": sum(p.restarts for p in run.producers),
        "consumer_restarts": sum(c.restarts for c in run.consumers),
        # Lines "ownership violation: ..." that any process of the run logged (and this one).
        "ownership_violations": violations,
        "seq_block": run.seq_block,
        "broker": run.broker_kind,
        # What `logsdk spool check` found wrong in the producers' spools (after each fault).
        "spool_problems": run.spool_problems,
        "verdict": "ok" if ok else "FAIL",
        "work_dir": str(run.work),
    }
