"""Apache Kafka itself (KRaft), one or three nodes on loopback, from Maven Central's jars.

No tarball and no Docker: the broker's jars come from Maven Central into logsdk's jar
cache (`logsdk.testing._jars`, the pom in ``apache_kafka/pom.xml``); each node's
storage is formatted with Kafka's own ``kafka.tools.StorageTool``, and the node runs as
``java -cp JARS kafka.Kafka server.properties``. Every node is broker and controller at
once (``process.roles=broker,controller``), the voters fixed in the properties.

Invariants:
- every JVM gets SIGKILL when the thread that started it dies (started from the same
  long-lived spawner thread as the embedded broker, with ``PR_SET_PDEATHSIG``), and
  ``atexit`` kills whatever is still running: a test process that dies leaves no JVM;
- a node's ports and data directory are fixed at the first start, so a node killed or
  stopped comes back on the same addresses with the data it had;
- [`ApacheKafka.start()`][logsdk.testing.ApacheKafka.start] (and `restart()`) return only once an
admin client,
  connected to the nodes' replication listener (never through the proxy), sees every
  running node registered;
- three listeners a node: ``CLIENT`` (clients; advertised as the proxy's port with
  ``proxy=True``), ``INTERNAL`` (replication, and the fixture's own admin requests) and
  ``CONTROLLER`` (the KRaft quorum): cutting the clients' network never cuts the
  cluster's own.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from logsdk._types import ClientConfig
from logsdk.errors import BrokerError, BrokerStartError, ConfigError, PortInUseError
from logsdk.testing._broker import role_config
from logsdk.testing._jars import java_binary, maven_jars
from logsdk.testing._processes import ChildProcess, free_port, port_is_free
from logsdk.testing._proxy import TcpProxy

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

log = logging.getLogger("logsdk.testing.apache")

#: The Apache Kafka release the tests run (as in ``apache_kafka/pom.xml``).
KAFKA_VERSION = "4.1.1"
POM = Path(__file__).parent / "apache_kafka" / "pom.xml"

#: Consumer group timings: Kafka's group coordinator accepts session timeouts down to
#: ``group.min.session.timeout.ms`` (set to 1 s below); a SIGKILLed member is evicted after
#: one session timeout.
SESSION_TIMEOUT_MS = 3000
HEARTBEAT_INTERVAL_MS = 300

#: JVM options of a node: a small heap (a test node holds little), G1 with short pauses.
JVM_OPTIONS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

#: For tests: the JIT's first tier only. A node's start then costs about 3.5 s of CPU
#: instead of 6 (format and start, one node, measured twice each); what a test does on it
#: runs a little slower, which no test measures. Benchmarks keep `JVM_OPTIONS`.
TEST_JVM_OPTIONS = (*JVM_OPTIONS, "-XX:TieredStopAtLevel=1")

_LIVE: weakref.WeakSet[ApacheKafka] = weakref.WeakSet()


def kafka_classpath() -> str:
    """The broker's classpath (the jars fetched by Maven on first use)."""
    return os.pathsep.join(str(p) for p in maven_jars(POM, f"apache-kafka-{KAFKA_VERSION}"))


def cluster_properties(nodes: int) -> dict[str, str]:
    """The settings of a test cluster of ``nodes`` nodes, beyond its addresses and paths.

    Three nodes: replication factor 3 and ``min.insync.replicas=2`` for every topic, the
    internal ones included. The internal topics get few partitions (a first group or
    transaction would otherwise create 50), the group coordinator no initial rebalance
    delay, and a node that stops heartbeating is fenced after 3 s (a leader SIGKILLed is
    replaced within seconds, not Kafka's default 9 s).
    """
    if nodes < 1:
        raise ConfigError(f"nodes must be >= 1, got {nodes!r}")
    isr = "2" if nodes >= 3 else "1"
    rf = str(nodes)
    return {
        "num.partitions": "3",
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "share.coordinator.state.topic.num.partitions": "4",
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "group.consumer.min.session.timeout.ms": "1000",
        "group.consumer.session.timeout.ms": str(SESSION_TIMEOUT_MS),
        "group.consumer.min.heartbeat.interval.ms": "300",
        "group.consumer.heartbeat.interval.ms": str(HEARTBEAT_INTERVAL_MS),
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "3000",
        "replica.lag.time.max.ms": "5000",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "background.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.threads": "1",
    }


def rack_of(node_id: int) -> str:
    """The rack of a node: one rack each (``rack-a``, ``rack-b``, ...), so that replica
    placement across racks (seeds 000 and 004) has racks to spread over."""
    return f"rack-{chr(ord('a') + (node_id - 1) % 26)}"


