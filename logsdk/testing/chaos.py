"""A Jepsen-style chaos run: a workload, a nemesis and a checker.

``python -m logsdk.testing.chaos --duration 300 --seed N [--json]``

- Workload: several producer processes (LogProducer, memory and shared-memory
  buffers where available) send JSON log records to one topic; a consumer group of
  LogConsumer processes stores them exactly-once in one SQLite file (SQLiteSink with
  dedupe on the logsdk headers).
- Nemesis, on a schedule drawn from ``--seed``: SIGKILL + restart of the (durable)
  broker, SIGSTOP/SIGCONT of the broker, a network cut through the proxy, SIGKILL +
  restart of a producer (only ones whose buffer survives it: ``shm``) and of a
  consumer, and a long cut that fills one producer's small spool to its cap. With
  ``--broker apache`` the broker is Apache Kafka, three nodes (replication factor 3,
  ``min.insync.replicas=2``), and its faults are the leader of a partition SIGKILLed
  and restarted, and one node SIGSTOPped and resumed.
- Checker: every record a producer's ``send()`` accepted (reported by the producer
  as it goes, so a SIGKILL loses no bookkeeping) must be in the sink exactly once,
  except those its own counters say the overflow policy dropped. Ownership checks
  (:mod:`logsdk._owner`) are on in every process of the run, and producers reserve seqs
  in small blocks (``--seq-block``) so that a run crosses many reservations; a violation
  logged by any child fails the run. After each fault, and once the producers have
  closed, every producer's spool dir is checked read-only (``logsdk spool check``): a
  problem found there fails the run too.

The last line with ``--json`` is one JSON object: accepted, in_sink, missing,
duplicates, dropped, max_latency_s, degraded_s, events, verdict. Exit status 1 on
any loss or duplicate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logsdk.testing._settings import FAST_RECOVERY

log = logging.getLogger("logsdk.chaos")

TOPIC = "chaos"
PARTITIONS = 4
RATE = 800  # records/s per producer
SMALL_SPOOL = 150_000  # bytes: the producer whose spool the nemesis fills
#: Seqs reserved at a time by the producers of a run: a 300 s run sends about 240,000
#: records per producer, so each crosses about 60 reservations (2^20 would cross none).
SEQ_BLOCK = 4096
FAST = FAST_RECOVERY


# -- child processes -------------------------------------------------------------------------


def _producer_child(args: argparse.Namespace) -> int:
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
    _trace_acks(p, Path(args.report).with_suffix(".acks"))
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


def _trace_acks(p: Any, path: Path) -> None:
    """Append one line per delivery report to ``path`` (see :func:`trace_deliveries`).

    Part of the checker's history (as a Jepsen history records every operation's
    outcome): a missing record acknowledged at offset -1 got a "duplicate sequence"
    reply, one acknowledged at an offset the topic holds another record at was acked
    and not kept, and one never acknowledged was lost before Kafka. librdkafka's debug
    log (``eos``) goes next to it, with the producer ids and epochs it was given.
    """
    out = open(path, "a", buffering=1)  # noqa: SIM115 - line-buffered: a SIGKILL loses no line
    out.write(f"# pid {os.getpid()}\n")
    rd = logging.getLogger("logsdk.librdkafka")
    h = logging.FileHandler(path.with_suffix(".rdkafka.log"))
    h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    rd.addHandler(h)
    rd.setLevel(logging.DEBUG)
    rd.propagate = False
    trace_deliveries(p, out.write)


def trace_deliveries(p: Any, write: Callable[[str], object]) -> None:
    """Trace the delivery reports of LogProducer ``p``: each report first calls
    ``write("seq partition offset error time\\n")`` (error 0: delivered; offset None: no
    offset given; seq -1: a purged replay report, which has no headers).
    :func:`unconfirmed_seqs` reads these lines back.

    Install it right after the producer is built: the reports of a replay its pump began
    in the meantime (a spool left by a previous process) may be missing.
    """

    def line(seq: int, err: Any, msg: Any) -> None:
        code = 0 if err is None else err.code()
        write(f"{seq} {msg.partition()} {msg.offset()} {code} {time.time():.3f}\n")

    from logsdk.testing import producer_hooks

    producer_hooks(p).trace_reports(line)


def _consumer_child(args: argparse.Namespace) -> int:
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
            """The stored offsets, and offset 0 for a partition with none: the broker
            (Tansu, S3 storage) never deletes records, so every partition starts at 0,
            while its answer to ListOffsets EARLIEST (``auto.offset.reset``) is the base
            offset of the batch it stored first, above 0 when the producers' first
            batches to a partition were stored out of order."""
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


# -- orchestration ---------------------------------------------------------------------------


@dataclass
class Proc:
    """A child process the nemesis may kill and restart."""

    name: str
    cmd: list[str]
    killable: bool
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
    producers: list[Proc] = field(default_factory=list)
    consumers: list[Proc] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    #: Problems ``logsdk spool check`` found in a producer's spool dir, with when.
    spool_problems: list[str] = field(default_factory=list)

    def check_spools(self, when: str) -> None:
        """Check every producer's spool dir (read-only, safe beside live producers)."""
        from logsdk.spool._check import check_spool_dir

        for proc in self.producers:
            spool = Path(proc.cmd[proc.cmd.index("_producer") + 2])
            try:
                result = check_spool_dir(spool)
            except Exception as exc:  # not a spool dir yet (a producer not started)
                if spool.exists():
                    self.spool_problems.append(f"{when}: {proc.name}: {exc}")
                continue
            self.spool_problems += [f"{when}: {proc.name}: {p}" for p in result.problems]


