"""read_topic, the helper tests count records with: every record from offset 0 to the end,
whatever the broker answers to ListOffsets EARLIEST, and on a broker that deleted offset 0
the records it still keeps."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from logsdk.testing import EmbeddedBroker, create_topic, read_topic
from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = pytest.mark.integration

rdlog = logging.getLogger("logsdk.librdkafka")


def _produce(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "logger": rdlog})
    for v in values:
        p.produce(topic, v, partition=partition)
    assert p.flush(30) == 0


def test_reads_offset_zero_when_the_broker_answers_earliest_above_it(
    broker_factory: Callable[..., EmbeddedBroker],
) -> None:
    """Tansu under load answers EARLIEST with the base offset of the batch it stored
    first, above 0 when two producers' first batches were stored out of order (the proxy
    gives that answer on demand): read_topic still returns the record at offset 0."""
    broker = broker_factory(proxy=True)
    create_topic(broker.bootstrap_servers, "skewed", 1)
    values = [b"%d" % i for i in range(5)]
    _produce(broker.bootstrap_servers, "skewed", values)
    broker.misreport_earliest(1, count=1000, topics=["skewed"])  # until the test ends
    probe = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "probe", "logger": rdlog}
    )
    try:
        low, _ = probe.get_watermark_offsets(TopicPartition("skewed", 0), timeout=10, cached=False)
    finally:
        probe.close()
    assert low == 1  # what a reader starting at EARLIEST is told
    assert broker.earliest_misreports_done == 1
    got = read_topic(broker.bootstrap_servers, "skewed")
    assert sorted(m.value() or b"" for m in got) == values
    assert [m.offset() for m in got] == [0, 1, 2, 3, 4]


def test_reads_what_is_kept_when_offset_zero_was_deleted(
    mock_cluster: KafkaTarget,
) -> None:
    """On a broker that deleted the start of a partition (librdkafka's mock cluster keeps
    about its last 5 MiB, as retention would), offset 0 is out of range: read_topic
    reads from the earliest offset the broker keeps, to the end, without an error."""
    topic = mock_cluster.create_topic("retained", 1)
    values = [b"%03d:" % i + b"x" * 100_000 for i in range(80)]  # 8 MB
    _produce(mock_cluster.bootstrap_servers, topic, values)
    probe = Consumer(
        {"bootstrap.servers": mock_cluster.bootstrap_servers, "group.id": "p", "logger": rdlog}
    )
    try:
        low, high = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    finally:
        probe.close()
    assert 0 < low < high == 80  # the start was deleted
    got = read_topic(mock_cluster.bootstrap_servers, topic)
    assert [m.offset() for m in got] == list(range(low, 80))
    assert [m.value() for m in got] == values[low:]
