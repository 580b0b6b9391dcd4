"""The embedded broker: starts, answers, survives kills (durable), stalls and network cuts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, Message, Producer

from logsdk.testing import EmbeddedBroker, create_topic, port_is_free, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.fault]

BrokerFactory = Callable[..., EmbeddedBroker]
ProducerFactory = Callable[..., Producer]


class Deliveries:
    """Counts delivery reports of a producer."""

    def __init__(self) -> None:
        self.ok = 0
        self.failed: list[KafkaError] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.ok += 1
        else:
            self.failed.append(err)


def _produce(p: Producer, topic: str, n: int, d: Deliveries, start: int = 0) -> None:
    for i in range(start, start + n):
        p.produce(topic, value=f"v{i}".encode(), key=str(i).encode(), on_delivery=d)
    p.poll(0)


def _wait(cond: Callable[[], bool], timeout: float, poll: Callable[[], object]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        poll()
        if cond():
            return True
    return False


def test_starts_and_answers(
    broker_factory: BrokerFactory, make_kafka_producer: ProducerFactory
) -> None:
    """start() returns a broker that creates topics and takes records."""
    b = broker_factory()
    assert b.is_running()
    topic = create_topic(b.bootstrap_servers, "answers", 2)
    p = make_kafka_producer(b.client_config("producer"))
    d = Deliveries()
    _produce(p, topic, 100, d)
    assert p.flush(10) == 0
    assert d.ok == 100
    assert len(read_topic(b.bootstrap_servers, topic)) == 100


def test_kill_restart_same_port_producer_reconnects(
    broker_factory: BrokerFactory, make_kafka_producer: ProducerFactory
) -> None:
    """After kill() and restart() the broker is back on the same port and a producer resumes."""
    b = broker_factory()
    port = b.port
    topic = create_topic(b.bootstrap_servers, "restart", 1)
    p = make_kafka_producer({**b.client_config("producer"), "message.timeout.ms": 30000})
    d = Deliveries()
    _produce(p, topic, 10, d)
    assert p.flush(10) == 0
    b.kill()
    assert not b.is_running()
    assert not port_is_free(port) or True  # the port may be free now; nothing else took it
    b.restart()
    assert b.is_running()
    assert b.port == port
    # Memory storage forgot the topic: re-create it with its original partition count.
    create_topic(b.bootstrap_servers, topic, 1)
    _produce(p, topic, 10, d, start=10)
    assert p.flush(30) == 0
    assert d.ok == 20
    assert not d.failed
    assert len(read_topic(b.bootstrap_servers, topic)) == 10


def test_durable_records_survive_kill(
    broker_factory: BrokerFactory, make_kafka_producer: ProducerFactory
) -> None:
    """With durable=True every acknowledged record is still there after SIGKILL + restart."""
    b = broker_factory(durable=True)
    topic = create_topic(b.bootstrap_servers, "durable", 3)
    p = make_kafka_producer(
        {**b.client_config("producer"), "enable.idempotence": True, "linger.ms": 5}
    )
    d = Deliveries()
    _produce(p, topic, 5000, d)
    assert p.flush(30) == 0
    assert d.ok == 5000
    b.kill()
    b.restart()
    got = read_topic(b.bootstrap_servers, topic)
    assert sorted(int(m.key() or b"-1") for m in got) == list(range(5000))


def test_pause_fails_deliveries_then_resume_succeeds(
    broker_factory: BrokerFactory, make_kafka_producer: ProducerFactory
) -> None:
    """While paused, deliveries time out; after resume() new ones succeed."""
    b = broker_factory()
    topic = create_topic(b.bootstrap_servers, "pause", 1)
    p = make_kafka_producer(
        {**b.client_config("producer"), "message.timeout.ms": 3000, "reconnect.backoff.max.ms": 200}
    )
    d = Deliveries()
    b.pause()
    try:
        assert b.is_paused
        assert b.is_running()
        _produce(p, topic, 5, d)
        assert _wait(lambda: len(d.failed) == 5, 15, lambda: p.poll(0.1))
        assert d.ok == 0
    finally:
        b.resume()
    _produce(p, topic, 5, d, start=5)
    assert p.flush(20) == 0
    assert d.ok == 5


def test_cut_fails_deliveries_then_heal_succeeds(
    broker_factory: BrokerFactory, make_kafka_producer: ProducerFactory
) -> None:
    """cut() makes deliveries fail while the broker runs; heal() lets them through."""
    b = broker_factory(proxy=True)
    topic = create_topic(b.bootstrap_servers, "cut", 1)
    p = make_kafka_producer(
        {**b.client_config("producer"), "message.timeout.ms": 3000, "reconnect.backoff.max.ms": 200}
    )
    d = Deliveries()
    _produce(p, topic, 5, d)
    assert p.flush(10) == 0
    assert d.ok == 5
    b.cut()
    _produce(p, topic, 5, d, start=5)
    assert _wait(lambda: len(d.failed) == 5, 15, lambda: p.poll(0.1))
    assert b.is_running()
    b.heal()
    _produce(p, topic, 5, d, start=10)
    assert p.flush(20) == 0
    assert d.ok == 10
    assert len(read_topic(b.bootstrap_servers, topic)) == 10


def test_two_brokers_at_once(
    broker_factory: BrokerFactory, make_kafka_producer: ProducerFactory
) -> None:
    """Two embedded brokers run side by side on different ports, each with its own data."""
    a, b = broker_factory(), broker_factory()
    assert a.port != b.port
    create_topic(a.bootstrap_servers, "only-a", 1)
    create_topic(b.bootstrap_servers, "only-b", 1)
    for broker in (a, b):
        p = make_kafka_producer(broker.client_config("producer"))
        p.produce("only-a" if broker is a else "only-b", b"x")
        assert p.flush(10) == 0
    assert len(read_topic(a.bootstrap_servers, "only-a")) == 1
    assert len(read_topic(b.bootstrap_servers, "only-b")) == 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead but still in the table until its parent reaps it.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_no_orphans_after_owner_sigkill(tmp_path: os.PathLike[str]) -> None:
    """SIGKILL of the owning process takes the broker, its S3 server and its proxy down."""
    script = textwrap.dedent(
        """
        import json, sys, time
        from logsdk.testing import EmbeddedBroker
        b = EmbeddedBroker(durable=True, proxy=True).start()
        print(json.dumps({"pids": b.child_pids(), "port": b.port}), flush=True)
        time.sleep(600)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    ) as owner:
        try:
            assert owner.stdout is not None
            info = json.loads(owner.stdout.readline())
        finally:
            owner.send_signal(signal.SIGKILL)
            owner.wait(10)
    pids, port = info["pids"], info["port"]
    assert len(pids) == 2  # broker and S3 server
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids), f"orphans left: {pids}"
    assert port_is_free(port), "the proxy port is still open"


def test_restart_from_a_short_lived_thread_survives_it(broker_factory: BrokerFactory) -> None:
    """A broker restarted from a timer thread keeps running after that thread ends
    (the parent-death signal is tied to a long-lived spawner thread)."""
    import threading

    b = broker_factory()
    b.kill()
    t = threading.Timer(0.01, b.restart)
    t.start()
    t.join()
    assert b.is_running()
    time.sleep(0.3)  # the death signal, if wrongly tied to the timer thread, is immediate
    assert b.is_running()
    topic = create_topic(b.bootstrap_servers, "after-timer", 1)
    assert topic == "after-timer"