@contextlib.contextmanager
def _reaped(run: Run) -> Iterator[None]:
    """Every producer and consumer child is SIGKILLed when the run ends, however it ends:
    a checker that raised must not leave them reconnecting to a dead broker for ever."""
    try:
        yield
    finally:
        for proc in [*run.producers, *run.consumers]:
            with contextlib.suppress(Exception):
                proc.kill()


def _shm_available() -> bool:
    """True when this build has the shared-memory buffer (``buffer="shm"``)."""
    import importlib.util

    return importlib.util.find_spec("logsdk.shm") is not None


def _nemesis(run: Run, broker: Any, stop: threading.Event) -> None:
    from logsdk.testing import ApacheKafka

    rng = random.Random(run.seed)
    t0 = time.monotonic()
    cluster = isinstance(broker, ApacheKafka)
    # On Apache Kafka's three nodes, the broker faults are a partition's leader killed
    # (its leadership moves, it comes back and catches up) and one node paused; on the
    # embedded broker, the one broker killed or paused.
    kinds = ["leader_kill", "node_pause"] if cluster else ["broker_kill", "broker_pause"]
    kinds += ["net_cut", "consumer_kill", "spool_fill"]
    if any(p.killable for p in run.producers):
        kinds.append("producer_kill")
    while not stop.wait(rng.uniform(3.0, 7.0)):
        if time.monotonic() - t0 > run.duration - 8:
            break  # leave the end of the run quiet, so every fault is healed in it
        kind = rng.choice(kinds)
        at = round(time.monotonic() - t0, 1)
        try:
            if kind == "leader_kill":
                node = broker.leader_of(TOPIC, rng.randrange(PARTITIONS))
                kind = f"leader_kill(node {node})"
                broker.kill(node)
                stop.wait(rng.uniform(1.0, 3.0))
                _ensure_broker(broker)
            elif kind == "node_pause":
                node = rng.choice(broker.node_ids)
                kind = f"node_pause(node {node})"
                broker.pause(node)
                stop.wait(rng.uniform(2.0, 5.0))
                broker.resume(node)
            elif kind == "broker_kill":
                broker.kill()
                stop.wait(rng.uniform(1.0, 3.0))
                _ensure_broker(broker)
            elif kind == "broker_pause":
                broker.pause()
                stop.wait(rng.uniform(2.0, 5.0))
                broker.resume()
            elif kind == "net_cut":
                broker.cut()
                stop.wait(rng.uniform(2.0, 6.0))
                broker.heal()
            elif kind == "spool_fill":
                broker.cut()  # long enough for the small spool to reach its cap
                stop.wait(4.0)
                broker.heal()
            elif kind == "producer_kill":
                victim = rng.choice([p for p in run.producers if p.killable])
                victim.kill()
                victim.restarts += 1
                victim.start(run.work)
            elif kind == "consumer_kill":
                victim = rng.choice(run.consumers)
                victim.kill()
                stop.wait(rng.uniform(0.5, 2.0))
                victim.restarts += 1
                victim.start(run.work)
        except Exception as exc:  # a fault that failed must not end the nemesis
            log.error("nemesis %s failed: %s", kind, exc)
            with contextlib.suppress(Exception):
                broker.heal()
            _ensure_broker(broker)
        run.events.append((at, kind))
        log.warning("nemesis at %.1fs: %s", at, kind)
        run.check_spools(f"after {kind} at {at}s")


