"""flush() and close() mean "in Kafka": after an outage, one flush() and close() deliver
every record, with no waiting loop of the caller's; with Kafka down throughout, close()
returns within its timeout and says what it left in the spool, and where.

Each test counts every record with a plain reader. Order is checked per partition; the
one exception is the embedded broker's "duplicate sequence" answer after a restart (see
tests/fault/test_producer_faults.py): a record out of order must be one whose own delivery
report was unconfirmed and resent.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from logsdk import LogProducer, State
from logsdk.producer import _health
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, free_port, read_topic
from logsdk.testing.chaos import trace_deliveries, unconfirmed_seqs
from tests.conftest import FAST

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]

BrokerFactory = Callable[..., EmbeddedBroker]
ProducerFactory = Callable[..., LogProducer]
N = 60_000
CHUNK = 1_000


def _outage(broker: EmbeddedBroker, kind: str, down_s: float) -> Callable[[], None]:
    """A fault that starts now and ends ``down_s`` later, on a timer."""
    start, end = {
        "kill": (broker.kill, broker.restart),
        "cut": (broker.cut, broker.heal),
        "pause": (broker.pause, broker.resume),
    }[kind]

    def fault() -> None:
        start()
        threading.Timer(down_s, end).start()

    return fault


@pytest.mark.parametrize(
    ("kind", "at"),
    [("kill", (10_000, 30_000, 50_000)), ("cut", (20_000,)), ("pause", (20_000,))],
)
def test_one_flush_and_close_deliver_everything_after_outages(
    broker_factory: BrokerFactory,
    make_producer: ProducerFactory,
    tmp_path: Path,
    kind: str,
    at: tuple[int, ...],
) -> None:
    """60k sends while the broker is SIGKILLed 3 times (3 s down each), the network cut
    for 4 s, or the broker paused for 4 s; then one flush() and close(): a plain reader
    finds every record, none missing, per-partition order kept."""
    broker = broker_factory(durable=True, proxy=kind == "cut")
    topic = create_topic(broker.bootstrap_servers, f"flush-{kind}", 3)
    fault = _outage(broker, kind, 3.0 if kind == "kill" else 4.0)
    p = make_producer(broker.bootstrap_servers, topic, tmp_path, **FAST)
    reports: list[str] = []
    trace_deliveries(p, reports.append)
    for start in range(0, N, CHUNK):
        if start in at:
            fault()
        for i in range(start, start + CHUNK):
            p.send(b"%d" % i, key=b"%d" % (i % 24))
        time.sleep(0.05)  # about 3 s of sending: the last outage outlives it
    left = p.flush(120)
    stats = p.stats()
    p.close()
    assert left == 0, stats
    assert stats["sent"] == N
    assert stats["spooled"] > 0, "nothing went through the spool: the test proved nothing"
    rep = check_delivery(read_topic(broker.bootstrap_servers, topic, timeout=120))
    unconfirmed = unconfirmed_seqs(reports)
    unexplained = rep.split_order_violators({p.producer_id: unconfirmed})[1]
    assert rep.missing(p.producer_id, range(N)) == [], stats
    assert rep.unique == N
    assert unexplained == [], rep.order_violators[:10]


def test_close_with_kafka_down_returns_in_its_timeout_and_says_what_it_left(
    make_producer: ProducerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka down for the whole run: close(5) returns in about 5 s, every record is in the
    spool, and a warning names how many records were left and the spool dir."""
    dead = f"127.0.0.1:{free_port()}"
    p = make_producer(dead, "down", tmp_path, **FAST)
    for i in range(5_000):
        p.send(b"%d" % i)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="logsdk.producer"):
        p.close(5)
    took = time.monotonic() - t0
    assert 5.0 <= took < 7.0, took
    assert p.stats()["spool_records"] == 5_000
    said = [r.getMessage() for r in caplog.records if "close()" in r.getMessage()]
    assert len(said) == 1, said
    assert "5000 record(s)" in said[0]
    assert str(tmp_path) in said[0]


