"""librdkafka's mock cluster as a second broker kind for tests, beside EmbeddedBroker.

A confluent-kafka client configured with ``test.mock.num.brokers`` hosts a cluster of that
many Kafka-protocol brokers on loopback ports, in its own threads; any other client (in
this process or another) reaches it through those ports. It was written by other people
than Tansu, to the same protocol, and differs from it where logsdk needs it: it keeps
offset commit metadata (Tansu drops it) and it has several brokers (partition leaders on
different brokers, replication factor 3).

What it can and cannot show:

- can: a multi-broker cluster, topics auto-created on first produce (4 partitions,
  replication factor = the number of brokers), idempotent producers, consumer groups,
  commit metadata kept;
- cannot: a process kill or restart of the broker (it lives in this process's client; its
  data is lost when the cluster stops), a network cut, a stall, durable storage, topics
  created through the admin API (``CreateTopics`` did not complete here): use
  :class:`~logsdk.testing.EmbeddedBroker` for those.
"""

from __future__ import annotations

from types import TracebackType

from confluent_kafka import KafkaException, Producer

from logsdk.errors import BrokerStartError


class MockCluster:
    """A librdkafka mock cluster of ``brokers`` brokers on loopback, for tests.

    Use as a context manager (or :meth:`start`/:meth:`stop`); clients connect through
    :attr:`bootstrap_servers`. Topics are created by the first record produced to them.
    """

    def __init__(self, brokers: int = 3) -> None:
        if not isinstance(brokers, int) or not 1 <= brokers <= 16:
            raise ValueError(f"brokers must be 1-16, got {brokers!r}")
        self.brokers = brokers
        self._host: Producer | None = None
        self._bootstrap: str | None = None

    def start(self) -> MockCluster:
        """Start the cluster (a client hosting it) and learn its brokers' addresses."""
        host = Producer(
            {
                "test.mock.num.brokers": self.brokers,
                "bootstrap.servers": "mock:1",  # replaced by the mock brokers
                "log_level": 3,
            }
        )
        try:
            md = host.list_topics(timeout=10)
        except KafkaException as exc:
            raise BrokerStartError(f"the mock cluster did not answer: {exc}") from exc
        if len(md.brokers) != self.brokers:
            raise BrokerStartError(f"the mock cluster lists {len(md.brokers)} brokers")
        self._bootstrap = ",".join(
            f"{b.host}:{b.port}" for b in sorted(md.brokers.values(), key=lambda b: b.id)
        )
        self._host = host
        return self

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of every broker of the cluster."""
        if self._bootstrap is None:
            raise BrokerStartError("the mock cluster is not started")
        return self._bootstrap

    def stop(self) -> None:
        """Stop the cluster: its brokers go away with their data."""
        self._host = None  # the hosting client's destruction stops the mock brokers
        self._bootstrap = None

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
