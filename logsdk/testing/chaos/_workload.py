"""The workload: producer and consumer child processes, and the run's handles on them.

- A producer child (`producer_child()`) sends JSON log records at ``RATE`` until its
  stop file exists, and appends a progress line to its report (``p<i>.jsonl``) after
  each ``send()`` returned: the checker never expects a record not accepted, and a
  SIGKILL loses no bookkeeping. Its delivery reports go to its trace (``p<i>.acks``,
  `logsdk.testing.chaos._history`).
- A consumer child (`consumer_child()`) stores the topic exactly-once in the shared
  SQLite sink until SIGTERM, and writes the worst send-to-store latency it saw.
- `Proc` and `Run` are the parent's side: the commands, the processes the
  nemesis kills and restarts, the faults it applied and what ``logsdk spool check``
  found. Each file of the run directory has one writer: a report, trace or latency file
  its child, the sink the consumer group (through SQLite's locking).

Owners: a `Proc` is started, killed and restarted by the main thread before and
after the nemesis runs, and by the nemesis thread while it runs (never both: the main
thread waits for the nemesis to end first). ``Run.events`` and ``Run.spool_problems``
follow the same rule.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logsdk.testing._settings import FAST_RECOVERY
from logsdk.testing.chaos._history import trace_acks

log = logging.getLogger("logsdk.chaos")

TOPIC = "chaos"
PARTITIONS = 4
RATE = 800  # records/s per producer
SMALL_SPOOL = 150_000  # bytes: the producer whose spool the nemesis fills
#: Seqs reserved at a time by the producers of a run: a 300 s run sends about 240,000
#: records per producer, so each crosses about 60 reservations (2^20 would cross none).
SEQ_BLOCK = 4096
FAST = FAST_RECOVERY
#: How the parent starts a child of the run (``_producer`` or ``_consumer`` follows).
CHILD = [sys.executable, "-m", "logsdk.testing.chaos"]


# -- in the child processes ------------------------------------------------------------------


def producer_child(args: argparse.Namespace) -> int:
    """Send records until ``stop`` exists; append progress lines to ``report``."""
    from logsdk import LogProducer

    kw: dict[str, Any] = dict(FAST)
    # Batches of ~200 records (200 records/s per partition and producer) rather than a
    # handful: the durable broker stores each batch as one S3 object and lists all of a
    # partition's objects on every fetch (moto spends most of its time serialising those
    # listings), so reading back costs about the square of the batch count: at 50 ms a run
    # took 10-30 min to read back, at 200 ms about 10. Still well under the 3 s stall
    # timeout, and every broker kill now catches larger batches in flight.
    kw["kafka_config"] = {**kw["kafka_config"], "linger.ms": 1000}
    if args.max_in_flight:
        kw["kafka_config"] = {
            **kw["kafka_config"],
            "max.in.flight.requests.per.connection": args.max_in_flight,
        }
    if args.spool_max_bytes:
        kw["spool_max_bytes"] = args.spool_max_bytes
        kw["when_full"] = "drop_oldest"
    if args.buffer == "shm":
        kw["buffer"] = "shm"
    # librdkafka's idempotence log (producer ids, epochs, "duplicate sequence" replies):
    # what the checker needs to tell a broker that acked without appending from a loss.
    kw["kafka_config"] = {**kw["kafka_config"], "debug": "eos"}
    p = LogProducer(args.bootstrap, TOPIC, args.spool, **kw)
    trace_acks(p, Path(args.report).with_suffix(".acks"))
    stop = Path(args.stop)
    report = open(args.report, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    start_seq = p.stats().get("next_seq")
    accepted = 0
    interval = 1.0 / RATE
    next_t = time.monotonic()
    name = Path(args.spool).name

    def write(final: bool) -> None:
        s = p.stats()
        line = {
            "pid": os.getpid(),
            "producer_id": s["producer_id"],
            "start_seq": start_seq,
            "accepted": accepted,
            "dropped": s["dropped"],
            "degraded_s": s["degraded_s"],
            "final": final,
            "lost_on_close": s["errors"].get("lost_on_close", 0),
        }
        report.write(json.dumps(line) + "\n")

    while not stop.exists():
        for _ in range(20):
            doc = {"producer": name, "n": accepted, "level": "INFO", "message": "chaos"}
            p.send(doc, key=str(accepted % 16))
            accepted += 1
        # Written after send() returned: the checker never expects a record not accepted.
        write(final=False)
        next_t += 20 * interval
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    p.close(timeout=60)
    write(final=True)
    report.close()
    return 0


def consumer_child(args: argparse.Namespace) -> int:
    """Consume exactly-once into the shared SQLite sink until SIGTERM."""
    from logsdk import LogConsumer, Record
    from logsdk.consumer import TopicPartition
    from logsdk.sinks import SQLiteSink

    lat_path = Path(args.latency)
    # Assignments, revocations and losses, in the child's log: what a stalled group did.
    logging.getLogger("logsdk.consumer").setLevel(logging.INFO)

    class TimedSink(SQLiteSink):
        """SQLiteSink that also records the worst send-to-store latency it saw."""

        worst = 0.0

        def process(self, records: Any) -> None:
            now = time.time() * 1000
            batch: list[Record] = list(records)
            worst = max(((now - (r.timestamp or now)) / 1000 for r in batch), default=0.0)
            if worst > TimedSink.worst:
                TimedSink.worst = worst
                lat_path.write_text(f"{worst:.3f}")
            super().process(batch)

        def stored_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
            """The stored offsets, and offset 0 for a partition with none: the run's
            topic is new and nothing is deleted from it during a run (Tansu never
            deletes; Apache Kafka's retention is days), so every partition starts at 0,
            while Tansu's answer to ListOffsets EARLIEST (``auto.offset.reset``) is the
            base offset of the batch it stored first, above 0 when the producers' first
            batches to a partition were stored out of order. A start that was deleted
            would be answered out of range, and the consumer would reset to the
            earliest offset (``auto.offset.reset``)."""
            stored = super().stored_offsets(partitions)
            return {tp: stored.get(tp, 0) for tp in partitions}

    c = LogConsumer(
        args.bootstrap,
        "chaos",
        [TOPIC],
        TimedSink(args.db, dedupe=True),
        semantics="exactly_once",
        workers=2,
        kafka_config={"session.timeout.ms": 2000, "heartbeat.interval.ms": 300},
    )
    c.run()
    return 0


# -- in the parent ---------------------------------------------------------------------------


@dataclass
class Proc:
    """A child process the nemesis may kill and restart."""

    name: str
    cmd: list[str]
    killable: bool
    #: A producer's spool dir and buffer ("memory" or "shm"); None and "" for a consumer.
    spool: Path | None = None
    buffer: str = ""
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    def start(self, log_dir: Path) -> None:
        out = open(log_dir / f"{self.name}.log", "ab")  # noqa: SIM115 - handed to the child
        self.popen = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT)
        out.close()

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)


@dataclass
class Run:
    """Everything one chaos run creates and counts."""

    seed: int
    duration: float
    work: Path
    broker_kind: str = "embedded"
    max_in_flight: int = 1
    seq_block: int = SEQ_BLOCK
    #: Whether the producers that may be SIGKILLed use the shared-memory buffer.
    shm: bool = False
    producers: list[Proc] = field(default_factory=list)
    consumers: list[Proc] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    #: Problems ``logsdk spool check`` found in a producer's spool dir, with when.
    spool_problems: list[str] = field(default_factory=list)

    @property
    def db(self) -> Path:
        """The consumers' SQLite sink."""
        return self.work / "sink.db"

    @property
    def stopfile(self) -> Path:
        """Created when the producers are to close."""
        return self.work / "stop"

    @property
    def reports(self) -> list[Path]:
        """The producers' progress reports."""
        return [self.work / f"{p.name}.jsonl" for p in self.producers]

    def check_spools(self, when: str) -> None:
        """Check every producer's spool dir (read-only, safe beside live producers)."""
        from logsdk.spool._check import check_spool_dir

        for proc in self.producers:
            assert proc.spool is not None
            try:
                result = check_spool_dir(proc.spool)
            except Exception as exc:  # not a spool dir yet (a producer not started)
                if proc.spool.exists():
                    self.spool_problems.append(f"{when}: {proc.name}: {exc}")
                continue
            self.spool_problems += [f"{when}: {proc.name}: {p}" for p in result.problems]


def shm_available() -> bool:
    """True when this build has the shared-memory buffer (``buffer="shm"``)."""
    import importlib.util

    return importlib.util.find_spec("logsdk.shm") is not None


def start(run: Run, bootstrap: str, producers: int, consumers: int) -> None:
    """Start the producers and the consumer group on ``bootstrap``.

    p0 has a memory buffer and a small spool (the one the nemesis fills); the others
    ``shm`` when ``run.shm`` (they survive a SIGKILL, so the nemesis may kill them), else
    memory.
    """
    work = run.work
    for i in range(producers):
        small = i == 0
        buffer = "shm" if (run.shm and not small) else "memory"
        spool = work / f"p{i}"
        cmd = [*CHILD, "_producer", bootstrap, str(spool), str(work / f"p{i}.jsonl")]
        cmd += [str(run.stopfile), "--buffer", buffer]
        if small:
            cmd += ["--spool-max-bytes", str(SMALL_SPOOL)]
        if run.max_in_flight:
            cmd += ["--max-in-flight", str(run.max_in_flight)]
        run.producers.append(Proc(f"p{i}", cmd, buffer == "shm", spool, buffer))
    for i in range(consumers):
        cmd = [*CHILD, "_consumer", bootstrap, str(run.db), str(work / f"c{i}.latency")]
        run.consumers.append(Proc(f"c{i}", cmd, killable=True))
    for proc in [*run.producers, *run.consumers]:
        proc.start(work)


def stop_producers(run: Run, timeout: float = 120) -> None:
    """Tell the producers to close (they flush and spool what is left) and wait for each
    for ``timeout`` seconds; SIGKILL one that did not end."""
    run.stopfile.touch()
    for p in run.producers:
        assert p.popen is not None
        try:
            p.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()


def drain_leftover_spools(run: Run, bootstrap: str) -> None:
    """Deliver what a producer left in its spool or shm ring (a close that timed out),
    with a fresh producer on the same spool dir."""
    from logsdk import LogProducer

    for p in run.producers:
        assert p.spool is not None
        db = p.spool / "spool.db"
        left = 0
        if db.exists():
            conn = sqlite3.connect(db)
            try:
                left = int(conn.execute("SELECT count(*) FROM records").fetchone()[0])
            finally:
                conn.close()
        # A shm producer that died without close() (not only by the nemesis) left its
        # unacknowledged records in its segment: a producer with buffer="shm" resends them.
        kw: dict[str, Any] = {}
        if p.buffer == "shm":
            from logsdk.shm import list_segments, segment_name

            if segment_name(None, p.spool) in list_segments():
                kw["buffer"] = "shm"
        if not left and not kw:
            continue
        log.warning(
            "%s left %d records in its spool (shm ring: %s); draining", p.name, left, bool(kw)
        )
        with LogProducer(bootstrap, TOPIC, p.spool, **FAST, **kw) as prod:
            deadline = time.monotonic() + 120
            while prod.stats()["spool_records"] and time.monotonic() < deadline:
                time.sleep(0.1)


def stop_consumers(run: Run, timeout: float = 60) -> None:
    """SIGTERM the consumers and wait for each for ``timeout`` seconds; SIGKILL one that
    did not end."""
    for c in run.consumers:
        if c.popen is not None and c.popen.poll() is None:
            c.popen.send_signal(signal.SIGTERM)
    for c in run.consumers:
        if c.popen is not None:
            try:
                c.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                c.kill()


@contextlib.contextmanager
def reaped(run: Run) -> Iterator[None]:
    """Every producer and consumer child is SIGKILLed when the run ends, however it ends:
    a checker that raised must not leave them reconnecting to a dead broker for ever."""
    try:
        yield
    finally:
        for proc in [*run.producers, *run.consumers]:
            with contextlib.suppress(Exception):
                proc.kill()
