"""The second Kafka implementation, librdkafka's mock cluster: 3 brokers, commit metadata
kept. It shows what Tansu cannot: the consumer's out-of-order progress kept in commit
metadata, end to end, and the producer on a replication-factor-3 topic."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from logsdk import LogConsumer, LogProducer, Record
from logsdk.testing import MockCluster, check_delivery, read_topic
from tests.conftest import kafka_producer, rdkafka_config, wait_until

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


def _fill(bootstrap: str, topic: str, n: int) -> None:
    with kafka_producer({"bootstrap.servers": bootstrap, "enable.idempotence": True}) as prod:
        for i in range(n):
            prod.produce(topic, b"%d" % i, partition=0)
        assert prod.flush(30) == 0


def test_out_of_order_progress_survives_a_restart_through_commit_metadata(
    mock: MockCluster,
) -> None:
    """One partition of 200 records; the handler holds offset 10 while every other record
    completes, out of order, and is committed (the low mark stays at 10, the rest in the
    commit's metadata). The consumer is stopped with 10 still held. A new consumer of the
    group then processes offset 10 only: nothing completed is processed again. Were the
    metadata dropped (as Tansu does), it would process 10..199 again."""
    topic = f"c-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    _fill(mock.bootstrap_servers, topic, 200)
    release = threading.Event()
    done: list[int] = []

    def hold_ten(rec: Record) -> None:
        if rec.offset == 10:
            release.wait(60)
        done.append(rec.offset)

    kw: dict[str, Any] = {
        "ordering": "none",
        "workers": 4,
        "max_batch": 1,
        "commit_interval": 0.2,
        # The first consumer leaves with offset 10's handler still running: its member is
        # evicted after the session timeout (librdkafka's default is 45 s).
        "kafka_config": {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    }
    first = LogConsumer(mock.bootstrap_servers, group, [topic], hold_ten, **kw).start()
    again: list[int] = []
    try:
        wait_until(lambda: len(done) == 199, 60, "every record but offset 10 processed")
        # stop() commits what is done; offset 10, still held, is abandoned. It stays held
        # until the end: done later, the old member would commit it after all.
        first.stop(timeout=1)
        assert 10 not in done
        second = LogConsumer(mock.bootstrap_servers, group, [topic],
                             lambda r: again.append(r.offset), **kw).start()  # fmt: skip
        try:
            wait_until(lambda: 10 in again, 60, "offset 10 processed by the new consumer")
            time.sleep(1.0)  # any record wrongly redelivered would come right behind it
            skipped = second.stats()["skipped"]
        finally:
            second.stop()
    finally:
        release.set()
        first.stop()
    assert again == [10], again[:20]
    assert skipped == 189  # 11..199 fetched again and skipped as done (the metadata)


def _metadata(bootstrap: str, topic: str) -> Any:
    """``topic``'s metadata, as a client of its own reads it."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(rdkafka_config({"bootstrap.servers": bootstrap}))
    return admin.list_topics(topic, timeout=10).topics[topic]
