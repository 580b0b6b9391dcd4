"""ForeachBatchSink and the example: a batch id is applied once, replays are skipped."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logsdk.errors import SinkError, SparkSourceError
from logsdk.sinks import SQLiteSink
from logsdk.testing.pytest_plugin import KafkaTarget
from spark_sink import ForeachBatchSink, next_batch_id
from tests.consumer_helpers import produce
from tests.spark.helpers import assert_exactly, stored_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


def test_foreach_batch_applies_each_batch_id_once(
    spark: Any, kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The same batch id twice (Spark's replay after a crash) is stored once, as Kafka rows."""
    topic = fresh_topic(2)
    produce(kafka_broker.client_config("producer"), topic, 400, partitions=2)
    df = (
        spark.read.format("logsdk-kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("subscribe", topic)
        .load()
    )
    sink_db = tmp_path / "sink.db"
    handler = SQLiteSink(sink_db, dedupe=True)
    sink = ForeachBatchSink(handler, sink_id="fb")
    sink(df.where("offset < 100"), 0)
    sink(df.where("offset < 100"), 0)  # replayed: skipped by its batch id
    sink(df.where("offset >= 100"), 1)
    assert next_batch_id(handler, "fb") == 2
    assert_exactly(stored_rows(sink_db), {(topic, 0): 200, (topic, 1): 200})
    # Batch 0 again, after batch 1: not a replay (Spark reruns only its last batch) but
    # another query reusing the sink id. Refused, not skipped: its rows would be lost.
    with pytest.raises(SinkError, match="older than the last one it applied"):
        sink(df.where("offset < 100"), 0)
    assert next_batch_id(handler, "fb") == 2
    with pytest.raises(SparkSourceError, match="sink_id"):
        ForeachBatchSink(handler, sink_id="bad id!")


@pytest.mark.slow
def test_spark_log_counts_example_counts_every_record_once(tmp_path: Path) -> None:
    """examples/spark_log_counts.py: two runs, counts per level per minute add up exactly."""
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "spark_log_counts.py"), "--records", "800"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "total=1600 expected=1600" in done.stdout
    assert " ERROR " in done.stdout
