"""``logsdk agent`` under real faults, on the embedded broker: the application SIGKILLed
(before any agent ran, and under one), the agent SIGKILLed mid-stream and mid-replay then
restarted, both killed, Kafka down for the whole run then back. Each test
counts every record in Kafka by (producer id, seq): none missing, duplicates only of the
same (producer id, seq)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsdk.agent._lock import agent_dir
from logsdk.shm._reader import ring_names
from logsdk.spool._slots import spooled_records
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, free_port, read_topic
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import answered_get, reap, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.fault]

BrokerFactory = Callable[..., EmbeddedBroker]
N = 20_000

#: The application: N records through delivery="agent", keyed; prints its producer id,
#: "quarter" a quarter of the way, then "sent", then (argv[4] == "close") flushes and
#: closes, saying how many records were "left", or waits to be killed. "pause": as
#: "close", waiting at the quarter for a line on its stdin.
_APP = textwrap.dedent(
    """
    import sys, time
    from logsdk import LogProducer
    bootstrap, topic, root, mode, n = sys.argv[1:6]
    p = LogProducer(bootstrap, topic, root, delivery="agent", max_block_s=30)
    print(p.producer_id, flush=True)
    for i in range(int(n)):
        p.send(b"%d" % i, key=b"%d" % (i % 16))
        if i % 1000 == 999:
            time.sleep(0.05)
        if i == int(n) // 4:
            print("quarter", flush=True)
            if mode == "pause":
                sys.stdin.readline()
    print("sent", flush=True)
    if mode in ("close", "pause"):
        left = p.flush(60)
        p.close(0)
        print("left", left, flush=True)
    else:
        time.sleep(600)
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path.cwd()), env.get("PYTHONPATH")]))
    return env


