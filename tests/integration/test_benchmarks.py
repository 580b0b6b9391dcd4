"""The benchmark scripts still run: each one, with tiny sizes, prints every figure it
documents in the schema of ../shared/BENCHMARKS.md (the figures themselves are meaningless
at these sizes and are not checked; `make bench` measures them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
KEYS = {"name", "unit", "value", "baseline", "baseline_value", "ratio", "goal", "params"}


def run_benchmark(script: str, *args: str) -> list[dict[str, Any]]:
    """``python benchmarks/<script> --json ARGS``: its results, schema checked."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])["results"]
    for r in results:
        assert set(r) == KEYS, r
        assert r["value"] is not None, r
        assert r["value"] >= 0, r
        if r["ratio"] is not None:  # a ratio always comes with the baseline it was taken to
            assert r["baseline_value"], r
    return results


def test_producer_benchmark_prints_every_figure() -> None:
    names = {r["name"] for r in run_benchmark("producer.py", "--records", "2000", "--rounds", "1")}
    for size in ("", ".1024b"):
        for figure in (
            f"producer.memory{size}",
            f"producer.memory{size}.same_headers",
            f"producer.memory{size}.raw_headers",
            f"producer.memory{size}.raw_headers_pump",
            f"producer.memory{size}.no_headers",
            f"producer.cpu_us_per_record{size}",
            f"producer.send_p99_us{size}",
            f"producer.spill{size}",
            f"producer.replay{size}",
            f"producer.replay{size}.no_headers",
            f"producer.shm{size}",
            f"producer.shm{size}.no_headers",
        ):
            assert figure in names, (figure, sorted(names))


def test_consumer_and_placement_benchmarks_print_their_figures() -> None:
    results = run_benchmark("consumer.py", "--records", "2000", "--rounds", "1")
    consumer = {r["name"] for r in results}
    assert {"consumer.at_least_once", "consumer.exactly_once"} <= consumer
    placement = run_benchmark("placement.py")
    assert any(r["name"].startswith("placement.ring.") for r in placement)
    assert any(r["name"].startswith("placement.kafka.") for r in placement)


@pytest.mark.apache_kafka
def test_producer_and_consumer_benchmarks_run_on_apache_kafka() -> None:
    """``--broker apache``: both sides on one Apache Kafka node, the figures named
    ``NAME.apache`` beside the embedded broker's."""
    args = ("--records", "2000", "--rounds", "1", "--broker", "apache")
    producer = {r["name"] for r in run_benchmark("producer.py", *args, "--only", "replay")}
    assert {"producer.replay.apache", "producer.replay.1024b.apache"} <= producer
    consumer = {r["name"] for r in run_benchmark("consumer.py", *args)}
    assert {"consumer.at_least_once.apache", "consumer.exactly_once.apache"} <= consumer


def test_handler_benchmark_prints_its_figures() -> None:
    results = run_benchmark("handler.py", "--records", "500", "--rounds", "1")
    assert {r["name"] for r in results} == {
        "handler.logging_us_per_call",
        "handler.null_us_per_call",
        "handler.structlog_us_per_call",
        "handler.loguru_us_per_call",
    }


@pytest.mark.spark
@pytest.mark.apache_kafka
def test_spark_benchmark_prints_every_figure() -> None:
    """logsdk-kafka beside Spark's own source and the raw loop, on Apache Kafka."""
    names = {
        r["name"]
        for r in run_benchmark(
            "spark.py", "--records", "2000", "--rounds", "1", "--value-bytes", "200"
        )
    }
    assert {
        "spark.source.apache",
        "spark.source.vs_connector.apache",
        "spark.connector.apache",
        "spark.cpu_us_per_row.apache",
        "spark.source_end_to_end.apache",
        "spark.query_start.apache",
        "spark.batch_overhead.apache",
        "spark.source_in_batch.apache",
    } <= names, sorted(names)


def test_peer_rsyslog_benchmark_runs_or_says_why_not() -> None:
    """Beside rsyslogd where it is installed (a short steady run of each pipeline);
    elsewhere it says it skipped and reports no figure, exit status 0."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import peer_rsyslog
    finally:
        sys.path.pop(0)
    missing = peer_rsyslog.rsyslog_missing()
    results = run_benchmark("peer_rsyslog.py", "--runs", "steady", "--records", "500")
    if missing:
        assert results == []
        return
    names = {r["name"] for r in results}
    for figure in ("app_thread_cpu_us_per_call", "app_wall_us_per_call",
                   "pipeline_cpu_us_per_record"):  # fmt: skip
        assert f"peer.{figure}" in names, sorted(names)
        assert f"peer.{figure}.json_in_app" in names, sorted(names)
