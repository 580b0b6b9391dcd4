"""The Spark query process of the SIGKILL test.

``python spark_child.py BOOTSTRAP TOPIC CHECKPOINT DB [SOURCE]``: SOURCE (``logsdk-kafka``,
the default, or ``kafka``: Spark's own, headers included; 1500 records per trigger) ->
logsdk-sink into SQLiteSink(DB), sink id ``killed``; runs until killed.
"""

from __future__ import annotations

import sys

from logsdk.testing._spark import spark_jars_conf
from spark_sink import local_session


def main() -> None:
    bootstrap, topic, checkpoint, db = sys.argv[1:5]
    source = sys.argv[5] if len(sys.argv) > 5 else "logsdk-kafka"
    jars = spark_jars_conf(kafka=True) if source == "kafka" else {}
    spark = local_session("logsdk-kill-child", **jars)
    query = (
        spark.readStream.format(source)
        .option("includeHeaders", "true")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "1500")
        .load()
        .writeStream.format("logsdk-sink")
        .option("checkpointLocation", checkpoint)
        .option("sqlite.path", db)
        .option("sinkId", "killed")
        .trigger(processingTime="0 seconds")
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