def _ensure_broker(broker: Any, attempts: int = 5) -> None:
    """Make sure the broker (every node of a cluster) runs and answers: a restart can fail
    on a loaded machine, and a nemesis that stopped there would leave the rest of the run
    without a broker."""
    from logsdk.testing import ApacheKafka

    for attempt in range(1, attempts + 1):
        try:
            if isinstance(broker, ApacheKafka):
                for node in broker.node_ids:
                    if broker.is_paused(node):
                        broker.resume(node)
                    if not broker.is_running(node):
                        broker.start_node(node)
                return
            if broker.is_paused:
                broker.resume()
            if not broker.is_running():
                broker.restart()
            return
        except Exception as exc:  # BrokerStartError and the like: say so, try again
            log.error("broker restart failed (attempt %d/%d): %s", attempt, attempts, exc)
            if not isinstance(broker, ApacheKafka):
                with contextlib.suppress(Exception):
                    broker.kill()
            time.sleep(2.0)
    raise RuntimeError(f"the broker did not come back after {attempts} restarts")


def _expected(
    reports: list[Path],
) -> tuple[dict[str, set[int]], dict[str, int], float, dict[str, int]]:
    """From the producers' reports, per producer id: expected seqs, dropped by policy,
    lost on close; and the total time spent degraded."""
    expected: dict[str, set[int]] = {}
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
            expected.setdefault(pid, set()).update(
                range(rec["start_seq"], rec["start_seq"] + rec["accepted"])
            )
            dropped[pid] = dropped.get(pid, 0) + rec["dropped"]
            lost_on_close[pid] = lost_on_close.get(pid, 0) + rec.get("lost_on_close", 0)
            degraded += rec["degraded_s"]
    return expected, dropped, degraded, lost_on_close


def _sink(db: Path) -> tuple[dict[str, set[int]], int]:
    conn = sqlite3.connect(db, timeout=60)
    try:
        rows = conn.execute("SELECT producer, seq FROM records").fetchall()
    finally:
        conn.close()
    found: dict[str, set[int]] = {}
    for producer, seq in rows:
        found.setdefault(str(producer), set()).add(int(seq))
    return found, len(rows)


def _sink_count(db: Path) -> int:
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


