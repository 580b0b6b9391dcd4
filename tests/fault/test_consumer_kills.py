"""LogConsumer processes SIGKILLed twice mid-run and restarted: every record, counted."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from logsdk.testing.pytest_plugin import KafkaTarget
from tests.consumer_helpers import produce, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]

CHILD = Path(__file__).with_name("consumer_child.py")
PARTITIONS = 4


def count(db: Path, sql: str) -> int:
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(db, timeout=5)
    except sqlite3.Error:
        return 0
    try:
        return int(conn.execute(sql).fetchone()[0])
    except sqlite3.OperationalError:
        return 0  # the child has not created its table yet
    finally:
        conn.close()


def spawn(mode: str, kafka_broker: KafkaTarget, topic: str, db: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(
        [
            sys.executable,
            str(CHILD),
            mode,
            kafka_broker.bootstrap_servers,
            topic,
            f"g-{topic}",
            str(db),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def run_with_kills(
    mode: str, kafka_broker: KafkaTarget, topic: str, db: Path, n: int, progress: Callable[[], int]
) -> int:
    """Run the child, SIGKILL it at 1/3 and 2/3 of n, restart it, and let it finish."""
    kills = 0
    child = spawn(mode, kafka_broker, topic, db)
    try:
        for fraction in (3, 1.5):
            mark = int(n / fraction)
            wait_until(
                lambda m=mark, c=child: progress() >= m or c.poll() is not None, 90, f"{mark} done"
            )
            assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
            assert progress() < n, "the run finished before the kill: make it longer"
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            if child.stderr:
                child.stderr.close()
            kills += 1
            child = spawn(mode, kafka_broker, topic, db)
        wait_until(lambda: progress() >= n or child.poll() is not None, 120, f"all {n} done")
        time.sleep(1.0)  # a duplicate still in flight would land now and be counted
        child.send_signal(signal.SIGTERM)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stderr:
            child.stderr.close()
    return kills


def test_at_least_once_survives_two_sigkills(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """100k records, the consumer SIGKILLed twice and restarted: every record processed."""
    topic = fresh_topic(PARTITIONS)
    n = 100_000
    produce(kafka_broker.client_config("producer"), topic, n, partitions=PARTITIONS)
    db = tmp_path / "progress.db"
    distinct = "SELECT count(*) FROM (SELECT DISTINCT partition, offset FROM processed)"
    kills = run_with_kills("alo", kafka_broker, topic, db, n, lambda: count(db, distinct))
    assert kills == 2
    conn = sqlite3.connect(db)
    try:
        done = set(conn.execute("SELECT partition, offset FROM processed"))
        total = conn.execute("SELECT count(*) FROM processed").fetchone()[0]
    finally:
        conn.close()
    expected = {(i % PARTITIONS, i // PARTITIONS) for i in range(n)}
    missing = expected - done
    assert not missing, f"{len(missing)} records never processed, e.g. {sorted(missing)[:5]}"
    assert total >= n  # duplicates are allowed (at-least-once), losses are not


def test_exactly_once_survives_two_sigkills_and_random_failures(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Exactly-once into SQLiteSink, SIGKILLed twice, a randomly failing handler: each once."""
    topic = fresh_topic(PARTITIONS)
    n = 100_000
    produce(kafka_broker.client_config("producer"), topic, n, partitions=PARTITIONS)
    db = tmp_path / "sink.db"
    kills = run_with_kills(
        "eos", kafka_broker, topic, db, n, lambda: count(db, "SELECT count(*) FROM records")
    )
    assert kills == 2
    conn = sqlite3.connect(db)
    try:
        rows = list(conn.execute("SELECT partition, offset FROM records"))
        stored = dict(
            ((t, p), o)
            for t, p, o in conn.execute("SELECT topic, partition, next_offset FROM logsdk_offsets")
        )
    finally:
        conn.close()
    dupes = len(rows) - len(set(rows))
    assert dupes == 0, f"{dupes} records stored twice"
    assert set(rows) == {(i % PARTITIONS, i // PARTITIONS) for i in range(n)}
    assert stored == {(topic, p): n // PARTITIONS for p in range(PARTITIONS)}
