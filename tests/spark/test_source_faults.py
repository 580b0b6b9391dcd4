"""logsdk-kafka's driver side against broker faults: metadata errors, deleted and re-created topics.

These call the stream reader the way Spark's driver does (initialOffset, latestOffset,
partitions) against a real broker, without a SparkSession: each is a fresh reader, as
after a query restart, so no answer is reused from an earlier call.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql.streaming.datasource import ReadAllAvailable

from logsdk.errors import DataLossError, SourceUnavailableError, SparkSourceError
from logsdk.testing import EmbeddedBroker, create_topic, delete_topic
from logsdk.testing.pytest_plugin import KafkaTarget
from spark_sink._options import parse_source_options
from spark_sink._source import KafkaStreamReader
from tests.consumer_helpers import produce

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def stream_reader(bootstrap: str, **options: str) -> KafkaStreamReader:
    """A new stream reader, as Spark's driver makes one for a (re)started query."""
    return KafkaStreamReader(
        parse_source_options({"kafka.bootstrap.servers": bootstrap, **options})
    )


def latest(reader: KafkaStreamReader, start: dict[str, Any]) -> dict[str, Any]:
    try:
        return reader.latestOffset(start, ReadAllAvailable())
    finally:
        reader.stop()


@pytest.mark.fault
@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_transient_topic_metadata_error_is_retried_not_taken_for_deletion(
    broker_factory: Callable[..., EmbeddedBroker], fail_on_data_loss: str
) -> None:
    """The topic listed with LEADER_NOT_AVAILABLE twice: latestOffset asks again and
    returns each partition's end; no DataLossError, no partition dropped."""
    broker = broker_factory(proxy=True)
    prefix = f"meta-{uuid.uuid4().hex[:8]}"
    topic = create_topic(broker.bootstrap_servers, f"{prefix}-a", 2)
    produce(broker.client_config("producer"), topic, 100, partitions=2)
    options = {
        "subscribePattern": f"{prefix}-.*",
        "startingOffsets": "earliest",
        "failOnDataLoss": fail_on_data_loss,
    }
    start = stream_reader(broker.bootstrap_servers, **options).initialOffset()
    assert start == {topic: {"0": 0, "1": 0}}

    broker.fail_metadata(2, topics=[topic])
    end = latest(stream_reader(broker.bootstrap_servers, **options), start)
    assert end == {topic: {"0": 50, "1": 50}}
    assert broker.metadata_faults_done == 2  # both errors were seen by the reader


@pytest.mark.fault
def test_metadata_error_outlasting_the_retries_is_reported_as_transient(
    broker_factory: Callable[..., EmbeddedBroker],
) -> None:
    """More errors than fetchOffset.numRetries allows: SourceUnavailableError (retriable)
    naming the topic and its error, not DataLossError; the next reader reads on."""
    broker = broker_factory(proxy=True)
    prefix = f"meta-{uuid.uuid4().hex[:8]}"
    topic = create_topic(broker.bootstrap_servers, f"{prefix}-a", 1)
    produce(broker.client_config("producer"), topic, 10, partitions=1)
    options = {
        "subscribePattern": f"{prefix}-.*",
        "startingOffsets": "earliest",
        "fetchOffset.numRetries": "1",
        "fetchOffset.retryIntervalMs": "10",
    }
    start = stream_reader(broker.bootstrap_servers, **options).initialOffset()
    broker.fail_metadata(1000, topics=[topic])  # until disarmed
    with pytest.raises(SourceUnavailableError, match=rf"{topic}: .*Leader not available") as info:
        latest(stream_reader(broker.bootstrap_servers, **options), start)
    assert info.value.retriable
    assert "asked 2 times" in str(info.value)
    # librdkafka may send one list_topics() twice on a fresh client (bootstrap connection,
    # then the broker's own): at least the two asks saw the error.
    assert broker.metadata_faults_done >= 2
    broker.fail_metadata(0)
    assert latest(stream_reader(broker.bootstrap_servers, **options), start) == {topic: {"0": 10}}


def test_deleted_topic_is_still_data_loss(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """A topic really gone from the listing: DataLossError naming it (failOnDataLoss=true)."""
    topic = fresh_topic(1)
    produce(kafka_broker.client_config("producer"), topic, 10, partitions=1)
    options = {"subscribePattern": f"{topic}|{topic}-never", "startingOffsets": "earliest"}
    start = stream_reader(kafka_broker.bootstrap_servers, **options).initialOffset()
    delete_topic(kafka_broker.bootstrap_servers, topic)
    with pytest.raises(DataLossError, match=rf"{topic}\[0\] is gone"):
        latest(stream_reader(kafka_broker.bootstrap_servers, **options), start)


def test_recreated_topic_with_failondataloss_is_data_loss_naming_it(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """A checkpointed offset past the end of a re-created topic: DataLossError naming the
    partition and the offsets; with failOnDataLoss=false the batch reads from earliest."""
    topic = fresh_topic(1)
    bootstrap = kafka_broker.bootstrap_servers
    produce(kafka_broker.client_config("producer"), topic, 30, partitions=1)
    options = {"subscribe": topic, "startingOffsets": "earliest"}
    start = latest(stream_reader(bootstrap, **options), {topic: {"0": 0}})
    assert start == {topic: {"0": 30}}
    delete_topic(bootstrap, topic)
    kafka_broker.create_topic(topic, 1)
    produce(kafka_broker.client_config("producer"), topic, 10, partitions=1, start_seq=100)
    with pytest.raises(DataLossError, match=rf"{topic}\[0\]: offset 30 is past the end 10"):
        latest(stream_reader(bootstrap, **options), start)

    reader = stream_reader(bootstrap, **options, failOnDataLoss="false")
    try:
        end = reader.latestOffset(start, ReadAllAvailable())
        ranges = [p.range for p in reader.partitions(start, end)]
    finally:
        reader.stop()
    assert end == {topic: {"0": 10}}
    assert [(r.topic, r.partition, r.start, r.end) for r in ranges] == [(topic, 0, 0, 10)]


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_topic_named_in_subscribe_and_deleted_is_data_loss(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], fail_on_data_loss: str
) -> None:
    """A topic named in option subscribe, read, then deleted: data loss like a topic of a
    pattern (DataLossError naming the partition, or dropped with a warning), not the
    "create them first" error of a query started on a topic that does not exist."""
    topic, other = fresh_topic(1), fresh_topic(1)
    produce(kafka_broker.client_config("producer"), topic, 10, partitions=1)
    options = {
        "subscribe": f"{topic},{other}",
        "startingOffsets": "earliest",
        "failOnDataLoss": fail_on_data_loss,
    }
    start = latest(stream_reader(kafka_broker.bootstrap_servers, **options), {})
    assert start == {topic: {"0": 10}, other: {"0": 0}}
    delete_topic(kafka_broker.bootstrap_servers, topic)
    if fail_on_data_loss == "true":
        with pytest.raises(DataLossError, match=rf"{topic}\[0\] is gone"):
            latest(stream_reader(kafka_broker.bootstrap_servers, **options), start)
    else:
        end = latest(stream_reader(kafka_broker.bootstrap_servers, **options), start)
        assert end == {other: {"0": 0}}
    with pytest.raises(SparkSourceError, match="create them first"):
        stream_reader(kafka_broker.bootstrap_servers, **options).initialOffset()
