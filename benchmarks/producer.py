"""LogProducer throughput and latency against raw baselines measured in the same run.

- producer.memory: LogProducer.send() of N records until all are acknowledged, vs raw
  confluent-kafka doing the same work (``raw_headers_pump``): an idempotent Producer,
  acks=all, an on_delivery callback counting acks, each record carrying the two headers
  every LogProducer record carries (``logsdk.producer``, ``logsdk.seq``: what makes
  dedupe possible), its reports served by a second thread that polls, so that the
  sending loop never blocks on them (what a non-blocking send() needs). Both clients are
  started before the clock (one record sent and acknowledged).
- producer.memory.no_headers (information): the same LogProducer runs against the raw
  Producer without headers, polling inline: what a user pays over the leanest raw loop.
- producer.cpu_us_per_record: process CPU time (``time.process_time``: every thread,
  librdkafka's included) per record of the producer.memory run, LogProducer against
  raw_headers_pump's. Lower is better: the ratio is LogProducer / raw (goal <= 1.15).
- producer.memory.same_headers (information, no goal): the same LogProducer runs against a
  raw producer that sends the two headers and polls inline. confluent-kafka
  charges about 0.6-0.9 µs per produce() call for any headers at all (measured without a
  broker: 0.7 µs without, 1.3-1.8 µs with one or two).
- producer.memory.raw_headers and .raw_headers_pump (information, no goal): the raw producer
  sending the two headers, inline as above, and with its delivery reports served by a second
  thread that polls (the sending loop never polls), both against the raw producer without
  headers: what the headers every record must carry, and serving reports off the sending
  thread (LogProducer's pump), cost confluent-kafka itself before any SDK code runs. They
  bound producer.memory and producer.shm from above.
- producer.send_p99_us: p99 duration of one send() call during the producer.memory run
  (every 8th call is timed).
- producer.spill: records/s into the spool while Kafka is down (send() until all are
  committed), vs a raw batched SQLite insert (executemany, 5000 rows per transaction,
  WAL, the same synchronous setting) of the same rows.
- producer.replay: records/s drained from a full spool to Kafka after recovery
  (replay_max_rate=None), from opening the producer, vs the raw confluent-kafka Producer
  sending the same headers, with its client's start in the clock too;
  producer.replay.no_headers (information): against the raw Producer without headers.
- producer.shm: as producer.memory with buffer="shm" (a 64 MiB ring), against the same
  raw_headers_pump (goal 0.8); producer.shm.no_headers (information) against the raw
  Producer without headers. params also give the resident size of the ring and the
  process's RSS right after the run.

Median of ``--rounds`` alternating rounds, 200-byte and 1 KiB values. Starts its own
embedded broker, a fresh one for each value size and for each producer.shm size, and
deletes each measurement's topic right after it: the embedded broker keeps every record
in memory, and one holding a few GB takes CPU the producers on this machine need
(producer.shm measured 0.40-0.47 after the other figures on one broker, 0.52-0.54 on a
fresh one; the raw 1 KiB rate fell from 190k/s to 150k/s over three rounds).
``--json``: the last line is ``{"results": [...]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import resource
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from _brokers import KINDS, Broker, on_broker, start_broker
from confluent_kafka import KafkaError, Message, Producer

from logsdk import LogProducer
from logsdk.testing import create_topic, delete_topic, free_port

PARTITIONS = 4
SYNC = "NORMAL"
FAST: dict[str, Any] = {
    "probe_interval_s": 0.2,
    "probe_backoff_max_s": 0.2,
    "stall_timeout_s": 10.0,
    "replay_max_rate": None,
    "replay_batch": 5000,
}


class Run(NamedTuple):
    rate: float  # records/s until every record is acknowledged
    cpu_us: float  # process CPU µs per record over the same interval (every thread)


RAW_PUMP = (
    "raw confluent-kafka Producer, idempotent, acks=all, on_delivery, the same two headers, "
    "reports served by a second thread (raw_headers_pump)"
)
RAW_PLAIN = "raw confluent-kafka Producer, idempotent, acks=all, on_delivery, no headers"


@contextlib.contextmanager
def _topic(broker: Broker, name: str) -> Iterator[str]:
    """A topic for one measurement, deleted right after it: the embedded broker keeps
    every record in memory, and one holding a few GB takes CPU the producers on this
    machine need, so each measurement starts from an empty broker."""
    topic = create_topic(broker.bootstrap_servers, f"{name}-{uuid.uuid4().hex[:6]}", PARTITIONS)
    try:
        yield topic
    finally:
        delete_topic(broker.bootstrap_servers, topic)


def _values(n: int, size: int) -> list[bytes]:
    pad = b"x" * (size - 12)
    return [b"%012d" % i + pad for i in range(n)]


def raw_produce(
    broker: Broker,
    topic: str,
    values: list[bytes],
    headers: bool = False,
    started: bool = True,
    pump: bool = False,
) -> Run:
    """Records/s of a raw idempotent producer until every record is acknowledged;
    ``headers``: each record also carries the two headers a LogProducer adds;
    ``started``: its first record is acknowledged before the clock starts (else the clock
    includes the client's start: connection, producer id, metadata);
    ``pump``: a second thread serves the delivery reports (polls), as LogProducer's pump
    does, and the sending loop never polls (on BufferError it waits 1 ms)."""
    acked = 0
    pid_header = ("logsdk.producer", uuid.uuid4().hex.encode())

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    p = Producer(
        {
            **broker.client_config("producer"),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
    if started:  # as the LogProducer measured against it: one record acknowledged first
        p.produce(topic, b"warm-up", on_delivery=on_delivery)
        if p.flush(60) or acked != 1:
            raise RuntimeError("raw producer did not start")
        acked = 0
    stop = threading.Event()

    def serve_reports() -> None:
        while not stop.is_set():
            p.poll(0.01)

    pumper = threading.Thread(target=serve_reports, name="raw-pump", daemon=True)
    if pump:
        pumper.start()
    t0, c0 = time.perf_counter(), time.process_time()
    for i, v in enumerate(values):
        while True:
            try:
                if headers:
                    p.produce(
                        topic,
                        v,
                        b"%d" % (i % 64),
                        headers=[pid_header, ("logsdk.seq", b"%d" % i)],
                        on_delivery=on_delivery,
                    )
                else:
                    p.produce(topic, v, b"%d" % (i % 64), on_delivery=on_delivery)
                break
            except BufferError:
                if pump:
                    stop.wait(0.001)
                else:
                    p.poll(0.01)
        if i % 1000 == 0 and not pump:
            p.poll(0)
    if pump:
        deadline = time.monotonic() + 120
        while acked < len(values) and time.monotonic() < deadline:
            stop.wait(0.001)
        stop.set()
        pumper.join()
    if p.flush(120):
        raise RuntimeError("raw producer did not deliver everything")
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert acked == len(values)
    return Run(len(values) / dt, cpu / len(values) * 1e6)


def _start(p: LogProducer) -> None:
    """Have the producer's client started before the clock, as the raw side's: one record
    sent and acknowledged."""
    p.send(b"warm-up")
    if p.flush(60) or p.stats()["acked"] != 1:
        raise RuntimeError("LogProducer did not start")


def sdk_produce(
    broker: Broker, topic: str, values: list[bytes], spool: Path
) -> tuple[Run, list[int]]:
    """Records/s and CPU µs a record of LogProducer.send() until all acknowledged, and
    per-call ns samples."""
    samples: list[int] = []
    clock = time.perf_counter_ns
    with LogProducer(broker.bootstrap_servers, topic, spool, **FAST) as p:
        _start(p)
        t0, c0 = time.perf_counter(), time.process_time()
        for i, v in enumerate(values):
            if i & 7:
                p.send(v, b"%d" % (i % 64))
                continue
            # Every 8th call is timed: the p99 of an unbiased sample, without charging the
            # throughput two clock reads and an append per record the raw side never pays.
            s = clock()
            p.send(v, b"%d" % (i % 64))
            samples.append(clock() - s)
        if p.flush(120):
            raise RuntimeError("LogProducer did not deliver everything")
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert p.stats()["acked"] == len(values) + 1, p.stats()
    return Run(len(values) / dt, cpu / len(values) * 1e6), samples


def _rss_mib() -> tuple[float, float]:
    """(VmRSS, RssShmem) of this process in MiB, from /proc/self/status (Linux)."""
    fields: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "RssShmem"):
            fields[name] = int(rest.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("RssShmem", 0.0)


def sdk_produce_shm(
    broker: Broker, topic: str, values: list[bytes], spool: Path
) -> tuple[float, float, float]:
    """Records/s of LogProducer(buffer="shm").send() until all acknowledged, and the
    (process RSS, ring resident) MiB measured before close() unmaps the ring."""
    with LogProducer(
        broker.bootstrap_servers, topic, spool, buffer="shm", shm_bytes=64 << 20, **FAST
    ) as p:
        _start(p)
        t0 = time.perf_counter()
        for i, v in enumerate(values):
            p.send(v, b"%d" % (i % 64))
        if p.flush(120):
            raise RuntimeError("LogProducer(buffer='shm') did not deliver everything")
        dt = time.perf_counter() - t0
        assert p.stats()["acked"] == len(values) + 1, p.stats()
        rss, shmem = _rss_mib()
    return len(values) / dt, rss, shmem


def run_shm(broker: Broker, records: int, rounds: int, sizes: list[int]) -> list[dict[str, Any]]:
    """producer.shm: alternating rounds of LogProducer(buffer="shm") and the raw producer."""
    results: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="logsdk-bench-shm-"))
    try:
        for size in sizes:
            values = _values(records, size)
            sdk, raw, pump, rss, shmem = [], [], [], [], []
            for r in range(rounds):
                tag = uuid.uuid4().hex[:6]
                sides = ("sdk", "pump", "raw")
                for side in sides if r % 2 == 0 else sides[::-1]:
                    with _topic(broker, f"{side}-shm") as topic:
                        if side == "raw":
                            raw.append(raw_produce(broker, topic, values).rate)
                        elif side == "pump":
                            pump.append(
                                raw_produce(broker, topic, values, headers=True, pump=True).rate
                            )
                        else:
                            rate, vm, sh = sdk_produce_shm(broker, topic, values, work / tag)
                            sdk.append(rate)
                            rss.append(vm)
                            shmem.append(sh)
            # Median of per-round ratios: each pair ran back to back on the same broker.
            name = "producer.shm" + ("" if size == 200 else f".{size}b")
            params = {"records": records, "value_bytes": size, "rounds": rounds, "shm_mib": 64}
            for fig, base, base_name, goal in (
                (name, pump, RAW_PUMP, 0.8),
                (name + ".no_headers", raw, RAW_PLAIN, None),
            ):
                res = _result(
                    fig,
                    "records/s",
                    statistics.median(sdk),
                    base_name,
                    statistics.median(base),
                    goal,
                    dict(params),
                )
                res["ratio"] = round(
                    statistics.median(a / b for a, b in zip(sdk, base, strict=True)), 3
                )
                res["params"]["rss_after_run_mib"] = round(max(rss), 1)
                res["params"]["ring_resident_mib"] = round(max(shmem), 1)
                results.append(res)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def raw_sqlite(values: list[bytes], directory: Path) -> float:
    """Records/s of a plain batched SQLite insert of the same rows the spool stores."""
    conn = sqlite3.connect(directory / "raw.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={SYNC}")
    conn.execute(
        "CREATE TABLE records (id INTEGER PRIMARY KEY, topic TEXT, key BLOB, value BLOB, "
        "headers BLOB, ts INTEGER, seq INTEGER, size INTEGER)"
    )
    t0 = time.perf_counter()
    now = int(time.time() * 1000)
    for start in range(0, len(values), 5000):
        rows = [
            ("t", b"%d" % (i % 64), values[i], None, now, i, len(values[i]) + 64)
            for i in range(start, min(start + 5000, len(values)))
        ]
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO records (topic, key, value, headers, ts, seq, size) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute("COMMIT")
    dt = time.perf_counter() - t0
    conn.close()
    return len(values) / dt


def sdk_spill(values: list[bytes], spool: Path) -> float:
    """Records/s of send() with Kafka down, until every record is committed to the spool."""
    dead = f"127.0.0.1:{free_port()}"
    p = LogProducer(dead, "spill", spool, spool_synchronous=SYNC, **FAST)
    try:
        # Wait for the first failure to take it DEGRADED, as in a real outage.
        p.send(b"warm-up")
        deadline = time.monotonic() + 30
        while p.stats()["state"] != "DEGRADED" or p.flush_durable(0):
            if time.monotonic() > deadline:
                raise RuntimeError("producer never went DEGRADED")
            time.sleep(0.01)
        t0 = time.perf_counter()
        for i, v in enumerate(values):
            p.send(v, b"%d" % (i % 64))
        if p.flush_durable(120):
            raise RuntimeError("spill did not complete")
        dt = time.perf_counter() - t0
    finally:
        p.close(timeout=0)  # Kafka is down: no use trying to deliver
    return len(values) / dt


def sdk_replay(broker: Broker, topic: str, spool: Path) -> tuple[float, int]:
    """Records/s from opening a producer on a full spool until the spool is empty."""
    t0 = time.perf_counter()
    with LogProducer(broker.bootstrap_servers, topic, spool, **FAST) as p:
        n = p.stats()["recovered_at_start"]
        deadline = time.monotonic() + 300
        while p.stats()["spool_records"] > 0:
            if time.monotonic() > deadline:
                raise RuntimeError("replay did not finish")
            time.sleep(0.005)
        dt = time.perf_counter() - t0
    return n / dt, n


def _result(
    name: str,
    unit: str,
    value: float,
    baseline: str | None,
    baseline_value: float | None,
    goal: float | None,
    params: dict[str, Any],
) -> dict[str, Any]:
    ratio = None if baseline_value is None else round(value / baseline_value, 3)
    return {
        "name": name,
        "unit": unit,
        "value": round(value, 1),
        "baseline": baseline,
        "baseline_value": None if baseline_value is None else round(baseline_value, 1),
        "ratio": ratio,
        "goal": goal,
        "params": params,
    }


def _replay_results(
    size: int,
    sdk: list[float],
    raw_hdr: list[float],
    raw: list[float],
    params: dict[str, Any],
) -> list[dict[str, Any]]:
    name = "producer.replay" + ("" if size == 200 else f".{size}b")
    cold = ", its client's start in the clock"
    return [
        _result(
            name,
            "records/s",
            statistics.median(sdk),
            "raw confluent-kafka Producer, idempotent, acks=all, on_delivery, the same two "
            "headers" + cold,
            statistics.median(raw_hdr),
            0.9,
            params,
        ),
        _result(
            name + ".no_headers",
            "records/s",
            statistics.median(sdk),
            RAW_PLAIN + cold,
            statistics.median(raw),
            None,
            params,
        ),
    ]


def run(
    records: int,
    rounds: int,
    sizes: list[int],
    only: str | None = None,
    broker_kind: str = "embedded",
) -> list[dict[str, Any]]:
    """Every figure; ``only="replay"``: producer.replay alone (the spill that fills its
    spool still runs, unrecorded); ``only="shm"``: producer.shm alone; ``broker_kind``:
    the broker both sides run on (``_brokers.py``)."""
    results: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="logsdk-bench-"))
    try:
        for size in sizes if only != "shm" else []:
            with start_broker(broker_kind) as broker:
                values = _values(records, size)
                params = {"records": records, "value_bytes": size, "rounds": rounds}
                mem_sdk, mem_raw, mem_hdr, mem_pump, p99s = [], [], [], [], []
                cpu_sdk, cpu_pump = [], []
                spill_sdk, spill_raw = [], []
                rep_sdk, rep_raw, rep_hdr = [], [], []
                for r in range(rounds):
                    tag = uuid.uuid4().hex[:6]
                    # Alternate which side goes first, so drift favours neither.
                    first_sdk = r % 2 == 0
                    sides = ("sdk", "raw", "hdr", "pump")
                    for side in sides if first_sdk else sides[::-1]:
                        if only == "replay":
                            break
                        with _topic(broker, side) as t:
                            if side == "raw":
                                mem_raw.append(raw_produce(broker, t, values).rate)
                            elif side == "hdr":
                                mem_hdr.append(raw_produce(broker, t, values, headers=True).rate)
                            elif side == "pump":
                                run_ = raw_produce(broker, t, values, headers=True, pump=True)
                                mem_pump.append(run_.rate)
                                cpu_pump.append(run_.cpu_us)
                            else:
                                run_, samples = sdk_produce(broker, t, values, work / f"m-{tag}")
                                mem_sdk.append(run_.rate)
                                cpu_sdk.append(run_.cpu_us)
                                samples.sort()
                                p99s.append(samples[int(len(samples) * 0.99)] / 1000)
                    for side in ("sdk", "raw") if first_sdk else ("raw", "sdk"):
                        if side == "raw":
                            if only == "replay":
                                continue
                            d = work / f"raw-{tag}"
                            d.mkdir()
                            spill_raw.append(raw_sqlite(values, d))
                        else:
                            spill_sdk.append(sdk_spill(values, work / f"s-{tag}"))
                    sides = ("sdk", "hdr", "raw")
                    for side in sides if first_sdk else sides[::-1]:
                        with _topic(broker, f"{side}-replay") as t:
                            # The replay's clock includes its client's start and the probes
                            # that confirm Kafka is back: the raw side's includes its
                            # client's start.
                            if side == "raw":
                                rep_raw.append(raw_produce(broker, t, values, started=False).rate)
                            elif side == "hdr":
                                rep_hdr.append(
                                    raw_produce(broker, t, values, headers=True, started=False).rate
                                )
                            else:
                                rate, n = sdk_replay(broker, t, work / f"s-{tag}")
                                assert n == records + 1, n  # + the warm-up record
                                rep_sdk.append(rate)
                med = statistics.median
                if only == "replay":
                    results.extend(_replay_results(size, rep_sdk, rep_hdr, rep_raw, params))
                    continue
                sfx = "" if size == 200 else f".{size}b"
                results.append(
                    _result(
                        f"producer.memory{sfx}",
                        "records/s",
                        med(mem_sdk),
                        RAW_PUMP,
                        med(mem_pump),
                        0.9,
                        params,
                    )
                )
                results.append(
                    _result(
                        f"producer.cpu_us_per_record{sfx}",
                        "µs",
                        med(cpu_sdk),
                        "process CPU µs a record of raw_headers_pump (lower is better)",
                        med(cpu_pump),
                        1.15,
                        {**params, "lower_is_better": True},
                    )
                )
                # Information, no goal: LogProducer against the raw producer without headers
                # and with the headers polling inline; what the two headers alone cost raw
                # confluent-kafka, and the headers with the reports served by a second
                # thread (LogProducer's shape, producer.memory's baseline).
                inline = RAW_PLAIN + ", polling inline"
                for name, rates, base_name, base in (
                    ("no_headers", mem_sdk, inline, mem_raw),
                    (
                        "same_headers",
                        mem_sdk,
                        "raw Producer sending the two headers, inline",
                        mem_hdr,
                    ),
                    ("raw_headers", mem_hdr, inline, mem_raw),
                    ("raw_headers_pump", mem_pump, inline, mem_raw),
                ):
                    results.append(
                        _result(
                            f"producer.memory{sfx}.{name}",
                            "records/s",
                            med(rates),
                            base_name,
                            med(base),
                            None,
                            params,
                        )
                    )
                results.append(
                    _result(
                        "producer.send_p99_us" + ("" if size == 200 else f".{size}b"),
                        "µs",
                        med(p99s),
                        None,
                        None,
                        50,
                        params,
                    )
                )
                results.append(
                    _result(
                        "producer.spill" + ("" if size == 200 else f".{size}b"),
                        "records/s",
                        med(spill_sdk),
                        f"raw batched SQLite insert, WAL, synchronous={SYNC}",
                        med(spill_raw),
                        0.8,
                        params,
                    )
                )
                results.extend(_replay_results(size, rep_sdk, rep_hdr, rep_raw, params))
        if only in (None, "shm"):
            for size in sizes:
                with start_broker(broker_kind) as broker:
                    results.extend(run_shm(broker, records, rounds, [size]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for r in results:
        r["params"]["peak_rss_mib"] = round(rss_mib, 1)
    return on_broker(results, broker_kind)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="200,1024", help="value sizes in bytes, comma list")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    ap.add_argument("--only", choices=["replay", "shm"], help="measure this figure alone")
    ap.add_argument(
        "--broker",
        choices=KINDS,
        default="embedded",
        help="the broker both sides run on (apache: Apache Kafka, one node; figures NAME.apache)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = run(args.records, args.rounds, sizes, args.only, args.broker)
    for r in results:
        goal = "" if r["goal"] is None else f" (goal {r['goal']})"
        ratio = "" if r["ratio"] is None else f" ratio {r['ratio']:.3f}{goal}"
        base = "" if r["baseline_value"] is None else f" vs {r['baseline_value']:,.0f}"
        print(f"{r['name']:28} {r['value']:>12,.1f} {r['unit']}{base}{ratio}")
    if args.json:
        print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
