"""logsdk-kafka: batch reads, schema, bad input and data loss."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logsdk.testing.pytest_plugin import KafkaTarget
from spark_sink import set_active
from tests.consumer_helpers import produce
from tests.spark.helpers import QUERY_TIMEOUT

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def reader(spark: Any, kafka: KafkaTarget, **options: str) -> Any:
    r = spark.read.format("logsdk-kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def stream_to_memory(df: Any, name: str, checkpoint: Path) -> Any:
    """Run ``df`` with availableNow into a memory table ``name``; returns the finished query."""
    set_active(df.sparkSession)
    query = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(QUERY_TIMEOUT)
    finally:
        query.stop()
    return query


@pytest.mark.embedded_and_apache
def test_batch_read_has_spark_kafka_columns_and_every_record(
    spark: Any, kafka: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """spark.read: all records, Spark's Kafka schema, headers kept; minPartitions splits ranges."""
    topic = fresh_topic(2)
    produce(kafka.client_config("producer"), topic, 1000, partitions=2)
    df = reader(spark, kafka, subscribe=topic, minPartitions="6").load()
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert df.rdd.getNumPartitions() >= 6
    rows = df.collect()
    assert sorted((r.partition, r.offset) for r in rows) == sorted(
        (p, o) for p in range(2) for o in range(500)
    )
    first = min(rows, key=lambda r: (r.partition, r.offset))
    assert first.topic == topic
    assert first.timestampType == 0
    assert first.timestamp is not None
    assert [(h.key, bytes(h.value)) for h in first.headers] == [
        ("logsdk.producer", b"test-producer"),
        ("logsdk.seq", b"0"),
    ]
    # endingOffsets JSON bounds the read.
    part = reader(
        spark, kafka, subscribe=topic, endingOffsets=f'{{"{topic}": {{"0": 10, "1": -1}}}}'
    ).load()
    assert part.count() == 510
    # A partition left out of the JSON is an error, as in Spark's Kafka source (it was
    # read as "earliest": nothing of it, silently).
    with pytest.raises(Exception, match=r"endingOffsets must give an offset .* leaves out"):
        reader(
            spark, kafka, subscribe=topic, endingOffsets=f'{{"{topic}": {{"0": 10}}}}'
        ).load().count()


def test_unknown_option_and_bad_offsets_json_fail_at_load(
    spark: Any, kafka_broker: KafkaTarget
) -> None:
    """A bad option fails load() with an error naming it (no broker round trip needed)."""
    with pytest.raises(Exception, match="unknown option 'subscrib'"):
        reader(spark, kafka_broker, subscrib="x").load()
    with pytest.raises(Exception, match="option startingOffsets is neither"):
        spark.readStream.format("logsdk-kafka").option(
            "kafka.bootstrap.servers", kafka_broker.bootstrap_servers
        ).option("subscribe", "x").option("startingOffsets", "{oops").load()


def test_missing_topic_is_a_clear_error(
    spark: Any, kafka_broker: KafkaTarget, tmp_path: Path
) -> None:
    """Subscribing to a topic that does not exist fails the query, naming the topic."""
    df = reader(spark, kafka_broker, subscribe="no-such-topic-here").load()
    with pytest.raises(Exception, match=r"\['no-such-topic-here'\] named in option subscribe"):
        df.count()
    stream = (
        spark.readStream.format("logsdk-kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("subscribe", "no-such-topic-here")
        .load()
    )
    with pytest.raises(Exception, match="no-such-topic-here"):
        stream_to_memory(stream, "missing_topic", tmp_path / "ckpt")


@pytest.mark.embedded_and_apache
def test_offsets_out_of_range_fail_or_skip_with_failondataloss(
    spark: Any, kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """startingOffsets past the end: DataLossError naming partition and offsets; or skipped."""
    topic = fresh_topic(2)
    produce(kafka.client_config("producer"), topic, 200, partitions=2)
    starting = f'{{"{topic}": {{"0": 5000, "1": 0}}}}'

    def stream(**extra: str) -> Any:
        r = (
            spark.readStream.format("logsdk-kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("subscribe", topic)
            .option("startingOffsets", starting)
        )
        for k, v in extra.items():
            r = r.option(k, v)
        return r.load()

    with pytest.raises(
        Exception, match=rf"DataLossError: {topic}\[0\]: offset 5000 is past the end 100"
    ):
        stream_to_memory(stream(), "loss_fail", tmp_path / "fail")
    stream_to_memory(stream(failOnDataLoss="false"), "loss_skip", tmp_path / "skip")
    got = spark.sql("SELECT partition, count(*) AS n FROM loss_skip GROUP BY partition").collect()
    assert {(r.partition, r.n) for r in got} == {(1, 100)}
