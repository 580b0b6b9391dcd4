"""A Structured Streaming job for a Spark cluster: Kafka -> exactly-once sinks.

    spark-submit --master spark://HOST:7077 ... examples/spark_cluster_job.py \\
        --bootstrap BROKERS --topic TOPIC --checkpoint DIR [--sink sink] [--sink foreach] \\
        [--sink parquet] [--sink kafka:sink] [--db logs.db] [--staging s3://bucket/prefix] \\
        [--parquet DIR]

Reads ``TOPIC`` and writes it, one query per ``--sink [SOURCE:]SINK``. SOURCE is
``logsdk-kafka`` (the default: logsdk's Python source, read on the executors) or ``kafka``
(Spark's own JVM source, ``spark-sql-kafka-0-10`` on the classpath: ``--packages`` or
``--jars``; headers included). SINK is:

- ``sink``: ``logsdk-sink`` into ``SQLiteSink(--db)``; executors stage each task's rows
  under ``--staging`` (shared storage: ``s3://``, ``gs://``, ``hdfs://``), the driver
  applies each batch in one SQLite transaction;
- ``foreach``: ``foreachBatch(ForeachBatchSink(SQLiteSink(--db + ".foreach")))``, applied
  on the driver;
- ``parquet``: Spark's own file sink into ``--parquet``.

A query on Spark's source writes beside the same query on logsdk-kafka with ``.kafka``
added to its files' names (``--db``, ``--parquet``) and its sink id; its checkpoint is
``--checkpoint/kafka-<sink>``, the others' ``--checkpoint/<sink>``: shared storage on a
cluster (an ``s3a://`` URI with hadoop-aws on the classpath, HDFS, a shared mount).
Without ``--available-now`` the queries run until the job is stopped; with it they read
what is in the topic and the job exits. Running the same line again resumes every query
from its checkpoint: each record stored once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pyspark.sql import SparkSession

import spark_sink
from logsdk.sinks import SQLiteSink

SINKS = ("sink", "foreach", "parquet")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True, help="checkpoint root (shared storage)")
    parser.add_argument(
        "--sink",
        action="append",
        choices=[f"{src}{sink}" for src in ("", "logsdk-kafka:", "kafka:") for sink in SINKS],
        dest="sinks",
        metavar="[SOURCE:]SINK",
        help="SOURCE logsdk-kafka (default) or kafka (Spark's own); SINK sink, foreach, parquet",
    )
    parser.add_argument("--db", default="logs.db", help="SQLite file on the driver's host")
    parser.add_argument("--staging", help="logsdk-sink's stagingDir (shared storage URI)")
    parser.add_argument(
        "--staging-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a staging.NAME option of the staging filesystem (e.g. endpoint_override=URL)",
    )
    parser.add_argument("--parquet", help="output directory of the parquet sink")
    parser.add_argument("--max-offsets", type=int, default=20_000, help="records per batch")
    parser.add_argument("--available-now", action="store_true", help="stop when caught up")
    args = parser.parse_args(argv)
    queries_asked = [
        (src or "logsdk-kafka", sink)
        for src, _, sink in (q.rpartition(":") for q in args.sinks or ["sink"])
    ]
    if any(sink == "parquet" for _, sink in queries_asked) and not args.parquet:
        parser.error("--sink parquet needs --parquet DIR")

    spark = SparkSession.builder.appName("logsdk-cluster-job").getOrCreate()
    spark_sink.register(spark)
    sources = {}
    for source in {src for src, _ in queries_asked}:
        reader = (
            spark.readStream.format(source)
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("subscribe", args.topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(args.max_offsets))
            .option("includeHeaders", "true")  # logsdk-kafka's default; Spark's is false
        )
        sources[source] = reader.load()
    queries = []
    for source, sink in queries_asked:
        # Spark's source's queries: files ".kafka", checkpoint "kafka-", sink ids "-kafka".
        dot, dash, tail = (
            ("", "", "") if source == "logsdk-kafka" else (".kafka", "kafka-", "-kafka")
        )
        writer = sources[source].writeStream.option(
            "checkpointLocation", f"{args.checkpoint}/{dash}{sink}"
        )
        if sink == "sink":
            writer = (
                writer.format("logsdk-sink")
                .option("sqlite.path", args.db + dot)
                .option("sinkId", f"cluster-sink{tail}")
            )
            if args.staging:
                writer = writer.option("stagingDir", args.staging)
            for item in args.staging_option:
                name, _, value = item.partition("=")
                writer = writer.option(f"staging.{name}", value)
        elif sink == "foreach":
            handler = SQLiteSink(args.db + dot + ".foreach")
            writer = writer.foreachBatch(
                spark_sink.ForeachBatchSink(handler, sink_id=f"cluster-foreach{tail}")
            )
        else:
            writer = writer.format("parquet").option("path", args.parquet + dot)
        writer = writer.trigger(availableNow=True) if args.available_now else writer
        queries.append(writer.queryName(f"logsdk-{dash}{sink}").start())
    for query in queries:
        query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
