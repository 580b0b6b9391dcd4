"""The consumer's out-of-order progress kept in offset commit metadata, on the brokers that
keep it: librdkafka's mock cluster and Apache Kafka (Tansu drops commit metadata).

Apache Kafka caps the metadata at ``offset.metadata.max.bytes`` (4096 by default) and
refuses a commit whose text is longer with OFFSET_METADATA_TOO_LARGE: the consumer keeps
its text under 4096, and under a lower cap set on the cluster it learns the cap and
commits what fits (the low mark always).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from logsdk import LogConsumer, Record
from logsdk.consumer._offsets import encode_completed
from logsdk.testing import ApacheKafka, create_topic
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import kafka_producer, rdkafka_config, wait_until

pytestmark = [pytest.mark.integration]


def _fill(config: dict[str, Any], topic: str, n: int) -> None:
    with kafka_producer({**config, "enable.idempotence": True}) as prod:
        for i in range(n):
            prod.produce(topic, b"%d" % i, partition=0)
        assert prod.flush(30) == 0


def _hold_ten(done: list[int], release: threading.Event) -> Callable[[Record], None]:
    def handler(rec: Record) -> None:
        if rec.offset == 10:
            release.wait(60)
        done.append(rec.offset)

    return handler


#: One record at a time on 4 workers, committing every 0.2 s; the group's timings are
#: the cluster's (client_config).
_KW: dict[str, Any] = {"ordering": "none", "workers": 4, "max_batch": 1, "commit_interval": 0.2}


@pytest.mark.parametrize(
    "kafka",
    [
        pytest.param("mock", marks=pytest.mark.mock_cluster),
        pytest.param("apache", marks=pytest.mark.apache_kafka),
    ],
    indirect=True,
)
def test_out_of_order_progress_survives_a_restart_through_commit_metadata(
    kafka: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """One partition of 200 records; the handler holds offset 10 while every other record
    completes, out of order, and is committed (the low mark stays at 10, the rest in the
    commit's metadata). The consumer is stopped with 10 still held. A new consumer of the
    group then processes offset 10 only: nothing completed is processed again. Were the
    metadata dropped (as Tansu does), it would process 10..199 again."""
    topic = fresh_topic(1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _fill(kafka.client_config("producer"), topic, 200)
    release = threading.Event()
    done: list[int] = []
    config = kafka.client_config("consumer")
    servers = str(config.pop("bootstrap.servers"))
    kw = {**_KW, "kafka_config": config}
    first = LogConsumer(servers, group, [topic], _hold_ten(done, release), **kw).start()
    again: list[int] = []
    try:
        wait_until(lambda: len(done) == 199, 60, "every record but offset 10 processed")
        # stop() commits what is done; offset 10, still held, is abandoned. It stays held
        # until the end: done later, the old member would commit it after all.
        first.stop(timeout=1)
        assert 10 not in done
        second = LogConsumer(servers, group, [topic], lambda r: again.append(r.offset), **kw)
        second.start()
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


@pytest.mark.apache_kafka
def test_apache_kafka_takes_commit_metadata_under_4096_bytes(
    apache_kafka: KafkaTarget, make_kafka_consumer: Callable[..., Any]
) -> None:
    """Apache Kafka (``offset.metadata.max.bytes=4096``, its default) keeps 4095 bytes of
    commit metadata as written and refuses 4096 with OFFSET_METADATA_TOO_LARGE: the
    setting is a bound the text must stay under, the one the consumer's codec keeps to."""
    topic = apache_kafka.create_topic(f"cap-{uuid.uuid4().hex[:8]}", 1)
    c = make_kafka_consumer(
        {**apache_kafka.client_config("consumer"), "group.id": f"g-{uuid.uuid4().hex[:8]}"}
    )
    c.commit(offsets=[TopicPartition(topic, 0, 1, metadata="m" * 4095)], asynchronous=False)
    got = c.committed([TopicPartition(topic, 0)], 10)[0]
    assert (got.offset, got.metadata) == (1, "m" * 4095)
    with pytest.raises(KafkaException) as refused:
        c.commit(offsets=[TopicPartition(topic, 0, 2, metadata="m" * 4096)], asynchronous=False)
    assert refused.value.args[0].code() == KafkaError.OFFSET_METADATA_TOO_LARGE


def _ranges(seed: int, count: int) -> list[tuple[int, int]]:
    """``count`` sorted, disjoint ranges above 100 with random gaps and lengths (what a
    consumer's out-of-order progress looks like; random, so zlib cannot shrink it)."""
    rng = random.Random(seed)
    out, at = [], 100
    for _ in range(count):
        at += rng.randint(1, 300)
        end = at + rng.randint(1, 300)
        out.append((at, end))
        at = end
    return out


@pytest.mark.apache_kafka
def test_the_longest_metadata_the_codec_writes_is_taken_by_apache_kafka(
    apache_kafka: KafkaTarget, make_kafka_consumer: Callable[..., Any]
) -> None:
    """Progress too large for the cap (seed 2: its longest prefix under 4096 bytes
    encodes to exactly 4096 when the cap is counted inclusively): the text the codec keeps
    by default is committed by Apache Kafka and read back as written."""
    text, kept = encode_completed(50, _ranges(2, 3000))
    assert 0 < kept < 3000
    topic = apache_kafka.create_topic(f"cap-{uuid.uuid4().hex[:8]}", 1)
    c = make_kafka_consumer(
        {**apache_kafka.client_config("consumer"), "group.id": f"g-{uuid.uuid4().hex[:8]}"}
    )
    c.commit(offsets=[TopicPartition(topic, 0, 50, metadata=text)], asynchronous=False)
    assert c.committed([TopicPartition(topic, 0)], 10)[0].metadata == text


@pytest.mark.apache_kafka
def test_a_lower_metadata_cap_on_the_cluster_never_holds_the_low_mark_back(
    apache_cluster_factory: Callable[..., ApacheKafka], caplog: pytest.LogCaptureFixture
) -> None:
    """A cluster whose ``offset.metadata.max.bytes`` is 10: the consumer's first commit
    with out-of-order progress is refused; it learns the cap, commits the low mark without
    the text, says so once, and counts no commit error. A new consumer then starts at the
    low mark (what was done past it is processed again: at-least-once, nothing lost)."""
    cluster = apache_cluster_factory(1, properties={"offset.metadata.max.bytes": 10})
    topic = create_topic(cluster.bootstrap_servers, f"low-{uuid.uuid4().hex[:8]}", 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _fill(cluster.client_config("producer"), topic, 200)
    release = threading.Event()
    done: list[int] = []
    config = cluster.client_config("consumer")
    servers = str(config.pop("bootstrap.servers"))
    kw = {**_KW, "kafka_config": config}
    caplog.set_level(logging.WARNING, logger="logsdk.consumer")
    first = LogConsumer(servers, group, [topic], _hold_ten(done, release), **kw).start()
    again: list[int] = []
    try:
        wait_until(lambda: len(done) == 199, 60, "every record but offset 10 processed")
        wait_until(lambda: _committed(servers, topic, group) == 10, 30, "the low mark committed")
        stats = first.stats()
        warned = [r.getMessage() for r in caplog.records if "metadata.max.bytes" in r.getMessage()]
        first.stop(timeout=1)
        second = LogConsumer(servers, group, [topic], lambda r: again.append(r.offset), **kw)
        second.start()
        try:
            wait_until(lambda: len(again) >= 190, 60, "10..199 processed by the new consumer")
        finally:
            second.stop()
    finally:
        release.set()
        first.stop()
    assert stats["commit_errors"] == 0
    assert stats["metadata_truncated"] > 0
    assert sorted(again) == list(range(10, 200))
    assert len(warned) == 1, warned


def _committed(servers: str, topic: str, group: str) -> int | None:
    from confluent_kafka import Consumer

    c = Consumer(rdkafka_config({"bootstrap.servers": servers, "group.id": group}))
    try:
        got = c.committed([TopicPartition(topic, 0)], 10)[0]
    finally:
        c.close()
    return got.offset if got.offset >= 0 else None
