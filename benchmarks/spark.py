"""spark_sink source throughput against a raw confluent-kafka loop measured in the same run.

- spark.source: rows/s of ``logsdk-kafka`` -> ``noop`` sink on ``local[2,2]``, an
  availableNow query over ``--records`` records in ``--triggers`` triggers
  (maxOffsetsPerTrigger), timed from the first trigger's start to the last one's end
  (the running query), vs a raw confluent-kafka Consumer reading the same records by
  assign (no group), touching every value, timed from its first batch (a loop already
  reading, as the consumer.* baselines; params also give the raw rate timed from
  ``Consumer()`` and the ratio against it). The trigger's clock includes its tasks'
  consumers starting: the source builds one per partition per trigger. Median of
  ``--rounds`` alternating rounds; the ratio is the median of per-round ratios.
- spark.source_end_to_end: the same, timed from ``start()`` to termination (it includes
  the query start: Spark starts the source's Python runner process), vs the raw loop timed
  from ``Consumer()``.
- spark.query_start: seconds from ``start()`` to the first trigger.
- spark.batch_overhead: Spark's own time per trigger outside writing rows
  (``triggerExecution - addBatch`` from the query progress; planning, offset WAL, commit).
- spark.source_in_batch: rows/s inside ``addBatch`` (2 tasks in parallel), for context.

Starts its own embedded broker; a warm-up query pays the first-batch cost (Python
workers, JIT) before anything is timed. ``--json``: the last line is ``{"results": [...]}``.

``--cluster``: the same figures again (names ending ``.cluster``) with the driver in this
process and the executors on a Spark standalone cluster on this machine
(:class:`spark_sink.standalone.StandaloneCluster`: a master and two workers, one core
each), against the same raw loop in the same rounds; the ``local[2,2]`` figures first.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from logsdk.testing import EmbeddedBroker, create_topic
from spark_sink import local_session
from spark_sink.standalone import StandaloneCluster

PARTITIONS = 4


def produce(bootstrap: str, topic: str, n: int, value_bytes: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    pad = b"x" * value_bytes
    for i in range(n):
        while True:
            try:
                p.produce(topic, pad, partition=i % PARTITIONS, headers=[("logsdk.seq", b"%d" % i)])
                break
            except BufferError:
                p.poll(0.05)
        if i % 5000 == 0:
            p.poll(0)
    if p.flush(120):
        raise RuntimeError("benchmark records not delivered")


def raw_consume(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    """Records/s of a plain assign + consume loop over every partition from the start:
    (timed from its first batch, timed from ``Consumer()``).

    The first is the rate of a raw loop already reading (as consumer.*'s baselines): on
    the embedded broker a fresh consumer waits about 0.5 s for its first batch, which a
    long-running reader pays once. The second includes that start.
    """
    t0 = time.perf_counter()
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"raw-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got, first = 0, 0.0
    deadline = time.monotonic() + 120
    try:
        while got < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw consumer got {got}/{n}")
            msgs = c.consume(10_000, 1.0)
            if msgs and not first:
                first = time.perf_counter()
            for m in msgs:
                if m.error() is None:
                    m.value()
                    got += 1
        t1 = time.perf_counter()
        return n / (t1 - first), n / (t1 - t0)
    finally:
        c.close()


def _at(progress: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


def spark_run(spark: Any, bootstrap: str, topic: str, n: int, per_trigger: int) -> dict[str, float]:
    """One availableNow query over ``n`` records, ``per_trigger`` records per trigger.

    Returns rows/s while running (first trigger start to last trigger end), rows/s end
    to end (``start()`` to termination), seconds from ``start()`` to the first trigger,
    Spark's time per trigger outside ``addBatch``, and rows/s inside ``addBatch``.
    """
    df = (
        spark.readStream.format("logsdk-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_trigger))
        .load()
    )
    t0 = time.time()
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-spark-"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        if not query.awaitTermination(300):
            raise RuntimeError("spark query did not finish in 300 s")
        t1 = time.time()
        batches = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    rows = sum(p["numInputRows"] for p in batches)
    if rows != n:
        raise RuntimeError(f"spark read {rows} rows, expected {n}")
    add = sum(p["durationMs"].get("addBatch", 0) for p in batches) / 1000
    trigger = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
    running = _at(batches[-1]) + batches[-1]["durationMs"]["triggerExecution"] / 1000
    running -= _at(batches[0])
    return {
        "running": n / running,
        "end_to_end": n / (t1 - t0),
        "start": _at(batches[0]) - t0,
        "overhead": (trigger - add) / len(batches),
        "in_batch": n / add,
    }


def measure(
    spark: Any, broker: EmbeddedBroker, args: argparse.Namespace, master: str, tag: str
) -> list[dict[str, Any]]:
    """The figures of one session (``master``), names suffixed with ``tag``."""
    bs = broker.bootstrap_servers
    results: list[dict[str, Any]] = []
    warm = create_topic(bs, f"bench-warm-{uuid.uuid4().hex[:6]}", PARTITIONS)
    produce(bs, warm, 20_000, 200)
    spark_run(spark, bs, warm, 20_000, 10_000)
    per_trigger = max(1, args.records // args.triggers)
    for size in (int(s) for s in args.value_bytes.split(",")):
        topic = create_topic(bs, f"bench-spark-{size}-{uuid.uuid4().hex[:6]}", PARTITIONS)
        produce(bs, topic, args.records, size)
        base: list[float] = []  # raw loop timed from its first batch
        cold: list[float] = []  # the same loop timed from Consumer()
        runs: list[dict[str, float]] = []
        for _ in range(args.rounds):
            started, from_start = raw_consume(bs, topic, args.records)
            base.append(started)
            cold.append(from_start)
            runs.append(spark_run(spark, bs, topic, args.records, per_trigger))

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        def ratio(key: str, runs: list[dict[str, float]] = runs, base: list[float] = base) -> float:
            return statistics.median(r[key] / b for r, b in zip(runs, base, strict=True))

        params = {
            "records": args.records,
            "value_bytes": size,
            "rounds": args.rounds,
            "partitions": PARTITIONS,
            "maxOffsetsPerTrigger": per_trigger,
            "master": master if master != "cluster" else "standalone: 2 workers x 1 core",
        }
        suffix = ("" if size == 200 else f".{size}B") + tag
        baseline = "raw confluent-kafka Consumer loop (assign, no group), from its first batch"
        baseline_cold = "raw confluent-kafka Consumer loop (assign, no group), from Consumer()"
        results += [
            {
                "name": "spark.source" + suffix,
                "unit": "records/s",
                "value": round(med("running")),
                "baseline": baseline,
                "baseline_value": round(statistics.median(base)),
                "ratio": round(ratio("running"), 3),
                "goal": 0.5 if not tag else None,
                "params": {
                    **params,
                    "measured": "first trigger start to last end",
                    # The comparison published before 2026-11-23: both clocks
                    # include a consumer's start.
                    "baseline_cold_value": round(statistics.median(cold)),
                    "ratio_vs_cold": round(ratio("running", base=cold), 3),
                },
            },
            {
                "name": "spark.source_end_to_end" + suffix,
                "unit": "records/s",
                "value": round(med("end_to_end")),
                "baseline": baseline_cold,
                "baseline_value": round(statistics.median(cold)),
                "ratio": round(ratio("end_to_end", base=cold), 3),
                "params": {**params, "measured": "start() to termination"},
            },
            {
                "name": "spark.query_start" + suffix,
                "unit": "s",
                "value": round(med("start"), 3),
                "params": params,
            },
            {
                "name": "spark.batch_overhead" + suffix,
                "unit": "s/trigger",
                "value": round(med("overhead"), 3),
                "params": params,
            },
            {
                "name": "spark.source_in_batch" + suffix,
                "unit": "records/s",
                "value": round(med("in_batch")),
                "params": params,
            },
        ]
    return results


def run_local(args: argparse.Namespace) -> list[dict[str, Any]]:
    with EmbeddedBroker() as broker:
        spark = local_session("logsdk-bench", master="local[2,2]")
        try:
            return measure(spark, broker, args, "local[2,2]", "")
        finally:
            spark.stop()


def run_cluster(args: argparse.Namespace) -> list[dict[str, Any]]:
    if not args.only_cluster:
        cmd = [sys.executable, __file__, "--only-cluster", "--json", "--cluster"]
        cmd += ["--records", str(args.records), "--rounds", str(args.rounds)]
        cmd += ["--triggers", str(args.triggers), "--value-bytes", args.value_bytes]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"the cluster run failed: {out.stderr[-3000:]}")
        results: list[dict[str, Any]] = json.loads(out.stdout.splitlines()[-1])["results"]
        return results
    with (
        EmbeddedBroker() as broker,
        StandaloneCluster(tempfile.mkdtemp(prefix="bench-cluster-")) as cluster,
    ):
        spark = cluster.session("logsdk-bench")
        try:
            return measure(spark, broker, args, "cluster", ".cluster")
        finally:
            spark.stop()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--triggers", type=int, default=1, help="triggers per query (via maxOffsetsPerTrigger)"
    )
    ap.add_argument("--value-bytes", default="200,1024", help="comma list of value sizes")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cluster", action="store_true", help="also on a 2-worker standalone cluster")
    ap.add_argument("--only-cluster", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    results = []
    if args.cluster:
        # One SparkContext per process, and a second one after stop() in the same process
        # failed its Python workers ("failed to connect back"): the cluster's figures
        # come from a child process, a driver of its own.
        local = [] if args.only_cluster else run_local(args)
        results += local + run_cluster(args)
    else:
        results += run_local(args)
    # Every figure in BENCHMARKS.md's schema: a key that does not apply is null.
    keys = ("name", "unit", "value", "baseline", "baseline_value", "ratio", "goal", "params")
    results = [{k: r.get(k) for k in keys} for r in results]
    for r in results:
        extra = "" if r["ratio"] is None else f" ratio={r['ratio']} vs {r['baseline_value']:,}/s"
        print(f"{r['name']:28} {r['value']:>12,} {r['unit']}{extra}")
    if args.json:
        print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
