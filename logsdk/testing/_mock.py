"""librdkafka's mock cluster as a second broker kind for tests, beside EmbeddedBroker.

librdkafka (the C library inside confluent-kafka) hosts a cluster of Kafka-protocol
brokers on loopback ports, in threads of a client handle of its own.
[`MockCluster`][logsdk.testing.MockCluster] hosts it in a child process (``python -m
logsdk.testing._mock``, driven by one JSON line per command on its stdin), so that the test's own
process holds no broker threads or broker memory: a fork in a test copies none of them and an RSS
bound measures the client alone. Any client reaches it through its ports. It was written by other
people than Tansu, to the same protocol, and differs from it where logsdk needs it: it keeps offset
commit metadata (Tansu drops it) and it has several brokers (partition leaders on
different brokers, replication factor 3). It is driven here through librdkafka's own mock
API (``rd_kafka_mock_*``, called with ctypes on the librdkafka that confluent-kafka
loaded), which creates topics with an exact partition count and takes brokers down.

What it can and cannot show:

- can: a multi-broker cluster; topics of any partition count and replication factor
  ([`MockCluster.create_topic()`][logsdk.testing.MockCluster.create_topic]; a topic first named by a
  client is auto-created with 4 partitions); idempotent and transactional producers; consumer
  groups; commit metadata kept; a broker down while the others serve
  ([`MockCluster.broker_down()`][logsdk.testing.MockCluster.broker_down]);
- keeps only about the last 5 MiB of each partition (older records are deleted as new
  ones arrive, as retention would): a test that reads back more than that from one
  partition must spread it over more partitions;
- cannot: a restart of the broker (its data lives in the child's memory and is gone
  when the cluster stops), a network cut or stall of the proxy kind, durable
  storage: use [`EmbeddedBroker`][logsdk.testing.EmbeddedBroker] for those.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import logging
import subprocess
import sys
import threading
import time
from types import TracebackType
from typing import Literal

import confluent_kafka  # loads librdkafka

from logsdk._fork import AdminClient
from logsdk._types import ClientConfig
from logsdk.errors import BrokerStartError
from logsdk.testing._broker import role_config

_RD_KAFKA_PRODUCER = 0
MOCK_SESSION_TIMEOUT_MS = 3500  # over the 3 s a new group's first join waits
MOCK_HEARTBEAT_INTERVAL_MS = 500
_lib: ctypes.CDLL | None = None
#: librdkafka's log lines of the clients made here, as the producer's: through Python
#: logging. (The hosting handle of the child process logs errors only, on its stderr.)
rdlog = logging.getLogger("logsdk.librdkafka")


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka confluent-kafka runs on (the same library, not a second copy)."""
    global _lib
    if _lib is not None:
        return _lib
    path = None
    try:
        with open("/proc/self/maps") as maps:  # the one confluent_kafka's module loaded
            for line in maps:
                if "librdkafka" in line:
                    path = line.split()[-1]
                    break
    except OSError:
        pass
    path = path or ctypes.util.find_library("rdkafka")
    if path is None:
        raise BrokerStartError(
            f"librdkafka not found (confluent-kafka {confluent_kafka.version()[0]})"
        )
    lib = ctypes.CDLL(path)
    vp, cp, i32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32
    for name, res, args in (
        ("rd_kafka_conf_new", vp, []),
        ("rd_kafka_conf_set", ctypes.c_int, [vp, cp, cp, cp, ctypes.c_size_t]),
        ("rd_kafka_new", vp, [ctypes.c_int, vp, cp, ctypes.c_size_t]),
        ("rd_kafka_destroy", None, [vp]),
        ("rd_kafka_err2str", cp, [ctypes.c_int]),
        ("rd_kafka_mock_cluster_new", vp, [vp, ctypes.c_int]),
        ("rd_kafka_mock_cluster_destroy", None, [vp]),
        ("rd_kafka_mock_cluster_bootstraps", cp, [vp]),
        ("rd_kafka_mock_topic_create", ctypes.c_int, [vp, cp, ctypes.c_int, ctypes.c_int]),
        ("rd_kafka_mock_broker_set_down", ctypes.c_int, [vp, i32]),
        ("rd_kafka_mock_broker_set_up", ctypes.c_int, [vp, i32]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    _lib = lib
    return lib


class MockCluster:
    """A librdkafka mock cluster of ``brokers`` brokers (ids 1..n) on loopback, hosted by
    a child process, for tests.

    Use as a context manager (or
    [`start()`][logsdk.testing.MockCluster.start]/[`stop()`][logsdk.testing.MockCluster.stop]);
    clients connect through [`bootstrap_servers`][logsdk.testing.MockCluster.bootstrap_servers].
    """

    def __init__(self, brokers: int = 3) -> None:
        if not isinstance(brokers, int) or isinstance(brokers, bool) or not 1 <= brokers <= 16:
            raise ValueError(f"brokers must be 1-16, got {brokers!r}")
        self.brokers = brokers
        self._proc: subprocess.Popen[str] | None = None
        self._bootstrap: str | None = None
        self._lock = threading.Lock()  # one command and its answer at a time

    def start(self, timeout: float = 30.0) -> MockCluster:
        """Start the hosting process and the cluster; returns once its brokers listen."""
        if self._proc is not None:
            return self
        proc = subprocess.Popen(
            [sys.executable, "-m", "logsdk.testing._mock", str(self.brokers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._proc = proc
        try:
            answer = self._answer(timeout)
        except BaseException:
            self.stop()
            raise
        self._bootstrap = str(answer["bootstrap"])
        return self

    def _answer(self, timeout: float) -> dict[str, object]:
        proc = self._proc
        if proc is None or proc.stdout is None:
            raise BrokerStartError("the mock cluster is not started")
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()))  # type: ignore[union-attr]
        reader.daemon = True
        reader.start()
        reader.join(timeout)
        if not box or not box[0]:
            raise BrokerStartError(
                f"the mock cluster's process did not answer (exit status {proc.poll()})"
            )
        answer: dict[str, object] = json.loads(box[0])
        if "error" in answer:
            raise BrokerStartError(f"mock cluster: {answer['error']}")
        return answer

    def _call(self, timeout: float = 10.0, **command: object) -> dict[str, object]:
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None:
                raise BrokerStartError("the mock cluster is not started")
            try:
                proc.stdin.write(json.dumps(command) + "\n")
                proc.stdin.flush()
            except OSError as exc:
                raise BrokerStartError(f"the mock cluster's process is gone: {exc}") from exc
            return self._answer(timeout)

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of every broker of the cluster."""
        if self._bootstrap is None:
            raise BrokerStartError("the mock cluster is not started")
        return self._bootstrap

    def client_config(
        self, role: Literal["producer", "consumer", "admin"] = "consumer"
    ) -> ClientConfig:
        """librdkafka settings for ``role`` on this cluster.

        For consumers: a ``session.timeout.ms`` of 3.5 s and a 0.5 s heartbeat. A
        rebalance here waits for every member to rejoin up to the session timeout (45 s
        by default), and a new group's first join waits 3 s, so a session timeout of 3 s
        or less never completes a join.
        """
        return role_config(
            self.bootstrap_servers, role, MOCK_SESSION_TIMEOUT_MS, MOCK_HEARTBEAT_INTERVAL_MS
        )

    @property
    def broker_ids(self) -> list[int]:
        """The brokers' ids (1..n)."""
        return list(range(1, self.brokers + 1))

    def create_topic(
        self,
        name: str,
        partitions: int = 3,
        replication_factor: int | None = None,
        timeout: float = 30.0,
    ) -> str:
        """Create ``name`` with ``partitions`` partitions (replication factor: every
        broker, by default) and wait until a client sees all of them with a leader."""
        rf = self.brokers if replication_factor is None else replication_factor
        self._call(op="create_topic", name=name, partitions=partitions, rf=rf)
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "logger": rdlog})
        deadline = time.monotonic() + timeout
        while True:
            md = admin.list_topics(name, timeout=max(0.5, deadline - time.monotonic()))
            t = md.topics.get(name)
            if (
                t is not None
                and t.error is None
                and len(t.partitions) == partitions
                and all(p.leader >= 0 for p in t.partitions.values())
            ):
                return name
            if time.monotonic() >= deadline:
                raise BrokerStartError(f"topic {name!r} not visible within {timeout}s")
            time.sleep(0.05)

    def broker_down(self, broker_id: int) -> None:
        """Take one broker down (its connections are closed, new ones refused); the
        others go on serving. Partitions it leads have no leader until it is up again."""
        self._set(broker_id, up=False)

    def broker_up(self, broker_id: int) -> None:
        """Bring a broker taken down by [`broker_down()`][logsdk.testing.MockCluster.broker_down]
        back."""
        self._set(broker_id, up=True)

    def _set(self, broker_id: int, up: bool) -> None:
        if broker_id not in self.broker_ids:
            raise ValueError(f"broker_id must be one of {self.broker_ids}, got {broker_id!r}")
        self._call(op="up" if up else "down", broker=broker_id)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the cluster: its brokers go away with their data."""
        with self._lock:
            proc, self._proc, self._bootstrap = self._proc, None, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # end of commands: the host destroys the cluster
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> MockCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"MockCluster(brokers={self.brokers}, bootstrap={self._bootstrap!r})"


def _host(brokers: int) -> int:
    """The child's side: start the cluster, print its bootstrap, serve commands until
    stdin ends, destroy it."""
    lib = _librdkafka()
    conf = lib.rd_kafka_conf_new()
    err = ctypes.create_string_buffer(512)
    # Errors only: the hosting handle has no brokers of its own to connect to.
    lib.rd_kafka_conf_set(conf, b"log_level", b"3", err, len(err))
    rk = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, err, len(err))
    if not rk:
        print(json.dumps({"error": f"librdkafka refused the hosting handle: {err.value!r}"}))
        return 1
    mc = lib.rd_kafka_mock_cluster_new(rk, brokers)
    if not mc:
        print(json.dumps({"error": "librdkafka did not start a mock cluster"}), flush=True)
        lib.rd_kafka_destroy(rk)
        return 1
    print(json.dumps({"bootstrap": lib.rd_kafka_mock_cluster_bootstraps(mc).decode()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "create_topic":
            code = lib.rd_kafka_mock_topic_create(
                mc, cmd["name"].encode(), cmd["partitions"], cmd["rf"]
            )
        elif cmd["op"] in ("up", "down"):
            fn = (
                lib.rd_kafka_mock_broker_set_up
                if cmd["op"] == "up"
                else lib.rd_kafka_mock_broker_set_down
            )
            code = fn(mc, cmd["broker"])
        else:
            print(json.dumps({"error": f"unknown command {cmd['op']!r}"}), flush=True)
            continue
        if code:
            why = lib.rd_kafka_err2str(code).decode()
            print(json.dumps({"error": f"{cmd['op']} {cmd}: {why}"}), flush=True)
        else:
            print(json.dumps({"ok": True}), flush=True)
    lib.rd_kafka_mock_cluster_destroy(mc)
    lib.rd_kafka_destroy(rk)
    return 0


if __name__ == "__main__":
    sys.exit(_host(int(sys.argv[1])))