def chaos(
    seed: int,
    duration: float,
    producers: int = 3,
    consumers: int = 2,
    max_in_flight: int = 1,
    seq_block: int = SEQ_BLOCK,
    broker_kind: str = "embedded",
) -> dict[str, Any]:
    """Run the workload under the nemesis for ``duration`` seconds; return the verdict.

    ``broker_kind``: ``embedded`` (Tansu, durable, behind the proxy) or ``apache`` (Apache
    Kafka, three nodes behind proxies: replication factor 3, ``min.insync.replicas=2``).
    """
    from logsdk import _owner
    from logsdk.producer._identity import ENV_SEQ_BLOCK
    from logsdk.testing import (
        ApacheKafka,
        EmbeddedBroker,
        check_delivery,
        create_topic,
        read_topic,
    )
    from logsdk.testing._apache import TEST_JVM_OPTIONS

    _owner.enable()  # here and in every child (the environment is inherited)
    os.environ[ENV_SEQ_BLOCK] = str(seq_block)

    work = Path(tempfile.mkdtemp(prefix=f"logsdk-chaos-{seed}-"))
    run = Run(seed=seed, duration=duration, work=work)
    shm = _shm_available()
    stopfile = work / "stop"
    db = work / "sink.db"
    me = [sys.executable, "-m", "logsdk.testing.chaos"]
    t_start = time.monotonic()
    broker: EmbeddedBroker | ApacheKafka
    if broker_kind == "apache":
        broker = ApacheKafka(
            nodes=3, proxy=True, workdir=work / "kafka", jvm_options=TEST_JVM_OPTIONS
        )
    else:
        broker = EmbeddedBroker(durable=True, proxy=True)
    with broker, _reaped(run):
        rf = 3 if broker_kind == "apache" else 1
        create_topic(broker.bootstrap_servers, TOPIC, PARTITIONS, replication_factor=rf)
        for i in range(producers):
            # p0: memory buffer with a small spool (the one the nemesis fills);
            # the others: shm when available (they survive a SIGKILL), else memory.
            small = i == 0
            buffer = "shm" if (shm and not small) else "memory"
            cmd = [
                *me,
                "_producer",
                broker.bootstrap_servers,
                str(work / f"p{i}"),
                str(work / f"p{i}.jsonl"),
                str(stopfile),
                "--buffer",
                buffer,
            ]
            if small:
                cmd += ["--spool-max-bytes", str(SMALL_SPOOL)]
            if max_in_flight:
                cmd += ["--max-in-flight", str(max_in_flight)]
            run.producers.append(Proc(f"p{i}", cmd, killable=buffer == "shm"))
        for i in range(consumers):
            cmd = [
                *me,
                "_consumer",
                broker.bootstrap_servers,
                str(db),
                str(work / f"c{i}.latency"),
            ]
            run.consumers.append(Proc(f"c{i}", cmd, killable=True))
        for proc in [*run.producers, *run.consumers]:
            proc.start(work)
        stop = threading.Event()
        nemesis = threading.Thread(target=_nemesis, args=(run, broker, stop), daemon=True)
        nemesis.start()
        stop.wait(duration)
        stop.set()
        nemesis.join(30)
        # Heal everything, let producers close (they flush and spool what is left).
        with contextlib.suppress(Exception):
            broker.heal()
        _ensure_broker(broker)
        stopfile.touch()
        for p in run.producers:
            assert p.popen is not None
            try:
                p.popen.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()
        # Producers closed with Kafka up, so their spools are drained; any left (a close
        # that timed out) is delivered by a fresh producer on the same spool dir.
        _drain_leftover_spools(run, broker.bootstrap_servers)
        run.check_spools("after the producers closed")
        expected, dropped, degraded, lost_on_close = _expected(
            [work / f"p{i}.jsonl" for i in range(producers)]
        )
        total = sum(len(v) for v in expected.values())
        all_dropped = sum(dropped.values())
        # What reached Kafka, read once the producers are done: the consumers must store
        # all of it. Waiting on this (not on a count) tells a slow consumer from a loss.
        # The durable broker serves each produced batch as one object from its (moto) S3
        # store: reading ~700k records takes minutes. Give up only after 5 minutes without a record.
        msgs = read_topic(broker.bootstrap_servers, TOPIC, timeout=3600, stall_timeout=300)
        wire = check_delivery(msgs)
        gaps = _offset_gaps(msgs)
        del msgs
        in_topic = {pid: wire.seqs.get(pid, set()) & exp for pid, exp in expected.items()}
        want = sum(len(v) for v in in_topic.values())
        last_n, last_change = -1, time.monotonic()
        while True:
            n = _sink_count(db)
            if n >= want:
                break
            if n != last_n:
                last_n, last_change = n, time.monotonic()
            elif time.monotonic() - last_change > 90:
                log.error("consumers made no progress for 90 s at %d of %d records", n, want)
                break
            time.sleep(0.5)
        for c in run.consumers:
            if c.popen is not None and c.popen.poll() is None:
                c.popen.send_signal(signal.SIGTERM)
        for c in run.consumers:
            if c.popen is not None:
                try:
                    c.popen.wait(60)
                except subprocess.TimeoutExpired:
                    c.kill()
    found, rows = _sink(db)
    in_sink = sum(len(v) for v in found.values())
    lost_sets = {pid: expected[pid] - found.get(pid, set()) for pid in expected}
    missing_by = {pid: len(seqs) for pid, seqs in lost_sets.items()}
    missing = sum(missing_by.values())
    # Where the missing ones are: never in Kafka (producer/broker side), or in Kafka but
    # not stored (consumer side).
    not_in_topic = sum(len(expected[pid] - in_topic[pid]) for pid in expected)
    not_consumed = sum(len(in_topic[pid] - found.get(pid, set())) for pid in expected)
    latency = 0.0
    for c in run.consumers:
        with contextlib.suppress(OSError, ValueError):
            latency = max(latency, float((work / f"{c.name}.latency").read_text()))
    duplicates = rows - in_sink
    violations = _ownership_violations(work)
    # Only producers whose own drop counters do not explain their missing records.
    unexplained_sets = {
        pid: seqs
        for pid, seqs in lost_sets.items()
        if len(seqs) > dropped.get(pid, 0) + lost_on_close.get(pid, 0)
    }
    unconfirmed, reports = _delivery_history(work, unexplained_sets)
    why = _explain_missing(reports, unexplained_sets, db)
    # A record whose "delivered" report no offset confirmed is resent (the broker did not
    # store it, or it would be a duplicate), so it lands after records sent later: an
    # order violation the broker caused, counted apart.
    after_unconfirmed = len(wire.split_order_violators(unconfirmed)[0])
    order_unexplained = wire.order_violations - after_unconfirmed
    # Per producer: a record its overflow policy dropped may still have reached Kafka (an
    # in-flight send that was purged, spooled, then dropped), so drops can explain at
    # most themselves, and only for the producer that counted them.
    unexplained = sum(
        max(0, n - dropped.get(pid, 0) - lost_on_close.get(pid, 0)) for pid, n in missing_by.items()
    )
    ok = (
        unexplained == 0
        and duplicates == 0
        and order_unexplained == 0
        and not violations
        and not run.spool_problems
    )
    return {
        "seed": seed,
        "duration_s": duration,
        "wall_s": round(time.monotonic() - t_start, 1),
        "accepted": total,
        "in_sink": in_sink,
        "missing": unexplained,
        "missing_raw": missing,
        "not_in_topic": not_in_topic,
        "in_topic_not_in_sink": not_consumed,
        "duplicates": duplicates,
        "dropped": all_dropped,
        "lost_on_close": sum(lost_on_close.values()),
        "wire_duplicates": wire.duplicates,
        "order_violations": wire.order_violations,
        "order_violations_after_unconfirmed": after_unconfirmed,
        "unconfirmed_reports": sum(len(v) for v in unconfirmed.values()),
        # Offsets the broker assigned but cannot serve: with no transactions a partition's
        # offsets are contiguous, so a hole is a batch the broker appended and then lost
        # (after a SIGKILL). Not a loss by itself: a batch whose ack never arrived is resent.
        # Lost records *without* a hole nearby were never appended at all.
        "offset_gaps": gaps,
        # The producers' delivery reports of the missing records (see _explain_missing).
        "missing_reports": why,
        "max_latency_s": round(latency, 3),
        "degraded_s": round(degraded, 1),
        "shm": shm,
        "max_in_flight": max_in_flight,
        "events": [f"{t}s {k}" for t, k in run.events],
        "producer_restarts": sum(p.restarts for p in run.producers),
        "consumer_restarts": sum(c.restarts for c in run.consumers),
        # Lines "ownership violation: ..." that any process of the run logged (and this one).
        "ownership_violations": violations,
        "seq_block": seq_block,
        "broker": broker_kind,
        # What `logsdk spool check` found wrong in the producers' spools (after each fault).
        "spool_problems": run.spool_problems,
        "verdict": "ok" if ok else "FAIL",
        "work_dir": str(work),
    }