def test_flush_delivers_a_spool_left_by_an_earlier_run(
    broker_factory: BrokerFactory, make_producer: ProducerFactory, tmp_path: Path
) -> None:
    """A producer opened on a spool with leftovers and closed at once delivers them: close()
    replays the spool before it returns, without a flush() or a wait of the caller's."""
    port = free_port()
    p = make_producer(f"127.0.0.1:{port}", "left", tmp_path, **FAST)
    for i in range(3_000):
        p.send(b"%d" % i)
    p.close(0)  # Kafka down: all of them stay in the spool
    assert p.stats()["spool_records"] == 3_000
    broker = broker_factory(port=port)
    create_topic(broker.bootstrap_servers, "left", 2)
    p2 = make_producer(broker.bootstrap_servers, "left", tmp_path, **FAST)
    p2.close(30)
    assert p2.stats()["spool_records"] == 0
    rep = check_delivery(read_topic(broker.bootstrap_servers, "left"))
    assert rep.missing(p.producer_id, range(3_000)) == []
    assert rep.order_violations == 0


def test_flush_probes_at_once_instead_of_waiting_for_the_backoff(
    broker_factory: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The health thread's pause after a failed probe set to 20 s (x0.5-1.5 jitter): a
    degraded producer would notice Kafka is back 10-30 s later. flush() probes now, and
    delivers within a few seconds of the broker's start."""
    monkeypatch.setattr(_health, "_BACKOFF_START_S", 20.0)
    port = free_port()
    slow = {**FAST, "probe_backoff_max_s": 60.0}
    p = LogProducer(f"127.0.0.1:{port}", "backoff", tmp_path, **slow)
    try:
        for i in range(1_000):
            p.send(b"%d" % i)
        assert p.flush_durable(10) == 0
        assert p.state is State.DEGRADED
        broker = broker_factory(port=port)
        create_topic(broker.bootstrap_servers, "backoff", 1, exist_ok=True)
        t0 = time.monotonic()
        assert p.flush(30) == 0
        took = time.monotonic() - t0
    finally:
        p.close(0)
    assert took < 8.0, took
    assert len(read_topic(broker.bootstrap_servers, "backoff")) == 1_000


_APP = textwrap.dedent(
    """
    import logging, logging.config, sys, time
    bootstrap, topic, spool, background = sys.argv[1:5]
    logging.config.dictConfig({
        "version": 1,
        "handlers": {"kafka": {
            "class": "logsdk.integrations.logging.KafkaHandler",
            "bootstrap_servers": bootstrap, "topic": topic, "spool_dir": spool,
            "probe_timeout_s": 0.5, "probe_backoff_max_s": 0.5, "stall_timeout_s": 2.0,
            "close_timeout": 10.0, "background": background == "1",
        }},
        "root": {"level": "INFO", "handlers": ["kafka"]},
    })
    log = logging.getLogger("app")
    for i in range(10_000):
        log.info("line %d", i)
        if i % 1000 == 999:
            print(i + 1, flush=True)
            time.sleep(0.4)
    print("exiting", flush=True)
    """
)


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_an_application_that_just_exits_delivers_its_log_lines(
    broker_factory: BrokerFactory,
    spawn: Callable[..., subprocess.Popen[str]],
    tmp_path: Path,
    background: bool,
) -> None:
    """An application logs 10k lines through KafkaHandler (set up by dictConfig) during a 3 s
    broker outage, then simply exits, without closing anything: the exit closes the
    handler (in background mode its thread first hands every line to the producer), which
    delivers every line."""
    broker = broker_factory(durable=True)
    topic = create_topic(broker.bootstrap_servers, "app-exit", 2)
    app = spawn(
        [
            sys.executable,
            "-c",
            _APP,
            broker.bootstrap_servers,
            topic,
            str(tmp_path / "spool"),
            "1" if background else "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert app.stdout is not None
    lines = []
    for line in app.stdout:
        lines.append(line.strip())
        if line.strip() == "2000":
            broker.kill()  # about 3.2 s before the app's last line
            threading.Timer(3.0, broker.restart).start()
    assert app.wait(60) == 0
    assert lines[-1] == "exiting"
    got = read_topic(broker.bootstrap_servers, topic, timeout=60)
    seen = {json.loads(m.value() or b"")["message"] for m in got}
    assert len(seen) == 10_000
    assert seen == {f"line {i}" for i in range(10_000)}
