"""The second Kafka implementation, librdkafka's mock cluster: 3 brokers, commit metadata
kept. It shows what Tansu cannot: the producer on a replication-factor-3 topic, and a
broker down while the others serve (the consumer's out-of-order progress kept in commit
metadata: tests/integration/test_commit_metadata.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from logsdk import LogProducer
from logsdk.testing import MockCluster, check_delivery, read_topic
from tests.conftest import rdkafka_config

pytestmark = [pytest.mark.integration, pytest.mark.mock_cluster]


@pytest.fixture(scope="module")
def mock() -> Iterator[MockCluster]:
    with MockCluster(brokers=3) as cluster:
        yield cluster


def test_producer_on_three_brokers_with_replication_factor_three(
    mock: MockCluster, tmp_path: Path
) -> None:
    """20k records through LogProducer to a topic whose partitions have 3 replicas and
    leaders on different brokers: every record arrives once, in order per partition."""
    topic = mock.create_topic(f"p-{uuid.uuid4().hex[:8]}", partitions=6)
    with LogProducer(mock.bootstrap_servers, topic, tmp_path) as p:
        for i in range(20_000):
            p.send(b"%d" % i, key=b"%d" % (i % 16))
        assert p.flush(60) == 0
        md = _metadata(mock.bootstrap_servers, topic)
    assert {len(part.replicas) for part in md.partitions.values()} == {3}
    assert len({part.leader for part in md.partitions.values()}) > 1
    rep = check_delivery(read_topic(mock.bootstrap_servers, topic))
    assert rep.missing(p.producer_id, range(20_000)) == []
    assert rep.unique == 20_000
    assert rep.order_violations == 0


def test_producer_rides_out_one_broker_down_while_the_others_serve(
    mock: MockCluster, tmp_path: Path
) -> None:
    """20k records to a 6-partition RF-3 topic; broker 1 (leader of some partitions) goes
    down for 3 s in the middle of the run and comes back: every record arrives, and a
    reader deduping by (producer, seq) keeps exactly 20k."""
    topic = mock.create_topic(f"d-{uuid.uuid4().hex[:8]}", partitions=6)
    with LogProducer(mock.bootstrap_servers, topic, tmp_path, stall_timeout_s=2.0) as p:
        for i in range(10_000):
            p.send(b"%d" % i, key=b"%d" % (i % 16))
        mock.broker_down(1)
        try:
            t_end = time.monotonic() + 3.0
            i = 10_000
            while i < 20_000:
                p.send(b"%d" % i, key=b"%d" % (i % 16))
                i += 1
                if i % 1000 == 0 and time.monotonic() < t_end:
                    time.sleep(0.3)
            time.sleep(max(0.0, t_end - time.monotonic()))
        finally:
            mock.broker_up(1)
        assert p.flush(90) == 0
    rep = check_delivery(read_topic(mock.bootstrap_servers, topic))
    assert rep.missing(p.producer_id, range(20_000)) == []
    assert rep.unique == 20_000


def _metadata(bootstrap: str, topic: str) -> Any:
    """``topic``'s metadata, as a client of its own reads it."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(rdkafka_config({"bootstrap.servers": bootstrap}))
    return admin.list_topics(topic, timeout=10).topics[topic]
