"""Count log records per level per minute with Spark, exactly-once into SQLite.

    python examples/spark_log_counts.py [--records 3000] [--db counts.db]

Starts the embedded broker, ships log records through ``logging`` +
``KafkaHandler`` (a LogProducer), then runs a Structured Streaming query on
``local[2]``: ``logsdk-kafka`` -> ``spark_sink.logs.parse_logs`` -> ``dedupe`` ->
per-batch counts per (minute, level) -> :class:`spark_sink.ForeachBatchSink` with
``LevelCounts``, a TransactionalHandler that adds the counts and records the batch
id in one SQLite transaction. Adding counts is only right if each batch is applied
exactly once: a batch Spark replays after a crash is skipped by its batch id. The
query runs twice (availableNow) with more records in between, as a daily job would.
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from logsdk import Record
from logsdk.consumer import TopicPartition
from logsdk.errors import FencedError
from logsdk.integrations.logging import KafkaHandler
from logsdk.testing import EmbeddedBroker, create_topic
from spark_sink import ForeachBatchSink, local_session, set_active
from spark_sink.logs import dedupe, parse_logs

LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)


class LevelCounts:
    """A TransactionalHandler: ``counts(minute, level, n)`` plus offsets, one transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.staged: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS counts (minute TEXT, level TEXT, n INTEGER, "
            "PRIMARY KEY (minute, level))"
        )
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS offsets (topic TEXT, partition INTEGER, "
            "next_offset INTEGER, PRIMARY KEY (topic, partition))"
        )

    def process(self, records: Sequence[Record]) -> None:
        for r in records:
            row = json.loads(r.value or b"{}")
            self.staged.append((row["minute"], row["level"] or "?", int(row["count"])))

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        staged, self.staged = self.staged, []
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for (topic, partition), nxt in offsets.items():
                    got = self.conn.execute(
                        "SELECT next_offset FROM offsets WHERE topic = ? AND partition = ?",
                        (topic, partition),
                    ).fetchone()
                    if got is not None and nxt <= got[0]:
                        raise FencedError(f"{topic} already at {got[0]}")
                    self.conn.execute(
                        "INSERT OR REPLACE INTO offsets VALUES (?, ?, ?)", (topic, partition, nxt)
                    )
                self.conn.executemany(
                    "INSERT INTO counts VALUES (?, ?, ?) ON CONFLICT (minute, level) "
                    "DO UPDATE SET n = n + excluded.n",
                    staged,
                )
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def rollback(self, error: BaseException) -> None:
        self.staged = []

    def stored_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        out = {}
        for topic, partition in partitions:
            got = self.conn.execute(
                "SELECT next_offset FROM offsets WHERE topic = ? AND partition = ?",
                (topic, partition),
            ).fetchone()
            if got is not None:
                out[(topic, partition)] = int(got[0])
        return out


def per_minute_counts(batch: DataFrame) -> DataFrame:
    """One batch's counts per (minute, level); corrupt records count as level '_corrupt'."""
    return (
        batch.withColumn(
            "level", F.coalesce("level", F.when(F.col("_corrupt").isNotNull(), "_corrupt"))
        )
        .groupBy(
            F.date_format(F.date_trunc("minute", "ts"), "yyyy-MM-dd HH:mm").alias("minute"), "level"
        )
        .count()
    )


def ship_logs(bootstrap: str, topic: str, n: int, spool: Path) -> None:
    handler = KafkaHandler(bootstrap_servers=bootstrap, topic=topic, spool_dir=spool)
    log = logging.getLogger("shop.checkout")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    try:
        for i in range(n):
            log.log(LEVELS[i % len(LEVELS)], "order %d", i, extra={"order": i})
        handler.flush()
    finally:
        log.removeHandler(handler)
        handler.close()
    if handler.dropped:
        raise RuntimeError(f"{handler.dropped} log records dropped")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3000, help="records per run (2 runs)")
    parser.add_argument("--db", type=Path, default=None, help="SQLite file (default: temp)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spark-log-counts-"))
    db = args.db or work / "counts.db"
    t0 = time.monotonic()
    with EmbeddedBroker() as broker:
        topic = create_topic(broker.bootstrap_servers, "app-logs", 2)
        spark = local_session("spark-log-counts", master="local[2,2]")
        try:
            logs = (
                spark.readStream.format("logsdk-kafka")
                .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                .option("subscribe", topic)
                .option("startingOffsets", "earliest")
                .load()
            )
            records = dedupe(parse_logs(logs), watermark="10 minutes")
            sink = ForeachBatchSink(
                LevelCounts(db), sink_id="level-counts", transform=per_minute_counts
            )
            for run in (1, 2):
                ship_logs(broker.bootstrap_servers, topic, args.records, work / f"spool{run}")
                set_active(spark)
                query = (
                    records.writeStream.foreachBatch(sink)
                    .option("checkpointLocation", str(work / "checkpoint"))
                    .trigger(availableNow=True)
                    .start()
                )
                if not query.awaitTermination(300):
                    query.stop()
                    raise RuntimeError("the query did not finish within 300 s")
                print(f"run {run}: {args.records} records shipped, query done")
        finally:
            spark.stop()
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT minute, level, n FROM counts ORDER BY minute, level").fetchall()
    conn.close()
    for minute, level, n in rows:
        print(f"{minute}  {level:<9} {n}")
    total = sum(n for _, _, n in rows)
    print(f"total={total} expected={2 * args.records} in {time.monotonic() - t0:.1f}s")
    return 0 if total == 2 * args.records else 1


if __name__ == "__main__":
    sys.exit(main())
