"""LogConsumer throughput against raw baselines measured in the same run.

- consumer.at_least_once (and .1024b): LogConsumer, no-op handler, 4 workers, vs a raw
  confluent-kafka Consumer loop (consume(1000) batches, touching every value), both with
  LogConsumer's ``fetch.queue.backoff.ms`` (100 ms); 1M records a round at 200 B, 500k at
  1 KiB.
- consumer.exactly_once (and .1024b): LogConsumer(semantics="exactly_once") into
  SQLiteSink, vs a raw batched SQLite insert (executemany, one transaction per 500 rows,
  WAL, synchronous=NORMAL) of the same rows.

Median of ``--rounds`` alternating rounds, 200-byte and 1 KiB values. Starts its own
embedded broker. ``--json``: the last line is ``{"results": [...]}``.

- consumer.rebalance_pause_ms.PROTOCOL (``--figures rebalance``, or ``all``): for each
  ``rebalance`` protocol (eager, cooperative, consumer), three members share 12
  partitions under steady load (``--rate`` records/s) and a fourth joins. A control group
  of one member reads the same topic and never rebalances; a partition's pause is how
  much later than the control the group processed a record of it (so that a broker or
  the producer stalling, which delays both, is not counted). The figure: the longest
  pause of a partition that did not move, over the records the control processed from
  the join until every partition flows at its final owner (baseline: the same under
  eager; goal under cooperative and consumer: no more than one poll of the fetch loop,
  100 ms). Beside it, per protocol: the same in the steady state before the join, the
  pause of the partitions that moved, the time until every partition flows, the
  partitions moved and revoked, and the records processed twice (at-least-once). On
  Apache Kafka (``--nodes``, 3 by default) whatever ``--broker`` says: the consumer
  protocol needs its group coordinator.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _brokers import KINDS, Broker, on_broker, start_broker
from confluent_kafka import Consumer, KafkaError, Message, Producer

from logsdk import LogConsumer, Record
from logsdk.consumer import TopicPartition
from logsdk.sinks import SQLiteSink
from logsdk.testing import ApacheKafka, create_topic

PARTITIONS = 4
BATCH = 500


def produce(config: dict[str, Any], topic: str, n: int, value_bytes: int) -> None:
    p = Producer({**config, "linger.ms": 20, "batch.size": 1_000_000})
    pad = b"x" * value_bytes
    for i in range(n):
        while True:
            try:
                p.produce(
                    topic,
                    pad,
                    partition=i % PARTITIONS,
                    headers=[("logsdk.producer", b"bench"), ("logsdk.seq", b"%d" % i)],
                )
                break
            except BufferError:
                p.poll(0.05)
        if i % 5000 == 0:
            p.poll(0)
    if p.flush(120):
        raise RuntimeError("benchmark records not delivered")


def consumer_config(broker: Broker) -> dict[str, Any]:
    """Both sides' librdkafka settings. ``fetch.queue.backoff.ms`` is LogConsumer's own
    (librdkafka's default is 1 s): with the default, a raw loop over 1M records stalled
    about a second each time its prefetch buffer filled (211k/s), so rounds had to stay
    at 200k records, about 0.2 s each, and single rounds of one run ranged 0.60-1.04."""
    return {
        **broker.client_config("consumer"),
        "auto.offset.reset": "earliest",
        "fetch.queue.backoff.ms": 100,
    }


def raw_consume(broker: Broker, topic: str, n: int) -> float:
    """Records/s of a plain confluent-kafka consume loop with a final commit."""
    c = Consumer(
        {
            **consumer_config(broker),
            "group.id": f"raw-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    # The revoke at close() unassigns itself: confluent-kafka's fallback there can hang for
    # ever (librdkafka issue 4041), as it did once in LogConsumer before it did the same.
    c.subscribe([topic], on_revoke=lambda consumer, _parts: consumer.unassign())
    got, t0 = 0, 0.0
    deadline = time.monotonic() + 120
    try:
        while got < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw consumer got {got}/{n}")
            msgs = c.consume(1000, 1.0)
            if msgs and not t0:
                t0 = time.perf_counter()
            for m in msgs:
                if m.error() is None:
                    m.value()
                    got += 1
        elapsed = time.perf_counter() - t0
        c.commit(asynchronous=False)
    finally:
        c.close()
    return n / elapsed


class Clock:
    """Counts handled records; notes when the first batch came and when n were done."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.t0 = 0.0
        self.t1 = 0.0
        self.done = threading.Event()
        self.lock = threading.Lock()

    def tick(self, k: int) -> None:
        with self.lock:
            if not self.t0:
                self.t0 = time.perf_counter()
            self.count += k
            if self.count >= self.n and not self.t1:
                self.t1 = time.perf_counter()
                self.done.set()


class NoopHandler:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def process(self, records: Sequence[Record]) -> None:
        self.clock.tick(len(records))


class TimedSink(SQLiteSink):
    """SQLiteSink that tells the clock once a batch is durable."""

    clock: Clock

    def process(self, records: Sequence[Record]) -> None:
        self._local.pending_n = len(records)  # type: ignore[attr-defined]
        super().process(records)

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        super().commit(offsets)
        self.clock.tick(getattr(self._local, "pending_n", 0))


def run_consumer(
    broker: Broker, topic: str, n: int, handler: Any, clock: Clock, **kw: Any
) -> float:
    c = LogConsumer(
        group_id=f"lc-{uuid.uuid4().hex}",
        topics=[topic],
        handler=handler,
        workers=4,
        kafka_config=consumer_config(broker),
        **kw,
    )
    with c:
        if not clock.done.wait(180):
            raise RuntimeError(f"LogConsumer handled {clock.count}/{n}: {c.stats()}")
    return n / (clock.t1 - clock.t0)


def rows_like_sink(n: int, value_bytes: int) -> list[tuple[Any, ...]]:
    pad = b"x" * value_bytes
    return [("t", i % PARTITIONS, i // PARTITIONS, None, pad, 0, "bench", i) for i in range(n)]


def raw_sqlite(path: Path, rows: list[tuple[Any, ...]]) -> float:
    """Records/s of executemany inserts, one transaction per BATCH rows."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE records (topic TEXT, partition INTEGER, offset INTEGER, key BLOB, "
            "value BLOB, timestamp INTEGER, producer TEXT, seq INTEGER)"
        )
        conn.execute("CREATE INDEX idx ON records (topic, partition, offset)")
        t0 = time.perf_counter()
        for i in range(0, len(rows), BATCH):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows[i : i + BATCH]
            )
            conn.execute("COMMIT")
        return len(rows) / (time.perf_counter() - t0)
    finally:
        conn.close()


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- rebalancing: a fourth member joins a group of three under steady load ----------------

REBALANCES = ("eager", "cooperative", "consumer")
REBALANCE_PARTITIONS = 12
#: The fetch loop's poll: consume() returns after 0.1 s when fewer records came.
POLL_MS = 100


#: The member index of the control group's one member (see Recorder).
CONTROL = -1


class Recorder:
    """When each member's handler ran a batch of each partition, when each record was first
    processed by the group and by the control (a group of one, reading the same topic, that
    never rebalances), and how often each was processed by the group. Several members'
    handler threads write; the lock guards it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[tuple[float, int, int]] = []  # (time, member, partition)
        self.seen: dict[tuple[int, int], int] = {}
        self.first: dict[tuple[int, int], float] = {}
        self.control: dict[tuple[int, int], float] = {}

    def note(self, member: int, records: Sequence[Record]) -> None:
        now = time.monotonic()
        with self.lock:
            if member == CONTROL:
                for r in records:
                    self.control.setdefault((r.partition, r.offset), now)
                return
            for p in {r.partition for r in records}:
                self.batches.append((now, member, p))
            seen, first = self.seen, self.first
            for r in records:
                key = (r.partition, r.offset)
                seen[key] = seen.get(key, 0) + 1
                first.setdefault(key, now)

    def delay(self, partitions: Sequence[int], start: float, end: float) -> float:
        """The most a record of ``partitions`` that the control processed within [start,
        end] was processed later by the group than by the control: how long the group held
        it beyond what the topic itself did (a stalled broker or producer delays both)."""
        wanted = set(partitions)
        with self.lock:
            return max(
                (
                    self.first[key] - t
                    for key, t in self.control.items()
                    if key[0] in wanted and start <= t <= end and key in self.first
                ),
                default=0.0,
            )

    def first_by(self, member: int, partition: int, after: float) -> float | None:
        with self.lock:
            got = [t for t, m, p in self.batches if m == member and p == partition and t > after]
        return min(got) if got else None


class MemberHandler:
    """A member's at-least-once handler: tells the recorder, takes ``work_s`` a batch."""

    def __init__(self, recorder: Recorder, member: int, work_s: float) -> None:
        self.recorder = recorder
        self.member = member
        self.work_s = work_s

    def process(self, records: Sequence[Record]) -> None:
        if self.work_s:
            time.sleep(self.work_s)  # the handler's own work (a database write, say)
        self.recorder.note(self.member, records)


class SteadyLoad:
    """``rate`` records a second round-robin over the partitions, from a thread."""

    def __init__(self, config: dict[str, Any], topic: str, rate: int) -> None:
        self.config = config
        self.topic = topic
        self.rate = rate
        self.stop = threading.Event()
        self.acked: set[tuple[int, int]] = set()
        self.failed = 0
        self.thread = threading.Thread(target=self.run, name="steady-load", daemon=True)

    def report(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.acked.add((msg.partition(), msg.offset()))  # type: ignore[arg-type]
        else:
            self.failed += 1

    def run(self) -> None:
        p = Producer({**self.config, "linger.ms": 5})
        i, t0 = 0, time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - t0) * self.rate)
            for j in range(i, due):
                p.produce(
                    self.topic,
                    b"x" * 200,
                    partition=j % REBALANCE_PARTITIONS,
                    on_delivery=self.report,
                )
            i = max(i, due)
            p.poll(0)
            self.stop.wait(0.01)
        if p.flush(60):
            raise RuntimeError("steady load: records not delivered")


def _owners(members: Sequence[LogConsumer]) -> dict[int, int] | None:
    """{partition: member index} once the members hold every partition once, each its fair
    share; else None."""
    owner: dict[int, int] = {}
    counts = []
    for i, m in enumerate(members):
        assigned = m.stats()["assigned"]
        counts.append(len(assigned))
        for name in assigned:
            p = int(name.rsplit("[", 1)[1][:-1])
            if p in owner:
                return None
            owner[p] = i
    fair = REBALANCE_PARTITIONS // len(members)
    if len(owner) != REBALANCE_PARTITIONS or any(not fair <= k <= fair + 1 for k in counts):
        return None
    return owner


def _wait(cond: Any, timeout: float, what: str, step: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def rebalance_round(
    cluster: ApacheKafka, rebalance: str, rate: int, steady: float, work_s: float
) -> dict[str, Any]:
    """One protocol, one round: three members balanced under load, a fourth joins."""
    topic = create_topic(
        cluster.bootstrap_servers,
        f"rb-{rebalance}-{uuid.uuid4().hex[:6]}",
        REBALANCE_PARTITIONS,
        replication_factor=cluster.nodes,
    )
    config = dict(cluster.client_config("consumer"))
    if rebalance == "consumer":  # the broker sets the session's timings
        del config["session.timeout.ms"], config["heartbeat.interval.ms"]
    recorder = Recorder()
    group = f"rb-{uuid.uuid4().hex}"

    def member(i: int) -> LogConsumer:
        return LogConsumer(
            group_id=group,
            topics=[topic],
            handler=MemberHandler(recorder, i, work_s),
            workers=4,
            rebalance=rebalance,
            kafka_config=config,
        )

    load = SteadyLoad(cluster.client_config("producer"), topic, rate)
    members = [member(i) for i in range(3)]
    control = LogConsumer(
        group_id=f"{group}-control",
        topics=[topic],
        handler=MemberHandler(recorder, CONTROL, work_s),
        workers=4,
        kafka_config=cluster.client_config("consumer"),
    )
    load.thread.start()
    try:
        control.start()
        for m in members:
            m.start()
        _wait(lambda: _owners(members) is not None, 60, "three members balanced")
        _wait(lambda: len(control.stats()["assigned"]) == REBALANCE_PARTITIONS, 60, "control")
        time.sleep(steady)  # the steady state the join is compared with
        before = _owners(members)
        assert before is not None
        revoked0 = sum(m.stats()["partitions_revoked"] for m in members)
        t_steady = time.monotonic() - steady
        t_join = time.monotonic()
        members.append(member(3).start())
        _wait(lambda: _owners(members) is not None, 60, "four members balanced")
        t_balanced = time.monotonic()
        after = _owners(members)
        assert after is not None
        moved = sorted(p for p in after if after[p] != before[p])

        def flowing(p: int) -> float | None:
            """When ``p`` first ran at its final owner: after the join for one that moved,
            after the group was balanced for one that stayed (under eager it was revoked
            and assigned again meanwhile)."""
            since = t_join if p in moved else t_balanced
            return recorder.first_by(after[p], p, since)

        _wait(
            lambda: all(flowing(p) is not None for p in after),
            60,
            "every partition flowing at its final owner",
        )
        t_done = max(flowing(p) or 0.0 for p in after)
        time.sleep(steady)
        revoked = sum(m.stats()["partitions_revoked"] for m in members[:3]) - revoked0
    finally:
        load.stop.set()
        load.thread.join(90)
    try:
        _wait(
            lambda: load.acked <= recorder.seen.keys() and load.acked <= recorder.control.keys(),
            60,
            "every record processed",
            0.05,
        )
    finally:
        for m in [*members, control]:
            m.stop(10)
    kept = [p for p in after if p not in moved]
    return {
        "unmoved_pause_ms": recorder.delay(kept, t_join, t_done) * 1000,
        "moved_pause_ms": recorder.delay(moved, t_join, t_done) * 1000,
        "balanced_s": t_done - t_join,
        "moved": len(moved),
        "revoked": revoked,
        "processed_twice": sum(1 for k in recorder.seen.values() if k > 1),
        "steady_delay_ms": recorder.delay(range(REBALANCE_PARTITIONS), t_steady, t_join) * 1000,
        "records": len(load.acked),
    }


def rebalance_figures(
    rounds: int, nodes: int, rate: int, steady: float, work_ms: float
) -> list[dict[str, Any]]:
    """Every protocol in each round (alternating), medians over the rounds."""
    runs: dict[str, list[dict[str, Any]]] = {r: [] for r in REBALANCES}
    with ApacheKafka(nodes) as cluster:
        for i in range(rounds):
            for rebalance in REBALANCES:
                got = rebalance_round(cluster, rebalance, rate, steady, work_ms / 1000)
                runs[rebalance].append(got)
                print(
                    f"rebalance round {i + 1} {rebalance:11}: unmoved partitions held "
                    f"{got['unmoved_pause_ms']:.0f} ms at most (steady state "
                    f"{got['steady_delay_ms']:.0f} ms), moved ones {got['moved_pause_ms']:.0f} "
                    f"ms, balanced in {got['balanced_s']:.2f} s, moved {got['moved']}, "
                    f"revoked {got['revoked']}, processed twice {got['processed_twice']}",
                    flush=True,
                )
    med = {
        r: {k: statistics.median(run[k] for run in runs[r]) for k in runs[r][0]} for r in REBALANCES
    }
    eager = med["eager"]["unmoved_pause_ms"]
    results = []
    for r in REBALANCES:
        m = med[r]
        results.append(
            {
                "name": f"consumer.rebalance_pause_ms.{r}",
                "unit": "ms",
                "value": round(m["unmoved_pause_ms"], 1),
                "baseline": "the same under the eager protocol",
                "baseline_value": round(eager, 1),
                "ratio": round(m["unmoved_pause_ms"] / eager, 3) if eager else None,
                # The goal (cooperative and consumer: no more than one poll, POLL_MS) is
                # not a ratio to eager: it is in params, with whether the median meets it.
                "goal": None,
                "params": {
                    "rounds": rounds,
                    "nodes": nodes,
                    "partitions": REBALANCE_PARTITIONS,
                    "rate": rate,
                    "handler_ms": work_ms,
                    "poll_ms": POLL_MS,
                    "within_one_poll": m["unmoved_pause_ms"] <= POLL_MS,
                    **{k: round(v, 3) for k, v in m.items() if k != "unmoved_pause_ms"},
                    "unmoved_pause_ms_rounds": [round(x["unmoved_pause_ms"]) for x in runs[r]],
                },
            }
        )
    return results


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--records", type=int, default=1_000_000, help="records per round (200 B values)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--broker",
        choices=KINDS,
        default="embedded",
        help="the broker both sides run on (apache: Apache Kafka, one node; figures NAME.apache)",
    )
    ap.add_argument(
        "--figures",
        choices=("throughput", "rebalance", "all"),
        default="throughput",
        help="the throughput figures (default), the rebalance ones (Apache Kafka), or both",
    )
    ap.add_argument("--nodes", type=int, default=3, help="rebalance: Apache Kafka nodes")
    ap.add_argument("--rate", type=int, default=2000, help="rebalance: records/s produced")
    ap.add_argument(
        "--steady", type=float, default=3.0, help="rebalance: seconds of steady state around"
    )
    ap.add_argument(
        "--handler-ms", type=float, default=0.0, help="rebalance: handler time per batch"
    )
    args = ap.parse_args(argv)
    if args.records < 1000 or args.rounds < 1:
        ap.error("--records must be >= 1000 and --rounds >= 1")
    logging.basicConfig(level=logging.ERROR)
    results: list[dict[str, Any]] = []
    if args.figures != "rebalance":
        results += throughput_figures(args)
    if args.figures != "throughput":
        results += rebalance_figures(
            args.rounds, args.nodes, args.rate, args.steady, args.handler_ms
        )
    for r in results:
        if r["unit"] == "ms":
            print(f"{r['name']:36} {r['value']:>8,.0f} ms (eager {r['baseline_value']:,.0f} ms)")
            continue
        size = r["params"]["value_bytes"]
        ratio, goal = r["ratio"], r["goal"]
        print(f"{r['name']:36} {size:>5}B {r['value']:>10,}/s ratio {ratio:.3f} (goal {goal})")
    if args.json:
        print(json.dumps({"results": results}))
    return 0


def throughput_figures(args: argparse.Namespace) -> list[dict[str, Any]]:
    """consumer.at_least_once and consumer.exactly_once on ``--broker``."""
    results: list[dict[str, Any]] = []
    with start_broker(args.broker) as broker, tempfile.TemporaryDirectory() as tmp:
        for value_bytes in (200, 1024):
            n = args.records if value_bytes == 200 else args.records // 2
            topic = create_topic(
                broker.bootstrap_servers, f"bench-{value_bytes}-{uuid.uuid4().hex[:6]}", PARTITIONS
            )
            produce(broker.client_config("producer"), topic, n, value_bytes)
            raw, lc, sq, eos = [], [], [], []
            rows = rows_like_sink(n, value_bytes)
            for r in range(args.rounds):
                raw.append(raw_consume(broker, topic, n))
                clock = Clock(n)
                lc.append(run_consumer(broker, topic, n, NoopHandler(clock), clock))
                sq.append(raw_sqlite(Path(tmp) / f"raw-{value_bytes}-{r}.db", rows))
                clock = Clock(n)
                sink = TimedSink(Path(tmp) / f"sink-{value_bytes}-{r}.db")
                sink.clock = clock
                try:
                    eos.append(
                        run_consumer(broker, topic, n, sink, clock, semantics="exactly_once")
                    )
                finally:
                    sink.close()
                print(
                    f"value={value_bytes}B round {r + 1}: raw consume {raw[-1]:,.0f}/s, "
                    f"LogConsumer {lc[-1]:,.0f}/s, raw sqlite {sq[-1]:,.0f}/s, "
                    f"exactly-once {eos[-1]:,.0f}/s",
                    flush=True,
                )
            params = {"records": n, "value_bytes": value_bytes, "rounds": args.rounds, "workers": 4}
            for name, mine, base, baseline, goal in (
                ("consumer.at_least_once", lc, raw, "raw confluent-kafka Consumer loop", 0.8),
                ("consumer.exactly_once", eos, sq, "raw batched SQLite insert, same rows", 0.6),
            ):
                value, base_value = statistics.median(mine), statistics.median(base)
                # Each round pairs a run with its baseline measured just before it; the
                # median of those ratios resists the load other users put on the machine.
                ratio = statistics.median(m / b for m, b in zip(mine, base, strict=True))
                results.append(
                    {
                        # One name per figure: the 1 KiB ones carry the size (as producer's).
                        "name": name if value_bytes == 200 else f"{name}.1024b",
                        "unit": "records/s",
                        "value": round(value),
                        "baseline": baseline,
                        "baseline_value": round(base_value),
                        "ratio": round(ratio, 3),
                        "goal": goal,
                        "params": {**params, "peak_rss_mib": round(peak_rss_mib(), 1)},
                    }
                )
    return on_broker(results, args.broker)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
