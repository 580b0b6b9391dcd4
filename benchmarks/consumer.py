"""LogConsumer throughput against raw baselines measured in the same run.

- consumer.at_least_once: LogConsumer, no-op handler, 4 workers, vs a raw
  confluent-kafka Consumer loop (consume(1000) batches, touching every value), both with
  LogConsumer's ``fetch.queue.backoff.ms`` (100 ms); 1M records a round at 200 B, 500k at
  1 KiB.
- consumer.exactly_once: LogConsumer(semantics="exactly_once") into SQLiteSink, vs a raw
  batched SQLite insert (executemany, one transaction per 500 rows, WAL, synchronous=NORMAL)
  of the same rows.

Median of ``--rounds`` alternating rounds, 200-byte and 1 KiB values. Starts its own
embedded broker. ``--json``: the last line is ``{"results": [...]}``.
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
from confluent_kafka import Consumer, Producer

from logsdk import LogConsumer, Record
from logsdk.consumer import TopicPartition
from logsdk.sinks import SQLiteSink
from logsdk.testing import create_topic

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
    args = ap.parse_args(argv)
    if args.records < 1000 or args.rounds < 1:
        ap.error("--records must be >= 1000 and --rounds >= 1")
    logging.basicConfig(level=logging.ERROR)
    results = []
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
                        "name": name,
                        "unit": "records/s",
                        "value": round(value),
                        "baseline": baseline,
                        "baseline_value": round(base_value),
                        "ratio": round(ratio, 3),
                        "goal": goal,
                        "params": {**params, "peak_rss_mib": round(peak_rss_mib(), 1)},
                    }
                )
    on_broker(results, args.broker)
    for r in results:
        size = r["params"]["value_bytes"]
        ratio, goal = r["ratio"], r["goal"]
        print(f"{r['name']:24} {size:>5}B {r['value']:>10,}/s ratio {ratio:.3f} (goal {goal})")
    if args.json:
        print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
