"""logsdk's sinks and log helpers on Spark's own Kafka source (``format("kafka")``).

Spark's JVM connector (spark-sql-kafka-0-10, from the jar cache) on Apache Kafka: its
rows are logsdk-kafka's, logsdk-sink and ForeachBatchSink store each of its offsets once
(a query SIGKILLed mid-stream included), and parse_logs, parse_otlp and dedupe read its
DataFrame. On the embedded broker (Tansu 0.6.0) Spark's source reads only up to the
too-low LATEST answer (docs/engineering/broker-quirks.md), so these tests run on
Apache Kafka.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from logsdk.integrations.logging import record_to_dict
from logsdk.sinks import SQLiteSink
from logsdk.testing.pytest_plugin import KafkaTarget
from spark_sink import ForeachBatchSink, set_active
from spark_sink.logs import dedupe, parse_logs, parse_otlp
from tests.consumer_helpers import produce
from tests.spark.helpers import QUERY_TIMEOUT, assert_exactly, next_batch, stored_rows, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.apache_kafka]

CHILD = Path(__file__).with_name("spark_child.py")


def spark_source(spark: Any, kafka: KafkaTarget, topic: str, **options: str) -> Any:
    """``spark.readStream.format("kafka")`` from the earliest offset, headers included."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def new_topic(kafka: KafkaTarget, partitions: int) -> str:
    return kafka.create_topic(f"spark-source-{uuid.uuid4().hex[:10]}", partitions)


def run_available_now(writer: Any, checkpoint: Path) -> Any:
    """Start ``writer`` (a DataStreamWriter) with availableNow; returns the finished query."""
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(QUERY_TIMEOUT), "query did not finish in time"
    finally:
        query.stop()
    return query


def to_sink(spark: Any, df: Any, checkpoint: Path, db: Path, sink_id: str) -> Any:
    set_active(spark)
    writer = df.writeStream.format("logsdk-sink").option("sqlite.path", str(db))
    return run_available_now(writer.option("sinkId", sink_id), checkpoint)


def test_spark_source_rows_are_the_rows_of_logsdk_kafka(
    spark: Any, apache_kafka: KafkaTarget
) -> None:
    """The same topic read by both sources: one schema, and the same rows (keys, values,
    offsets, timestamps, headers), so a sink cannot tell them apart."""
    topic = new_topic(apache_kafka, 2)
    produce(
        apache_kafka.client_config("producer"),
        topic,
        600,
        partitions=2,
        key=lambda i: None if i % 3 else b"k%d" % i,
    )

    def batch(fmt: str) -> Any:
        return (
            spark.read.format(fmt)
            .option("kafka.bootstrap.servers", apache_kafka.bootstrap_servers)
            .option("subscribe", topic)
            .option("includeHeaders", "true")
            .load()
        )

    ours, theirs = batch("logsdk-kafka"), batch("kafka")
    assert ours.schema == theirs.schema
    assert ours.orderBy("partition", "offset").collect() == (
        theirs.orderBy("partition", "offset").collect()
    )
    assert ours.count() == 600


def test_logsdk_sink_on_spark_source_survives_a_killed_query(
    spark: Any, apache_kafka: KafkaTarget, tmp_path: Path
) -> None:
    """Spark's source -> logsdk-sink in a child query SIGKILLed after 3 batches, rerun
    here from its checkpoint, then 6,000 more records and a run again: every Kafka
    offset stored once, with its producer headers."""
    topic = new_topic(apache_kafka, 2)
    conf = apache_kafka.client_config("producer")
    produce(conf, topic, 20_000, partitions=2)
    db, ckpt = tmp_path / "sink.db", tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    args = [apache_kafka.bootstrap_servers, topic, str(ckpt), str(db), "kafka"]
    child = subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        env=env,
        start_new_session=True,  # its own process group: the JVM and workers die with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: next_batch(db, "killed") >= 3 or child.poll() is not None,
            QUERY_TIMEOUT,
            "the child query to apply 3 batches",
        )
        assert child.poll() is None, child.stderr.read().decode()[-3000:] if child.stderr else ""
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
        if child.stderr:
            child.stderr.close()
    applied = len(stored_rows(db))
    assert 0 < applied < 20_000, f"kill was not mid-stream: {applied} rows applied"

    df = spark_source(spark, apache_kafka, topic, maxOffsetsPerTrigger="1500")
    to_sink(spark, df, ckpt, db, "killed")
    assert_exactly(stored_rows(db), {(topic, 0): 10_000, (topic, 1): 10_000})
    produce(conf, topic, 6000, partitions=2, start_seq=20_000)
    to_sink(spark, df, ckpt, db, "killed")
    assert_exactly(stored_rows(db), {(topic, 0): 13_000, (topic, 1): 13_000})
    seqs = sorted(int(s) for (s,) in _query(db, "SELECT seq FROM records"))
    assert seqs == list(range(26_000))  # the logsdk.seq header of each, from Spark's rows


