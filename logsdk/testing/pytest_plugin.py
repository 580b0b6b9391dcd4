"""Pytest fixtures for code that talks to Kafka, registered as the ``logsdk`` plugin.

Fixtures:

- ``kafka_broker`` (session): a `KafkaTarget`. The broker is chosen, in order:
  ``LOGSDK_TEST_BOOTSTRAP`` names an external cluster; a testcontainers Kafka when a
  Docker engine answers; otherwise the embedded broker (Tansu). Set
  ``LOGSDK_TEST_BROKER=embedded`` to skip the Docker probe.
- ``fresh_topic`` (function): a factory, ``fresh_topic(partitions=3) -> name``, that
  creates a topic with a unique name for this test.
- ``broker_factory`` (function): a factory of `EmbeddedBroker` instances that
  the test may kill, pause or cut off; stopped at the end of the test. Skipped, with
  the reason, when ``LOGSDK_TEST_BOOTSTRAP`` points at an external cluster.
- ``apache_kafka`` (session): Apache Kafka itself, one KRaft node
  ([`ApacheKafka`][logsdk.testing.ApacheKafka]), as a `KafkaTarget`.
- ``apache_cluster`` (session): Apache Kafka, three KRaft nodes, shared by every test of
  the session (each xdist worker) that asks for it; a test must leave its nodes running
  (kill, stop, pause or cut nodes on a cluster of ``apache_cluster_factory``).
- ``apache_cluster_factory`` (function): a factory of started
  [`ApacheKafka`][logsdk.testing.ApacheKafka] clusters (three nodes unless told) that the test
  may kill, pause, restart or cut off; killed at the end of the test, their logs kept
  under the test's ``tmp_path`` and named in the report of a test that failed.

A test marked ``each_broker`` runs three times: on the session's broker, on librdkafka's
mock cluster (``[mock]``) and on Apache Kafka (``[apache]``), each through the ``kafka``
fixture; one marked ``embedded_and_apache`` runs on the first and the last.

Markers: ``integration``, ``fault``, ``slow``, ``spark``, ``apache_kafka``.

Ownership checks (`logsdk._owner`) are on in every test session that loads this
plugin (``LOGSDK_CHECK_OWNERS=1``, inherited by the processes tests start; set it to
``0`` to turn them off): a logsdk object used by a thread that does not own it raises at
once, and a violation seen on any thread fails the test during (or after) which it was
seen.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from logsdk import _owner
from logsdk._types import ClientConfig
from logsdk.testing._admin import create_topic
from logsdk.testing._apache import TEST_JVM_OPTIONS, ApacheKafka
from logsdk.testing._broker import EmbeddedBroker
from logsdk.testing._mock import MockCluster

BrokerKind = Literal["external", "container", "embedded", "mock", "apache"]

ENV_BOOTSTRAP = "LOGSDK_TEST_BOOTSTRAP"
ENV_BROKER = "LOGSDK_TEST_BROKER"

MARKERS = {
    "integration": "needs a Kafka broker (embedded, container or external)",
    "fault": "kills, pauses or cuts off the broker; needs an embedded broker",
    "slow": "takes more than a few seconds",
    "spark": "needs pyspark and Java",
    "each_broker": "runs on the session's broker, on librdkafka's mock cluster and on Apache "
    "Kafka (use the 'kafka' fixture)",
    "mock_cluster": "runs on librdkafka's mock cluster (the [mock] run of an each_broker test)",
    "embedded_and_apache": "runs on the session's broker and on Apache Kafka (use the 'kafka' "
    "fixture)",
    "apache_kafka": "runs on Apache Kafka itself (needs Java 17+, and Maven for the first fetch "
    "of its jars)",
}


def docker_answers(timeout: float = 2.0) -> bool:
    """True when a Docker engine answers ``GET /_ping`` within ``timeout`` seconds.

    Asked over a plain socket (``DOCKER_HOST`` or ``/var/run/docker.sock``), so the
    probe leaves nothing open behind it.
    """
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: str | tuple[str, int] = host[len("unix://") :]
        elif host.startswith("tcp://"):
            hostname, _, port = host[len("tcp://") :].rstrip("/").rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            address = (hostname, int(port))
        else:
            return False
    except (OSError, ValueError):
        return False
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect(address)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = sock.recv(1024)
        except OSError:
            return False
    return reply.startswith(b"HTTP/1.") and b" 200 " in reply.split(b"\r\n", 1)[0]


def choose_broker_kind(
    env: Mapping[str, str] | None = None, docker_probe: Callable[[], bool] = docker_answers
) -> BrokerKind:
    """Which broker the fixtures use: external, then container, then embedded."""
    env = os.environ if env is None else env
    if env.get(ENV_BOOTSTRAP, "").strip():
        return "external"
    forced = env.get(ENV_BROKER, "").strip().lower()
    if forced == "embedded":
        return "embedded"
    if forced and forced not in ("container", "auto"):
        raise pytest.UsageError(f"{ENV_BROKER} must be 'embedded', 'container' or 'auto'")
    return "container" if docker_probe() else "embedded"


@dataclass
class KafkaTarget:
    """The Kafka cluster a test session talks to."""

    bootstrap_servers: str
    kind: BrokerKind
    embedded: EmbeddedBroker | None = None
    mock: MockCluster | None = None
    apache: ApacheKafka | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def can_fault(self) -> bool:
        """True when the tests may kill and restart this broker (embedded only)."""
        return self.kind == "embedded"

    def client_config(
        self, role: Literal["producer", "consumer", "admin"] = "consumer"
    ) -> ClientConfig:
        """Client settings for this cluster (see `EmbeddedBroker.client_config()`)."""
        if self.embedded is not None:
            return self.embedded.client_config(role)
        if self.mock is not None:
            return self.mock.client_config(role)
        if self.apache is not None:
            return self.apache.client_config(role)
        return {"bootstrap.servers": self.bootstrap_servers}

    def create_topic(self, name: str, partitions: int = 3, **kw: Any) -> str:
        """Create a topic and wait until all its partitions have a leader."""
        if self.mock is not None:
            return self.mock.create_topic(name, partitions, **kw)
        if self.apache is not None:
            kw.setdefault("replication_factor", -1)  # the cluster's default.replication.factor
        return create_topic(self.bootstrap_servers, name, partitions, **kw)

    def close(self) -> None:
        """Stop whatever this session started."""
        for closer in reversed(self._closers):
            with contextlib.suppress(Exception):
                closer()
        self._closers.clear()


def open_target(kind: BrokerKind | None = None) -> KafkaTarget:
    """Start (or point at) the broker for ``kind``; the caller must ``close()`` it."""
    kind = kind or choose_broker_kind()
    if kind == "mock":
        mock = MockCluster(brokers=3).start()
        target = KafkaTarget(mock.bootstrap_servers, "mock", mock=mock)
        target._closers.append(mock.stop)
        return target
    if kind == "apache":
        cluster = ApacheKafka(nodes=1, jvm_options=TEST_JVM_OPTIONS).start()
        target = KafkaTarget(cluster.bootstrap_servers, "apache", apache=cluster)
        target._closers.append(lambda: cluster.stop(timeout=5.0))
        return target
    if kind == "external":
        return KafkaTarget(os.environ[ENV_BOOTSTRAP].strip(), "external")
    if kind == "container":
        from testcontainers.kafka import KafkaContainer

        container = KafkaContainer().with_kraft()
        container.start()
        target = KafkaTarget(container.get_bootstrap_server(), "container")
        target._closers.append(container.stop)
        return target
    broker = EmbeddedBroker().start()
    target = KafkaTarget(broker.bootstrap_servers, "embedded", embedded=broker)
    target._closers.append(broker.stop)
    return target


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if os.environ.get(_owner.ENV, "1") != "0":
        _owner.enable()


@pytest.fixture(autouse=True)
def _logsdk_ownership_checked() -> Iterator[None]:
    """Fail the test when logsdk's ownership checks saw a violation on any thread (one
    on a background thread may be caught and logged there; the list keeps it)."""
    yield
    seen = _owner.violations(clear=True)
    if seen:
        pytest.fail(
            "logsdk state used by a thread that does not own it (during or just before this "
            "test):\n" + "\n".join(seen),
            pytrace=False,
        )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("embedded_and_apache") is not None:
        _parametrize_kafka(
            metafunc, ["broker", pytest.param("apache", marks=pytest.mark.apache_kafka)]
        )
        return
    if metafunc.definition.get_closest_marker("each_broker") is None:
        return
    _parametrize_kafka(
        metafunc,
        [
            "broker",
            pytest.param("mock", marks=pytest.mark.mock_cluster),
            pytest.param("apache", marks=pytest.mark.apache_kafka),
        ],
    )


def _parametrize_kafka(metafunc: pytest.Metafunc, kinds: list[Any]) -> None:
    """Run the test once per broker kind in ``kinds``, each through the ``kafka`` fixture."""
    if "kafka_broker" in metafunc.fixturenames and "kafka" not in metafunc.fixturenames:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid} runs on several broker kinds: ask for the 'kafka' "
            "fixture (the cluster of this run), not 'kafka_broker'"
        )
    if "kafka" in metafunc.fixturenames:
        metafunc.parametrize("kafka", kinds, indirect=True)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaTarget]:
    """The session's Kafka cluster (external, container or embedded)."""
    target = open_target()
    try:
        yield target
    finally:
        target.close()