def _cluster_id() -> str:
    """A cluster id as ``StorageTool random-uuid`` prints it (base64url of 16 random
    bytes, never starting with '-', which a command line would take for an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


@dataclass
class _Node:
    """One node's fixed addresses and directory, and its process while it runs."""

    node_id: int
    client_port: int
    internal_port: int
    controller_port: int
    proxy_port: int | None
    home: Path
    child: ChildProcess | None = None
    proxy: TcpProxy | None = None
    paused: bool = False

    @property
    def log_path(self) -> Path:
        return self.home / "server.log"

    def alive(self) -> bool:
        return self.child is not None and self.child.alive()


class ApacheKafka:
    """Apache Kafka (KRaft) on loopback: ``nodes`` nodes, each broker and controller.

    Use it as a context manager, or call [`start()`][logsdk.testing.ApacheKafka.start] and
    [`stop()`][logsdk.testing.ApacheKafka.stop]:

        with ApacheKafka(nodes=3, proxy=True) as kafka:
            Producer(kafka.client_config("producer")).produce(...)
            kafka.kill(kafka.leader_of("logs", 0))   # the partition's leader crashes
            kafka.restart(node)                      # back on its ports, with its data
            kafka.cut()                              # clients lose the network

    Needs a Java 17+ runtime, and Maven the first time (the jars are then cached).
    Nothing is started in the constructor. ``port`` is node 1's client port (the others,
    and every other port, are picked free). ``properties`` override the test cluster's
    settings (`cluster_properties()`). ``workdir`` keeps each node's data and logs
    (``node-N/server.log``) there instead of in a temporary directory removed by
    [`stop()`][logsdk.testing.ApacheKafka.stop].
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        port: int | None = None,
        proxy: bool = False,
        properties: Mapping[str, str | int] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        start_timeout: float = 120.0,
        jvm_options: Iterable[str] = JVM_OPTIONS,
    ) -> None:
        if not isinstance(nodes, int) or nodes < 1:
            raise ConfigError(f"nodes must be an int >= 1, got {nodes!r}")
        if start_timeout <= 0:
            raise ConfigError(f"start_timeout must be > 0 seconds, got {start_timeout!r}")
        if port is not None and not (isinstance(port, int) and 0 < port < 65536):
            raise ConfigError(f"port must be an int in 1..65535 or None, got {port!r}")
        self._requested_port = port
        self.nodes = nodes
        self.proxy = proxy
        self.start_timeout = start_timeout
        self.properties = {
            **cluster_properties(nodes),
            **{k: str(v) for k, v in (properties or {}).items()},
        }
        self.jvm_options = tuple(jvm_options)
        self._keep = workdir is not None
        self._workdir = Path(workdir) if workdir is not None else None
        self._nodes: dict[int, _Node] = {}
        self._classpath: str | None = None
        self._lock = threading.RLock()

    # -- addresses -------------------------------------------------------------------------

    @property
    def node_ids(self) -> list[int]:
        """The ids of every node (1..nodes), running or not."""
        return list(range(1, self.nodes + 1))

    @property
    def bootstrap_servers(self) -> str:
        """Every node's client address (the proxies' with ``proxy=True``)."""
        self._need_started("bootstrap_servers")
        return ",".join(f"127.0.0.1:{self._client_port(n)}" for n in self._nodes.values())

    @property
    def workdir(self) -> Path | None:
        """Where the nodes' data and logs are (None before the first start)."""
        return self._workdir

    def log_paths(self) -> dict[int, Path]:
        """Each node's log file (log4j's ``server.log``; the JVM's own output beside it)."""
        return {n.node_id: n.log_path for n in self._nodes.values()}

    def log_tail(self, node_id: int, lines: int = 30) -> str:
        """The last lines of a node's log."""
        node = self._node(node_id)
        return node.child.tail(lines) if node.child is not None else ""

    def client_config(
        self, role: Literal["producer", "consumer", "admin"] = "consumer"
    ) -> ClientConfig:
        """librdkafka settings for ``role``: the bootstrap servers, and for consumers group
        timings that evict a dead member within seconds."""
        return role_config(self.bootstrap_servers, role, SESSION_TIMEOUT_MS, HEARTBEAT_INTERVAL_MS)

    def pid(self, node_id: int) -> int | None:
        """PID of a node's JVM, or None when it is not running."""
        node = self._node(node_id)
        return node.child.pid if node.child is not None and node.child.alive() else None

    def child_pids(self) -> list[int]:
        """PIDs of every node's JVM currently alive."""
        return [n.child.pid for n in self._nodes.values() if n.child is not None and n.alive()]

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> ApacheKafka:
        """Start every node that is not running; returns once all are registered."""
        with self._lock:
            first = not self._nodes
            if first:
                self._prepare()
            try:
                for node in self._nodes.values():
                    if not node.alive():
                        self._spawn(node)
                self.wait_ready(self.start_timeout)
            except BaseException:
                if first:
                    self._teardown(graceful=False)
                raise
            return self

    def stop(self, timeout: float = 30.0, *, graceful: bool = True) -> None:
        """Stop every node (SIGTERM: a controlled shutdown; SIGKILL after ``timeout``, or
        at once without ``graceful``), the proxies, and remove the data unless a
        ``workdir`` was given."""
        with self._lock:
            self._teardown(graceful=graceful, timeout=timeout)

    def kill(self, node_id: int | None = None) -> None:
        """SIGKILL one node (every node when None): a crash."""
        with self._lock:
            for node in self._select(node_id):
                if node.child is not None:
                    node.child.kill()
                    log.info("Apache Kafka node %d killed", node.node_id)
                node.child = None
                node.paused = False

    def stop_node(self, node_id: int, timeout: float = 30.0) -> None:
        """Stop one node with a controlled shutdown (its leaderships move first);
        SIGKILL after ``timeout`` seconds."""
        with self._lock:
            node = self._node(node_id)
            if node.child is not None:
                node.child.terminate(timeout)
                log.info("Apache Kafka node %d stopped", node_id)
            node.child = None
            node.paused = False

    def start_node(self, node_id: int, timeout: float | None = None) -> None:
        """Start one node again (same ports, same data); returns once it is registered."""
        with self._lock:
            node = self._node(node_id)
            if not node.alive():
                self._spawn(node)
            self.wait_ready(self.start_timeout if timeout is None else timeout)

    def restart(self, node_id: int, graceful: bool = False) -> None:
        """Kill (or stop, when ``graceful``) a node and start it again."""
        if graceful:
            self.stop_node(node_id)
        else:
            self.kill(node_id)
        self.start_node(node_id)

    def pause(self, node_id: int) -> None:
        """SIGSTOP a node: it holds its connections and answers nothing."""
        with self._lock:
            node = self._node(node_id)
            if node.child is None or not node.alive():
                raise BrokerStartError(f"cannot pause: node {node_id} is not running")
            node.child.signal(signal.SIGSTOP)
            node.paused = True

    def resume(self, node_id: int) -> None:
        """SIGCONT a paused node."""
        with self._lock:
            node = self._node(node_id)
            if node.child is not None:
                node.child.signal(signal.SIGCONT)
            node.paused = False

    def cut(self, node_id: int | None = None) -> None:
        """Reset the clients' connections to one node (every node when None) and refuse
        new ones until [`heal()`][logsdk.testing.ApacheKafka.heal] (needs ``proxy=True``).
        Replication goes on."""
        for node in self._select(node_id):
            self._need_proxy(node, "cut").cut()

    def heal(self, node_id: int | None = None) -> None:
        """Let clients connect again after [`cut()`][logsdk.testing.ApacheKafka.cut]."""
        for node in self._select(node_id):
            self._need_proxy(node, "heal").heal()

    def is_running(self, node_id: int | None = None) -> bool:
        """True while the node's JVM (every node's, when None) is alive (paused counts)."""
        nodes = self._select(node_id) if self._nodes else []
        return bool(nodes) and all(n.alive() for n in nodes)

    def is_paused(self, node_id: int) -> bool:
        """True between [`pause()`][logsdk.testing.ApacheKafka.pause] and
        [`resume()`][logsdk.testing.ApacheKafka.resume] of that node."""
        return self._node(node_id).paused

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every running node is registered and answers (asked on the
        replication listener, so a cut proxy or a paused node elsewhere does not count);
        `BrokerStartError` with the logs' tails otherwise."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            running = [n for n in self._nodes.values() if n.alive() and not n.paused]
            dead = [n for n in self._nodes.values() if n.child is not None and not n.alive()]
            if dead:
                node = dead[0]
                assert node.child is not None
                tail = node.child.tail()
                node.child.wait_dead()
                code = node.child.proc.returncode
                node.child = None
                raise BrokerStartError(
                    f"Apache Kafka node {node.node_id} exited with status {code} "
                    f"(log: {node.log_path})",
                    tail,
                )
            if running:
                try:
                    seen = self._registered(running)
                except BrokerError as exc:
                    last = exc
                else:
                    if {n.node_id for n in running} <= seen:
                        return
                    last = f"registered nodes {sorted(seen)}"
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"--- node {n.node_id} ({n.log_path}) ---\n{n.child.tail(15)}"
                    for n in running
                    if n.child is not None
                )
                raise BrokerStartError(
                    f"Apache Kafka did not register every running node within {timeout}s "
                    f"(last: {last})",
                    tails,
                )
            time.sleep(0.1)

    # -- what the cluster says -------------------------------------------------------------

    def leader_of(self, topic: str, partition: int, timeout: float = 10.0) -> int:
        """The node id leading ``topic``'s ``partition`` now."""
        deadline = time.monotonic() + timeout
        while True:
            md = self._admin().list_topics(topic, timeout=5).topics.get(topic)
            if md is not None and md.error is None and partition in md.partitions:
                leader = md.partitions[partition].leader
                if leader >= 0:
                    return int(leader)
            if time.monotonic() > deadline:
                raise BrokerError(f"{topic}[{partition}] has no leader after {timeout}s")
            time.sleep(0.1)

    def isr_of(self, topic: str, partition: int) -> list[int]:
        """The in-sync replicas of ``topic``'s ``partition`` as the cluster reports them."""
        md = self._admin().list_topics(topic, timeout=5).topics[topic]
        return sorted(int(r) for r in md.partitions[partition].isrs)

    def coordinator_of(self, group: str, timeout: float = 10.0) -> int:
        """The node id of ``group``'s coordinator."""
        admin = self._admin()  # kept until the answer came: its futures need the client
        futures = admin.describe_consumer_groups([group], request_timeout=timeout)
        return int(futures[group].result(timeout).coordinator.id)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(timeout=10.0)

    def __repr__(self) -> str:
        running = [n.node_id for n in self._nodes.values() if n.alive()]
        return (
            f"ApacheKafka({KAFKA_VERSION}, nodes={self.nodes}, proxy={self.proxy}, "
            f"running={running})"
        )

    # -- internals -------------------------------------------------------------------------

    def _need_started(self, what: str) -> None:
        if not self._nodes:
            raise BrokerStartError(f"{what}: Apache Kafka has not been started yet: call start()")

    def _node(self, node_id: int) -> _Node:
        self._need_started(f"node {node_id}")
        try:
            return self._nodes[node_id]
        except KeyError:
            raise ConfigError(
                f"no node {node_id!r}: this cluster's nodes are {self.node_ids}"
            ) from None

    def _select(self, node_id: int | None) -> list[_Node]:
        return list(self._nodes.values()) if node_id is None else [self._node(node_id)]

    def _client_port(self, node: _Node) -> int:
        return node.proxy_port if node.proxy_port is not None else node.client_port

    def _need_proxy(self, node: _Node, what: str) -> TcpProxy:
        if not self.proxy:
            raise ConfigError(f"{what}() needs ApacheKafka(proxy=True)")
        assert node.proxy is not None
        return node.proxy

    def _admin(self, nodes: list[_Node] | None = None) -> AdminClient:
        """An admin client on the replication listener of ``nodes`` (default: all)."""
        from logsdk._fork import AdminClient

        quiet = logging.getLogger("logsdk.testing.apache.librdkafka")
        quiet.setLevel(logging.CRITICAL)
        chosen = list(self._nodes.values()) if nodes is None else nodes
        internal = ",".join(f"127.0.0.1:{n.internal_port}" for n in chosen)
        return AdminClient({"bootstrap.servers": internal, "logger": quiet})

    def _registered(self, running: list[_Node]) -> set[int]:
        """The running nodes that answer a metadata request themselves and that the
        cluster's metadata lists (a node's own answer, so that a stale listing of a node
        still starting, as a cluster without its quorum gives, does not count)."""
        from confluent_kafka import KafkaException

        seen: set[int] = set()
        for node in running:
            try:
                brokers = self._admin([node]).list_topics(timeout=2).brokers
            except KafkaException as exc:
                raise BrokerError(f"node {node.node_id}: {exc}") from exc
            if node.node_id in brokers:
                seen.add(node.node_id)
        return seen

    def _prepare(self) -> None:
        """Pick every port, write each node's properties and format its storage."""
        self._classpath = kafka_classpath()
        java_binary()  # a clear error now rather than a failed spawn later
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="logsdk-kafka-"))
        self._workdir.mkdir(parents=True, exist_ok=True)
        taken: set[int] = set()

        def port() -> int:
            while True:
                p = free_port()
                if p not in taken:
                    taken.add(p)
                    return p

        if self._requested_port is not None:
            if not port_is_free(self._requested_port):
                raise PortInUseError(self._requested_port)
            taken.add(self._requested_port)
        for node_id in self.node_ids:
            asked = self._requested_port if node_id == 1 else None
            self._nodes[node_id] = _Node(
                node_id=node_id,
                client_port=asked if asked is not None else port(),
                internal_port=port(),
                controller_port=port(),
                proxy_port=port() if self.proxy else None,
                home=self._workdir / f"node-{node_id}",
            )
        _LIVE.add(self)
        voters = ",".join(
            f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self._nodes.values()
        )
        cluster_id = _cluster_id()
        formats = []
        for node in self._nodes.values():
            node.home.mkdir(parents=True, exist_ok=True)
            self._write_config(node, voters)
            formats.append(
                ChildProcess(
                    f"format-{node.node_id}",
                    [
                        *self._java(node),
                        "kafka.tools.StorageTool",
                        "format",
                        "--ignore-formatted",
                        "-t",
                        cluster_id,
                        "-c",
                        str(node.home / "server.properties"),
                    ],
                    dict(os.environ),
                    node.home / "format.log",
                )
            )
        for fmt in formats:
            try:
                fmt.proc.wait(self.start_timeout)
            except Exception:
                fmt.kill()
                raise
            fmt.wait_dead()
            if fmt.proc.returncode != 0:
                raise BrokerStartError(
                    f"kafka.tools.StorageTool format exited with status {fmt.proc.returncode}",
                    fmt.tail(),
                )
        if self.proxy:
            for node in self._nodes.values():
                assert node.proxy_port is not None
                node.proxy = TcpProxy(node.proxy_port, node.client_port)
                node.proxy.start()

    def _write_config(self, node: _Node, voters: str) -> None:
        advertised = self._client_port(node)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": (
                f"CLIENT://127.0.0.1:{node.client_port},"
                f"INTERNAL://127.0.0.1:{node.internal_port},"
                f"CONTROLLER://127.0.0.1:{node.controller_port}"
            ),
            "advertised.listeners": (
                f"CLIENT://127.0.0.1:{advertised},INTERNAL://127.0.0.1:{node.internal_port}"
            ),
            "listener.security.protocol.map": (
                "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
            "inter.broker.listener.name": "INTERNAL",
            "controller.listener.names": "CONTROLLER",
            "broker.rack": rack_of(node.node_id),
            "log.dirs": str(node.home / "data"),
            **self.properties,
        }
        text = "".join(f"{k}={v}\n" for k, v in props.items())
        (node.home / "server.properties").write_text(text)
        (node.home / "log4j2.properties").write_text(
            "status = error\n"
            "appender.file.type = File\n"
            "appender.file.name = file\n"
            f"appender.file.fileName = {node.log_path}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.file.ref = file\n"
            "logger.state.name = state.change.logger\n"
            "logger.state.level = WARN\n"
        )

    def _java(self, node: _Node) -> list[str]:
        assert self._classpath is not None
        return [
            java_binary(),
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={node.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={node.home}",
            "-cp",
            self._classpath,
        ]

    def _spawn(self, node: _Node) -> None:
        cmd = [*self._java(node), "kafka.Kafka", str(node.home / "server.properties")]
        node.child = ChildProcess(
            f"kafka-{node.node_id}", cmd, dict(os.environ), node.home / "jvm.log"
        )
        node.paused = False
        log.info("Apache Kafka node %d starting (pid %s)", node.node_id, node.child.pid)

    def _teardown(self, graceful: bool, timeout: float = 10.0) -> None:
        nodes = list(self._nodes.values())
        for node in nodes:
            if node.child is not None and node.alive():
                node.child.signal(signal.SIGCONT)
                node.child.signal(signal.SIGTERM if graceful else signal.SIGKILL)
        deadline = time.monotonic() + timeout
        for node in nodes:
            if node.child is None:
                continue
            with contextlib.suppress(Exception):
                node.child.proc.wait(max(0.0, deadline - time.monotonic()))
            if node.child.alive():
                node.child.kill()
            node.child.wait_dead()
            node.child = None
            node.paused = False
        for node in nodes:
            if node.proxy is not None:
                node.proxy.stop()
                node.proxy = None
        _LIVE.discard(self)
        if not self._keep and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._nodes.clear()


@atexit.register
def _kill_all() -> None:
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.stop(graceful=False)
