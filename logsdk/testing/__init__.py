"""Test helpers shipped with logsdk: a real embedded Kafka broker and fault injection.

Users' own integration tests can use them too:

    from logsdk.testing import EmbeddedBroker

    with EmbeddedBroker(durable=True, proxy=True) as broker:
        ...                 # produce / consume against broker.bootstrap_servers
        broker.kill()       # a broker crash (SIGKILL)
        broker.restart()    # back on the same port, data kept (durable=True)
        broker.cut()        # the network goes away; the broker stays up
        broker.heal()
        broker.drop_produce_as_duplicate()  # the next batch is lost, yet "acked"

[`MockCluster`][logsdk.testing.MockCluster] is a second, independent Kafka implementation
(librdkafka's mock cluster): several brokers and commit metadata kept, but no kill, restart or
network cut.

[`ApacheKafka`][logsdk.testing.ApacheKafka] is Apache Kafka itself (KRaft, one or three nodes, from
the jars Maven Central serves; needs Java 17+ and, for the first fetch, Maven): leaders that move,
``min.insync.replicas``, a real group coordinator and transactions:

    with ApacheKafka(nodes=3, proxy=True) as kafka:
        kafka.kill(kafka.leader_of("app-logs", 0))   # the leader crashes
        kafka.restart(1, graceful=True)              # a controlled restart of node 1

The pytest fixtures (``kafka_broker``, ``fresh_topic``, ``broker_factory``) are
in `logsdk.testing.pytest_plugin`, registered as a pytest plugin.

[`producer_hooks()`][logsdk.testing.producer_hooks] gives a test hooks into one ``LogProducer``:
trace its delivery reports, wrap its client to fail at an exact instant, slow its connections, look
at its in-flight table and shm ring.
"""

from logsdk.testing._admin import create_topic, delete_topic, read_topic
from logsdk.testing._apache import KAFKA_VERSION, ApacheKafka
from logsdk.testing._broker import EmbeddedBroker, tansu_binary
from logsdk.testing._check import DeliveryReport, check_delivery, identity
from logsdk.testing._hooks import producer_hooks
from logsdk.testing._mock import MockCluster
from logsdk.testing._processes import free_port, port_is_free

__all__ = [
    "KAFKA_VERSION",
    "ApacheKafka",
    "DeliveryReport",
    "EmbeddedBroker",
    "MockCluster",
    "check_delivery",
    "create_topic",
    "delete_topic",
    "free_port",
    "identity",
    "port_is_free",
    "producer_hooks",
    "read_topic",
    "tansu_binary",
]