@contextlib.contextmanager
def _agent(root: Path, bootstrap: str, *extra: str) -> Iterator[subprocess.Popen[str]]:
    cmd = [sys.executable, "-m", "logsdk.cli", "agent", "--spool-root", str(root), "-b", bootstrap]
    proc = subprocess.Popen(
        [*cmd, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        assert "draining" in proc.stdout.readline()
        yield proc
    finally:
        reap(proc)


@contextlib.contextmanager
def _app(root: Path, bootstrap: str, topic: str, mode: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _APP, bootstrap, topic, str(root), mode, str(N)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        yield proc
    finally:
        reap(proc)


def _line(app: subprocess.Popen[str], first: str) -> list[str]:
    """The next line of the application's that starts with ``first``, split."""
    assert app.stdout is not None
    while True:
        line = app.stdout.readline()
        assert line, f"the application ended before saying {first!r}"
        if line.startswith(first):
            return line.split()


def _all_in_kafka(bootstrap: str, topic: str, pid: str, timeout: float = 60) -> int:
    """Wait until every seq of ``pid`` is in ``topic``, in order per partition (the first
    occurrences); the duplicates counted."""
    deadline = time.monotonic() + timeout
    while True:
        rep = check_delivery(read_topic(bootstrap, topic, timeout=30))
        missing = rep.missing(pid, range(N))
        if not missing:
            assert rep.unique == N
            assert rep.order_violations == 0, rep.order_violators[:10]
            return rep.duplicates
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(missing)} record(s) missing, first {missing[:10]}")
        time.sleep(0.5)


def test_the_application_sigkilled_loses_nothing(kafka_broker: KafkaTarget, tmp_path: Path) -> None:
    """The application writes N records into its ring and is SIGKILLed before any agent
    ran; an agent started then delivers all N and removes the dead ring."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, "agent-app-killed", 3)
    with _app(tmp_path, bootstrap, topic, "wait") as app:
        assert app.stdout is not None
        pid = app.stdout.readline().strip()
        _line(app, "sent")
        app.kill()
        app.wait(10)
    assert len(ring_names(tmp_path)) == 1
    with _agent(tmp_path, bootstrap):
        dups = _all_in_kafka(bootstrap, topic, pid)
        wait_until(lambda: ring_names(tmp_path) == [], 10, "the dead ring removed")
    assert dups == 0


def test_the_application_sigkilled_while_the_agent_drains_it(
    kafka_broker: KafkaTarget, tmp_path: Path
) -> None:
    """The application is SIGKILLed a quarter of the way through its sends, under a
    running agent: what it wrote reaches Kafka as a gapless run of seqs from 0 (past the
    quarter it reported), and the dead ring is removed."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, "agent-app-killed-live", 3)
    with _agent(tmp_path, bootstrap), _app(tmp_path, bootstrap, topic, "wait") as app:
        assert app.stdout is not None
        pid = app.stdout.readline().strip()
        _line(app, "quarter")
        app.kill()
        app.wait(10)
        wait_until(lambda: ring_names(tmp_path) == [], 30, "the dead ring removed")
        rep = check_delivery(read_topic(bootstrap, topic, timeout=30))
        seqs = sorted(rep.seqs.get(pid, set()))
        assert rep.order_violations == 0
        assert len(seqs) > N // 4
        assert seqs == list(range(len(seqs)))


def test_the_agent_sigkilled_mid_stream_and_restarted_loses_nothing(
    kafka_broker: KafkaTarget, tmp_path: Path
) -> None:
    """The agent is SIGKILLed while the application sends, and restarted: every record
    reaches Kafka; duplicates carry the same producer id and seq; the application's
    flush() returns 0."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, "agent-killed", 3)
    with _app(tmp_path, bootstrap, topic, "pause") as app:
        assert app.stdin is not None
        assert app.stdout is not None
        pid = app.stdout.readline().strip()
        with _agent(tmp_path, bootstrap) as agent:
            _line(app, "quarter")  # the application waits there
            agent.kill()
            agent.wait(10)
        at_kill = check_delivery(read_topic(bootstrap, topic, timeout=30)).unique
        assert at_kill < N, "the agent was killed after it delivered everything"
        app.stdin.write("go\n")
        app.stdin.flush()
        with _agent(tmp_path, bootstrap):
            _line(app, "sent")
            assert _line(app, "left") == ["left", "0"]
            _all_in_kafka(bootstrap, topic, pid)


def test_kafka_down_for_the_whole_run_then_back(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    """Kafka unreachable from the agent's start: the ring's records go to the agent's
    spool (the application's flush() returns 0: they are safe there), and are replayed,
    all N, once Kafka is back."""
    broker = broker_factory(proxy=True)
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, "agent-kafka-down", 3)
    broker.cut()
    with _agent(tmp_path, bootstrap), _app(tmp_path, bootstrap, topic, "close") as app:
        assert app.stdout is not None
        pid = app.stdout.readline().strip()
        _line(app, "sent")
        assert _line(app, "left") == ["left", "0"]
        spool = agent_dir(tmp_path) / pid
        wait_until(lambda: spooled_records(spool) == N, 10, "every record in the spool")
        broker.heal()
        assert _all_in_kafka(bootstrap, topic, pid) == 0
        wait_until(lambda: not spool.exists(), 10, "the spool emptied and removed")


def test_the_agent_sigkilled_mid_replay_and_restarted_loses_nothing(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    """Kafka cut while the application writes: the agent spools everything; Kafka back, the
    agent replays (paced at 2,000 records/s) and is SIGKILLed with rows still in its spool;
    the next agent replays the rest: every record in Kafka, in order per partition."""
    broker = broker_factory(proxy=True)
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, "agent-killed-replaying", 3)
    broker.cut()
    with _app(tmp_path, bootstrap, topic, "close") as app:
        with _agent(tmp_path, bootstrap, "--replay-max-rate", "2000") as agent:
            pid = _line(app, "")[0]
            assert _line(app, "left") == ["left", "0"]
            spool = agent_dir(tmp_path) / pid
            wait_until(lambda: spooled_records(spool) == N, 10, "every record in the spool")
            broker.heal()
            # (1 is also what spooled_records says when it cannot tell: not taken for a count)
            wait_until(lambda: 1 < spooled_records(spool) < N, 30, "the replay under way", 0.02)
            agent.kill()
            agent.wait(10)
        left = spooled_records(spool)
        assert 0 < left < N, "the agent was not killed mid-replay"
        with _agent(tmp_path, bootstrap):
            _all_in_kafka(bootstrap, topic, pid)
            wait_until(lambda: not spool.exists(), 10, "the spool emptied and removed")


def test_the_application_and_the_agent_both_sigkilled(
    kafka_broker: KafkaTarget, tmp_path: Path
) -> None:
    """Both killed a quarter of the way through the sends; a new agent delivers what the
    application wrote: a gapless run of seqs from 0, past the quarter it reported."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, "agent-both-killed", 3)
    with _app(tmp_path, bootstrap, topic, "wait") as app, _agent(tmp_path, bootstrap) as agent:
        pid = _line(app, "")[0]
        _line(app, "quarter")
        app.kill()
        agent.kill()
        app.wait(10)
        agent.wait(10)
    with _agent(tmp_path, bootstrap):
        wait_until(lambda: ring_names(tmp_path) == [], 30, "the dead ring removed")
        rep = check_delivery(read_topic(bootstrap, topic, timeout=30))
    seqs = sorted(rep.seqs.get(pid, set()))
    assert len(seqs) > N // 4
    assert seqs == list(range(len(seqs)))
    assert rep.order_violations == 0


SERVERS = Path(__file__).resolve().parents[2] / "examples" / "servers"


@pytest.mark.slow
def test_eight_gunicorn_workers_recycled_under_load_with_one_agent(
    kafka_broker: KafkaTarget, tmp_path: Path
) -> None:
    """gunicorn, 8 sync workers recycled every ~150 requests (about 20 processes come and
    go), delivery="agent" and one agent: each of 3000 requests logs its id; after gunicorn's
    SIGTERM every id is in Kafka, and no ring is left behind."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, "agent-gunicorn", 3)
    spool = tmp_path / "spool"
    port = free_port()
    env = {
        **os.environ,
        "LOGSDK_BOOTSTRAP": bootstrap,
        "LOGSDK_TOPIC": topic,
        "LOGSDK_SPOOL_DIR": str(spool),
        "LOGSDK_DELIVERY": "agent",
        "PYTHONPATH": os.pathsep.join([str(SERVERS), *filter(None, [_env().get("PYTHONPATH")])]),
        "XDG_RUNTIME_DIR": str(tmp_path),
    }
    cmd = [str(Path(sys.executable).parent / "gunicorn"), "-w", "8", "--max-requests", "150",
           "--max-requests-jitter", "30", "--graceful-timeout", "20",
           "-b", f"127.0.0.1:{port}", "wsgi_app:app"]  # fmt: skip
    with _agent(spool, bootstrap):
        proc = subprocess.Popen(cmd, env=env, cwd=SERVERS, start_new_session=True)
        try:
            wait_until(lambda: _listening(port), 30, "gunicorn listening", 0.1)
            failures: list[str] = []
            answered = [rid for rid in range(3000) if answered_get(port, rid, failures)]
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, "gunicorn's exit status after SIGTERM"
            stopped_in = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert len(answered) == 3000, failures[:10]

        def rids() -> set[str]:
            out = set()
            for m in read_topic(bootstrap, topic, timeout=30):
                doc = json.loads(m.value() or b"")
                if doc.get("message", "").startswith("request "):
                    out.add(str(doc["extra"]["rid"]))
            return out

        want = {str(r) for r in range(3000)}
        wait_until(
            lambda: not want - rids(), 120, f"every id in Kafka (stopped in {stopped_in:.1f} s)", 1
        )
        wait_until(lambda: ring_names(spool) == [], 60, "every ring removed")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_memory_broker_restart_the_agent_replaces_its_client(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    """A memory-storage broker restarted forgets the agent client's producer state (its
    idempotent client then has records in flight that are never acknowledged): the
    agent's stall detector replaces the client, and every record written after the
    restart arrives, in order per partition."""
    from logsdk import LogProducer

    broker = broker_factory()
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, "agent-broker-restart", 2)
    with (
        _agent(tmp_path, bootstrap),
        LogProducer(bootstrap, topic, tmp_path, delivery="agent") as p,
    ):
        for i in range(2000):
            p.send(b"%d" % i, key=b"%d" % (i % 8))
        assert p.flush(30) == 0
        broker.kill()
        broker.restart()
        create_topic(bootstrap, topic, 2, exist_ok=True)
        for i in range(2000, 12_000):
            p.send(b"%d" % i, key=b"%d" % (i % 8))
            if i % 1000 == 0:
                time.sleep(0.05)
        assert p.flush(60) == 0
        pid = p.producer_id

        def missing() -> list[int]:
            rep = check_delivery(read_topic(bootstrap, topic, timeout=30))
            assert rep.order_violations == 0
            return rep.missing(pid, range(2000, 12_000))

        wait_until(lambda: missing() == [], 60, "every record after the restart in Kafka", 1)
