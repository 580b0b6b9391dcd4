"""Helpers for the JSON log records written by ``logsdk.integrations.logging.KafkaHandler``.

``parse_logs`` turns the ``value`` column into typed columns; a record that is not a
JSON object is kept, with its text in ``_corrupt``, never dropped. ``dedupe`` drops
the duplicates an at-least-once producer may send, by the (``logsdk.producer``,
``logsdk.seq``) headers, within a watermark.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from logsdk.errors import SparkSourceError

#: The fields KafkaHandler writes, as Spark reads them (``extra`` values as JSON text).
LOG_SCHEMA = StructType(
    [
        StructField("timestamp", StringType()),
        StructField("level", StringType()),
        StructField("logger", StringType()),
        StructField("message", StringType()),
        StructField("host", StringType()),
        StructField("pid", LongType()),
        StructField("thread", StringType()),
        StructField("exception", StringType()),
        StructField("extra", MapType(StringType(), StringType())),
        StructField("_corrupt", StringType()),
    ]
)

#: Columns added by :func:`parse_logs`.
LOG_COLUMNS = (
    "ts",
    "level",
    "logger",
    "message",
    "host",
    "pid",
    "thread",
    "exception",
    "extra",
    "producer",
    "seq",
    "_corrupt",
)


def _header(name: str) -> Column:
    # get() returns null past the end of the array, also under ANSI mode.
    return F.expr(f"get(filter(headers, h -> h.key = '{name}'), 0).value")


def parse_logs(df: DataFrame, *, value_col: str = "value") -> DataFrame:
    """Add typed columns parsed from the KafkaHandler JSON in ``value_col``.

    Adds ``ts`` (the record's own time; Kafka's ``timestamp`` when it has none or is
    corrupt), ``level``, ``logger``, ``message``, ``host``, ``pid``,
    ``thread``, ``exception``, ``extra`` (map of field -> JSON text), ``producer`` and
    ``seq`` (from the headers, when there is a ``headers`` column) and ``_corrupt``: the
    raw text of a value that is not a JSON object (then the parsed columns are null).
    Works on streaming and batch DataFrames; the input columns are kept.
    """
    if value_col not in df.columns:
        raise SparkSourceError(f"parse_logs: no column {value_col!r} in {df.columns}")
    text = F.col(value_col).cast("string")
    parsed = F.from_json(
        text,
        LOG_SCHEMA,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"},
    )
    out = df.withColumn("__log", parsed)
    corrupt = F.when(
        text.isNotNull()
        & (
            F.col("__log").isNull()
            | F.col("__log._corrupt").isNotNull()
            | ~F.ltrim(text).startswith("{")
        ),
        text,
    )
    fields = {c: F.col(f"__log.{c}") for c in LOG_COLUMNS[1:9]}
    if "headers" in df.columns:
        fields["producer"] = _header("logsdk.producer").cast("string")
        fields["seq"] = _header("logsdk.seq").cast("string").cast("long")
    else:
        fields["producer"] = F.lit(None).cast("string")
        fields["seq"] = F.lit(None).cast("long")
    own_ts = F.col("__log.timestamp").cast("timestamp")
    kafka_ts = F.col("timestamp") if "timestamp" in df.columns else F.lit(None)
    out = out.withColumn("_corrupt", corrupt)
    for name, col in fields.items():
        out = out.withColumn(name, F.when(F.col("_corrupt").isNull(), col))
    # ts is never null where Kafka gave a time, so a watermark on it keeps every row.
    out = out.withColumn(
        "ts", F.coalesce(F.when(F.col("_corrupt").isNull(), own_ts), kafka_ts.cast("timestamp"))
    )
    return out.drop("__log")


def dedupe(df: DataFrame, *, watermark: str = "10 minutes", event_time: str = "ts") -> DataFrame:
    """Drop records sent twice by a producer: same (``producer``, ``seq``) within ``watermark``.

    Run it on :func:`parse_logs` output. Records without the headers are never
    dropped (each is keyed by its own topic/partition/offset, or kept as is when those
    are missing). Streaming: the state is bounded by the watermark on ``event_time``;
    a batch DataFrame is deduplicated as a whole.
    """
    for col in ("producer", "seq", event_time):
        if col not in df.columns:
            raise SparkSourceError(f"dedupe: no column {col!r}; run parse_logs first")
    own = (
        F.concat_ws(":", F.lit("kafka"), "topic", "partition", "offset")
        if {"topic", "partition", "offset"} <= set(df.columns)
        else F.expr("uuid()")
    )
    key = F.when(
        F.col("producer").isNotNull() & F.col("seq").isNotNull(),
        F.concat_ws(":", F.lit("seq"), F.col("producer"), F.col("seq").cast("string")),
    ).otherwise(own)
    keyed = df.withColumn("__dedupe", key)
    if not df.isStreaming:  # Spark allows the watermark variant on streams only
        return keyed.dropDuplicates(["__dedupe"]).drop("__dedupe")
    return (
        keyed.withWatermark(event_time, watermark)
        .dropDuplicatesWithinWatermark(["__dedupe"])
        .drop("__dedupe")
    )


__all__ = ["LOG_COLUMNS", "LOG_SCHEMA", "dedupe", "parse_logs"]