def _query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_foreach_batch_sink_on_spark_source_applies_each_offset_once(
    spark: Any, apache_kafka: KafkaTarget, tmp_path: Path
) -> None:
    """Spark's source -> foreachBatch(ForeachBatchSink) in two availableNow runs: each
    offset once, the batch ids stored in order."""
    topic = new_topic(apache_kafka, 2)
    conf = apache_kafka.client_config("producer")
    produce(conf, topic, 3000, partitions=2)
    db, ckpt = tmp_path / "sink.db", tmp_path / "ckpt"
    df = spark_source(spark, apache_kafka, topic, maxOffsetsPerTrigger="1000")
    handler = SQLiteSink(db)
    writer = df.writeStream.foreachBatch(ForeachBatchSink(handler, sink_id="fb"))
    run_available_now(writer, ckpt)
    produce(conf, topic, 1000, partitions=2, start_seq=3000)
    run_available_now(df.writeStream.foreachBatch(ForeachBatchSink(handler, sink_id="fb")), ckpt)
    assert_exactly(stored_rows(db), {(topic, 0): 2000, (topic, 1): 2000})
    assert next_batch(db, "fb") == 4  # 1000 x 3, then 1000


def log_value(i: int) -> bytes:
    record = logging.LogRecord("app", logging.WARNING, __file__, 1, "event %d", (i,), None)
    return json.dumps(record_to_dict(record, "host-1", {}), default=str).encode()


def test_parse_logs_and_dedupe_on_spark_source_drop_a_producers_resends(
    spark: Any, apache_kafka: KafkaTarget, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """KafkaHandler's JSON, 500 records of which 100 sent twice (same producer and seq, as
    after a retry): parse_logs + dedupe on Spark's streaming source keep 500, typed. Read
    without includeHeaders, the rows carry no producer nor seq, and parse_logs says so."""
    topic = new_topic(apache_kafka, 2)
    conf = apache_kafka.client_config("producer")
    produce(conf, topic, 500, partitions=2, value=log_value)
    produce(conf, topic, 100, partitions=2, value=log_value, start_seq=200)  # resent
    df = dedupe(parse_logs(spark_source(spark, apache_kafka, topic)), watermark="1 hour")
    writer = df.writeStream.format("memory").queryName("spark_source_logs")
    run_available_now(writer, tmp_path / "ckpt")
    got = spark.sql(
        "SELECT count(*) AS n, count(DISTINCT seq) AS seqs, min(level) AS level, "
        "count(_corrupt) AS corrupt, min(producer) AS producer FROM spark_source_logs"
    ).collect()[0]
    assert (got.n, got.seqs, got.level, got.corrupt, got.producer) == (
        500,
        500,
        "WARNING",
        0,
        "test-producer",
    )

    bare = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", apache_kafka.bootstrap_servers)
        .option("subscribe", topic)
        .load()
    )
    with caplog.at_level(logging.WARNING, logger="spark_sink"):
        parsed = parse_logs(bare)
    assert "includeHeaders" in caplog.text
    assert parsed.where("producer IS NOT NULL").count() == 0
    assert dedupe(parsed).count() == 600  # nothing to tell a resend by


def test_parse_otlp_on_spark_source(spark: Any, apache_kafka: KafkaTarget, tmp_path: Path) -> None:
    """OTLP records (3 log records each) read by Spark's source: one row per log record,
    its fields decoded; the record sent twice is kept once by dedupe."""
    from tests.spark.test_logs import otlp_payloads

    payload, expected = otlp_payloads()
    topic = new_topic(apache_kafka, 1)
    conf = apache_kafka.client_config("producer")
    produce(conf, topic, 4, partitions=1, value=lambda _: payload)
    produce(conf, topic, 1, partitions=1, value=lambda _: payload, start_seq=3)  # resent
    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", apache_kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
    )
    parsed = parse_otlp(df)
    rows = parsed.where("offset = 0").orderBy("log_index").collect()
    assert [(r.body, r.severity_number) for r in rows] == expected
    assert rows[0].resource["service.name"] == "svc"
    assert len(rows[1].trace_id) == 32
    assert parsed.count() == 15
    kept = dedupe(parsed).select("seq", "log_index").collect()
    assert sorted((r.seq, r.log_index) for r in kept) == [
        (s, i) for s in range(4) for i in range(3)
    ]