#: One delivery report from a producer's trace: partition, offset (-1: none), error code,
#: and whether it is unconfirmed (no offset, or the rest of such a batch: see below).
Report = tuple[int, int, int, bool]


def _delivery_history(
    work: Path, want: dict[str, set[int]]
) -> tuple[dict[str, set[int]], dict[str, dict[int, list[Report]]]]:
    """Read the producers' traces (``p*.acks``): per producer id, the seqs that got an
    *unconfirmed* "delivered" report, and every report of the seqs in ``want``.

    librdkafka turns a "duplicate sequence number" reply into success with the batch's
    base offset -1: the batch's first record has no offset and the rest of it follow at
    once with the offsets 0, 1, 2... (the producer's ``_unconfirmed`` rule, replayed here).
    """
    unconfirmed: dict[str, set[int]] = {}
    reports: dict[str, dict[int, list[Report]]] = {}
    for rep in sorted(work.glob("p*.jsonl")):
        try:
            pid = json.loads(rep.read_text().splitlines()[0])["producer_id"]
        except (IndexError, KeyError, ValueError):
            continue
        acks = rep.with_suffix(".acks")
        if not acks.exists():
            continue
        seqs, mine, doubt = want.get(pid, set()), reports.setdefault(pid, {}), set()
        with acks.open() as f:
            for seq, report in _reports(f):
                if report[3]:
                    doubt.add(seq)
                if seq in seqs:
                    mine.setdefault(seq, []).append(report)
        unconfirmed[pid] = doubt
    return unconfirmed, reports