@pytest.fixture(scope="session")
def mock_cluster() -> Iterator[KafkaTarget]:
    """librdkafka's mock cluster, 3 brokers (see [`MockCluster`][logsdk.testing.MockCluster])."""
    target = open_target("mock")
    try:
        yield target
    finally:
        target.close()


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[KafkaTarget]:
    """Apache Kafka, one KRaft node (see [`ApacheKafka`][logsdk.testing.ApacheKafka])."""
    target = open_target("apache")
    try:
        yield target
    finally:
        target.close()


@pytest.fixture(scope="session")
def apache_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """Apache Kafka, three KRaft nodes, shared by the session's tests (never kill its
    nodes: use ``apache_cluster_factory`` for that)."""
    cluster = ApacheKafka(
        3,
        workdir=tmp_path_factory.mktemp("kafka-shared", numbered=True),
        jvm_options=TEST_JVM_OPTIONS,
    ).start()
    try:
        yield cluster
    finally:
        cluster.stop(graceful=False)  # its data and logs are kept under the session's tmp


_FIXTURE_OF_KIND = {"broker": "kafka_broker", "mock": "mock_cluster", "apache": "apache_kafka"}


@pytest.fixture
def kafka(request: pytest.FixtureRequest) -> KafkaTarget:
    """The cluster of this run: ``kafka_broker``, or ``mock_cluster`` in the ``[mock]``
    run and ``apache_kafka`` in the ``[apache]`` run of a test marked ``each_broker``."""
    kind = getattr(request, "param", "broker")
    target: KafkaTarget = request.getfixturevalue(_FIXTURE_OF_KIND[kind])
    return target


