"""Smoke tests: examples/web_app.py, consumer_to_sqlite.py and logging_dictconfig.py run."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.testing import read_topic
from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = pytest.mark.integration
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``examples/NAME`` with ``args``; fail with its output if it exits non-zero."""
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=EXAMPLES.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_web_app_logs_every_request(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """web_app.py --requests 12 --exit: one access record per logged request (health checks
    are not), and each /fail also logs its traceback."""
    topic = fresh_topic(3)
    out = run_example(
        "web_app.py", "--bootstrap", kafka_broker.bootstrap_servers, "--topic", topic,
        "--spool-dir", str(tmp_path), "--requests", "12", "--exit",
    )  # fmt: skip
    assert "answered 500: 3" in out.stdout
    docs = [json.loads(m.value() or b"") for m in read_topic(kafka_broker.bootstrap_servers, topic)]
    access = [d for d in docs if d["logger"] == "web.access"]
    errors = [d for d in docs if d["logger"] == "web.app"]
    assert len(access) == 9
    assert len(errors) == 3
    assert sorted({d["extra"]["path"] for d in access}) == ["/", "/fail", "/orders/7"]
    fail = next(d for d in access if d["extra"]["path"] == "/fail")
    assert fail["level"] == "ERROR"
    assert fail["extra"]["status"] == 500
    assert {"method", "duration_ms", "client"} <= set(fail["extra"])
    assert all(d["service"] == "web_app" for d in docs)
    assert "RuntimeError: the database went away" in errors[0]["exception"]


def test_consumer_to_sqlite_stores_each_record_once_across_runs(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """consumer_to_sqlite.py stores 300 records once; run again it resumes from the offsets
    in the database and adds nothing."""
    topic = fresh_topic(3)
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path / "spool") as p:
        for i in range(300):
            p.send({"level": "INFO", "message": f"e{i}"}, key=str(i % 5))
        assert p.flush(10) == 0
    db = tmp_path / "logs.db"
    xs = [
        x
        for k, v in kafka_broker.client_config("consumer").items()
        if k != "bootstrap.servers"
        for x in ("-X", f"{k}={v}")
    ]
    common = ["--bootstrap", kafka_broker.bootstrap_servers, "--topic", topic]
    common += ["--group", f"g-{topic}", "--db", str(db), *xs]
    first = run_example("consumer_to_sqlite.py", *common, "--expect", "300")
    assert "300 row(s), 300 distinct" in first.stdout
    second = run_example("consumer_to_sqlite.py", *common, "--idle-timeout", "1")
    assert "300 row(s), 300 distinct (producer, seq); +0" in second.stdout
    with contextlib.closing(sqlite3.connect(db)) as conn:
        messages = {json.loads(v)["message"] for (v,) in conn.execute("SELECT value FROM records")}
    assert messages == {f"e{i}" for i in range(300)}


def test_consumer_to_sqlite_runs_on_its_own(tmp_path: Path) -> None:
    """With no --bootstrap it starts an embedded broker, seeds 1000 records, stores them."""
    out = run_example("consumer_to_sqlite.py", "--db", str(tmp_path / "logs.db"))
    assert "1000 row(s), 1000 distinct" in out.stdout


def test_logging_dictconfig_ships_records(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """logging_dictconfig.py: the dictConfig'd KafkaHandler ships INFO and above as JSON with
    the static fields, extra fields and the traceback."""
    topic = fresh_topic(1)
    run_example(
        "logging_dictconfig.py", "--bootstrap", kafka_broker.bootstrap_servers,
        "--topic", topic, "--spool-dir", str(tmp_path),
    )  # fmt: skip
    docs = [json.loads(m.value() or b"") for m in read_topic(kafka_broker.bootstrap_servers, topic)]
    assert [(d["level"], d["message"]) for d in docs] == [
        ("INFO", "order placed"),
        ("WARNING", "payment slow"),
        ("ERROR", "order failed"),
    ]
    assert docs[0]["extra"] == {"order_id": 1042, "amount_eur": 19.9}
    assert all((d["service"], d["env"], d["logger"]) == ("checkout", "dev", "checkout.orders")
               for d in docs)  # fmt: skip
    assert "TimeoutError: payment provider did not answer" in docs[2]["exception"]