def _reports(lines: Iterable[str]) -> Iterator[tuple[int, Report]]:
    """``(seq, report)`` for each line written by :func:`trace_deliveries`, in order,
    with the producer's ``_unconfirmed`` rule replayed: a "delivered" report without an
    offset, and the rest of its batch (the same partition, offsets 0, 1, 2... right after
    it), are unconfirmed. A ``#`` line (a new process) and a torn line end a batch."""
    chain: tuple[int, int] | None = None  # (partition, next offset) of a doubtful batch
    for raw in lines:
        parts = raw.split()
        if len(parts) < 4 or raw.startswith("#"):
            chain = None
            continue
        try:
            seq, part, code = int(parts[0]), int(parts[1]), int(parts[3])
            off = -1 if parts[2] == "None" else int(parts[2])
        except ValueError:
            chain = None  # a line torn by SIGKILL
            continue
        bad = False
        if code == 0:
            if off < 0:
                bad, chain = True, (part, 0)
            elif chain == (part, off):
                bad, chain = True, (part, off + 1)
            else:
                chain = None
        else:
            chain = None
        yield seq, (part, off, code, bad)


def unconfirmed_seqs(lines: Iterable[str]) -> set[int]:
    """The seqs whose "delivered" report no offset confirmed, from the lines
    :func:`trace_deliveries` wrote: librdkafka's success after a broker's "duplicate
    sequence number" reply. The producer resends those records; when the broker had
    not in fact stored them (the embedded broker's quirk) they land after records sent
    later, so these seqs explain order violations a reader then sees."""
    return {seq for seq, report in _reports(lines) if report[3]}