def _topic_name(node_name: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", node_name).strip("-")[:40]
    return f"t-{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def fresh_topic(kafka: KafkaTarget, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Factory: ``fresh_topic(partitions=3, **kw)`` creates a uniquely named topic on the
    test's cluster (``kafka``)."""

    def make(partitions: int = 3, **kw: Any) -> str:
        return kafka.create_topic(_topic_name(request.node.name), partitions, **kw)

    return make


@pytest.fixture
def broker_factory() -> Iterator[Callable[..., EmbeddedBroker]]:
    """Factory of started `EmbeddedBroker` instances, killed after the test."""
    if os.environ.get(ENV_BOOTSTRAP, "").strip():
        pytest.skip(
            f"{ENV_BOOTSTRAP} points at an external cluster; fault tests need a broker "
            "they can kill and restart (the embedded one)"
        )
    brokers: list[EmbeddedBroker] = []

    def make(**kw: Any) -> EmbeddedBroker:
        broker = EmbeddedBroker(**kw)
        brokers.append(broker)
        return broker.start()

    yield make
    with contextlib.ExitStack() as stopping:  # every broker stopped, even if one stop raises
        for b in brokers:
            stopping.callback(b.stop, timeout=2.0)


_REPORT_KEY = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    item.stash.setdefault(_REPORT_KEY, {})[report.when] = report
    return report


@pytest.fixture
def apache_cluster_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ApacheKafka]]:
    """Factory: ``apache_cluster_factory(nodes=3, **kw)`` is a started
    [`ApacheKafka`][logsdk.testing.ApacheKafka], killed after the test. Its nodes' data and logs
    are kept under a directory of the test's own (pytest keeps the last runs'); a test
    that failed names each node's log file."""
    clusters: list[ApacheKafka] = []

    def make(nodes: int = 3, **kw: Any) -> ApacheKafka:
        kw.setdefault("workdir", tmp_path_factory.mktemp("kafka", numbered=True))
        kw.setdefault("jvm_options", TEST_JVM_OPTIONS)
        cluster = ApacheKafka(nodes, **kw)
        clusters.append(cluster)
        return cluster.start()

    yield make
    reports = request.node.stash.get(_REPORT_KEY, {})
    failed = any(r.failed for r in reports.values())
    for cluster in clusters:
        if failed:
            paths = ", ".join(f"node {n}: {p}" for n, p in cluster.log_paths().items())
            request.node.add_report_section("teardown", "Apache Kafka logs", paths)
        with contextlib.suppress(Exception):
            cluster.stop(graceful=False)