def _explain_missing(
    reports: dict[str, dict[int, list[Report]]],
    missing: dict[str, set[int]],
    db: Path,
    limit: int = 5,
) -> dict[str, Any]:
    """What the producers' delivery reports say about each missing record.

    ``unconfirmed``: its last "delivered" report had no offset to confirm it (a duplicate
    sequence reply, see :func:`_delivery_history`); ``acked_taken``: acknowledged at an
    offset where the topic holds another record; ``acked_empty``: acknowledged at an
    offset nobody holds; ``failed_only``: only failure reports; ``no_report``: none.
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


def _offset_gaps(msgs: list[Any]) -> list[str]:
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


def _ownership_violations(work: Path) -> list[str]:
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


def _drain_leftover_spools(run: Run, bootstrap: str) -> None:
    from logsdk import LogProducer

    for p in run.producers:
        spool = Path(p.cmd[p.cmd.index("_producer") + 2])
        db = spool / "spool.db"
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
        if p.cmd[p.cmd.index("--buffer") + 1] == "shm":
            from logsdk.shm import list_segments, segment_name

            if segment_name(None, spool) in list_segments():
                kw["buffer"] = "shm"
        if not left and not kw:
            continue
        log.warning(
            "%s left %d records in its spool (shm ring: %s); draining", p.name, left, bool(kw)
        )
        with LogProducer(bootstrap, TOPIC, spool, **FAST, **kw) as prod:
            deadline = time.monotonic() + 120
            while prod.stats()["spool_records"] and time.monotonic() < deadline:
                time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m logsdk.testing.chaos",
        description="Producers, a consumer group and a nemesis; then count every record.",
        epilog="example: python -m logsdk.testing.chaos --duration 300 --seed 7 --json",
    )
    sub = ap.add_subparsers(dest="role")
    pp = sub.add_parser("_producer")
    for a in ("bootstrap", "spool", "report", "stop"):
        pp.add_argument(a)
    pp.add_argument("--buffer", default="memory")
    pp.add_argument("--spool-max-bytes", type=int, default=0)
    pp.add_argument("--max-in-flight", type=int, default=0)
    cp = sub.add_parser("_consumer")
    for a in ("bootstrap", "db", "latency"):
        cp.add_argument(a)
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help=(
            "producers' max.in.flight.requests.per.connection (default 1 on the embedded "
            "broker: it does not enforce idempotent sequences across its restarts; 0, "
            "librdkafka's default of 5, on Apache Kafka)"
        ),
    )
    ap.add_argument(
        "--seq-block",
        type=int,
        default=SEQ_BLOCK,
        help=f"seqs the producers reserve at a time (default {SEQ_BLOCK}; 2^20 in production)",
    )
    ap.add_argument(
        "--broker",
        choices=("embedded", "apache"),
        default="embedded",
        help=(
            "embedded: Tansu, durable; apache: Apache Kafka, three nodes (leader kills and "
            "node pauses instead of broker kills and pauses)"
        ),
    )
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    ap.add_argument("--results", help="merge chaos.* figures into this results.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("logsdk.librdkafka").setLevel(logging.CRITICAL)
    if args.role == "_producer":
        return _producer_child(args)
    if args.role == "_consumer":
        return _consumer_child(args)
    if args.duration < 20:
        ap.error("--duration must be at least 20 seconds")
    verdict = chaos(
        args.seed,
        args.duration,
        args.producers,
        args.consumers,
        (1 if args.broker == "embedded" else 0)
        if args.max_in_flight is None
        else args.max_in_flight,
        args.seq_block,
        args.broker,
    )
    for k in ("accepted", "in_sink", "missing", "duplicates", "dropped", "max_latency_s"):
        print(f"{k:16} {verdict[k]}")
    print(f"{'degraded_s':16} {verdict['degraded_s']}")
    print(f"{'offset_gaps':16} {len(verdict['offset_gaps'])} {verdict['offset_gaps'][:10]}")
    print(
        f"{'order':16} {verdict['order_violations']} violations, "
        f"{verdict['order_violations_after_unconfirmed']} of them records resent after "
        f"{verdict['unconfirmed_reports']} unconfirmed delivery reports"
    )
    if verdict["missing_reports"]:
        print(f"{'missing_reports':16} {verdict['missing_reports']}")
    print(f"{'events':16} {len(verdict['events'])}: {', '.join(verdict['events'])}")
    print(f"{'spool check':16} {len(verdict['spool_problems'])} problem(s)")
    for line in verdict["spool_problems"][:10]:
        print(f"{'':16} {line}")
    print(f"{'ownership':16} {len(verdict['ownership_violations'])} violation(s)")
    for line in verdict["ownership_violations"][:10]:
        print(f"{'':16} {line}")
    print(f"verdict          {verdict['verdict']}")
    if args.results:
        _merge_results(Path(args.results), verdict)
    if args.json:
        print(json.dumps(verdict))
    return 0 if verdict["verdict"] == "ok" else 1


def _merge_results(path: Path, v: dict[str, Any]) -> None:
    """Write chaos.* figures for this seed into a results.json (other figures kept)."""
    data: dict[str, Any] = {"results": []}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
    params = {
        "seed": v["seed"],
        "duration_s": v["duration_s"],
        "shm": v["shm"],
        "max_in_flight": v.get("max_in_flight"),
        "broker": v.get("broker", "embedded"),
        "verdict": v["verdict"],
    }
    mine = [
        {
            "name": f"chaos.{k}",
            "unit": u,
            "value": v[k],
            "baseline": None,
            "baseline_value": None,
            "ratio": None,
            "goal": g,
            "params": params,
        }
        for k, u, g in (
            ("missing", "records", 0),
            ("duplicates", "records", 0),
            ("accepted", "records", None),
            ("dropped", "records", None),
            ("max_latency_s", "s", None),
            ("degraded_s", "s", None),
        )
    ]
    keep = [
        r
        for r in data.get("results", [])
        if not (
            r["name"].startswith("chaos.")
            and r.get("params", {}).get("seed") == v["seed"]
            and r.get("params", {}).get("broker", "embedded") == params["broker"]
        )
    ]
    data["results"] = keep + mine
    path.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
