"""Helpers for the log records logsdk's adapters write.

``parse_logs`` turns the ``value`` column of ``KafkaHandler``'s JSON records into typed
columns; a record that is not a JSON object is kept, with its text in ``_corrupt``, never
dropped. ``parse_otlp`` turns the OTLP records of
``logsdk.integrations.otel.KafkaLogExporter`` into one row per log record. ``dedupe``
drops the duplicates an at-least-once producer may send, by the (``logsdk.producer``,
``logsdk.seq``) headers (and a log record's index in its OTLP record), within a watermark.
"""

from __future__ import annotations

import logging

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from logsdk.errors import SparkSourceError

log = logging.getLogger("spark_sink")

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

#: Columns added by `parse_logs()`.
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


def _warn_without_headers(df: DataFrame, what: str) -> None:
    """Say so when Kafka rows come without their headers: ``producer`` and ``seq`` are
    then null, and `dedupe()` cannot drop a producer's retries (Spark's own Kafka
    source leaves the headers out unless ``includeHeaders`` is true)."""
    if "headers" not in df.columns and {"topic", "partition", "offset"} <= set(df.columns):
        log.warning(
            "%s: these Kafka rows have no headers column, so producer and seq are null and "
            "dedupe keeps every record a producer sent twice; read them with the option "
            'includeHeaders "true" (Spark\'s own Kafka source leaves headers out by default)',
            what,
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
    _warn_without_headers(df, "parse_logs")
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


#: One OTLP log record, as `parse_otlp()` adds it (attribute values as JSON text).
OTLP_SCHEMA = StructType(
    [
        StructField("ts", TimestampType()),
        StructField("observed_ts", TimestampType()),
        StructField("severity_number", IntegerType()),
        StructField("severity", StringType()),
        StructField("body", StringType()),
        StructField("attributes", MapType(StringType(), StringType())),
        StructField("resource", MapType(StringType(), StringType())),
        StructField("scope", StringType()),
        StructField("trace_id", StringType()),
        StructField("span_id", StringType()),
        StructField("log_index", IntegerType()),
        StructField("_corrupt", StringType()),
    ]
)


def _otlp_rows(value: bytes | None, encoding: str) -> list[tuple[object, ...]]:
    """The OTLP log records of one Kafka value as rows of OTLP_SCHEMA (runs on executors)."""
    import datetime as dt
    import json

    from logsdk.integrations.otel import decode_otlp

    if value is None:
        return []
    try:
        records = decode_otlp(bytes(value), encoding)
    except ValueError:
        raw = bytes(value).decode("utf-8", "replace")
        return [(None, None, None, None, None, None, None, None, None, None, None, raw)]

    def when(ns: int) -> dt.datetime | None:
        return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc) if ns else None

    def text(v: object) -> str:
        return v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)

    return [
        (
            when(r["time_unix_nano"] or r["observed_time_unix_nano"]),
            when(r["observed_time_unix_nano"]),
            r["severity_number"],
            r["severity_text"] or None,
            None if r["body"] is None else text(r["body"]),
            {k: text(v) for k, v in r["attributes"].items()},
            {k: text(v) for k, v in r["resource"].items()},
            r["scope"] or None,
            r["trace_id"],
            r["span_id"],
            r["index"],
            None,
        )
        for r in records
    ]


def parse_otlp(
    df: DataFrame, *, value_col: str = "value", encoding: str = "otlp_proto"
) -> DataFrame:
    """One row per OTLP log record in ``value_col`` (records of ``KafkaLogExporter``).

    Adds ``ts`` (the log record's time; its observed time, then Kafka's ``timestamp``,
    when it has none), ``observed_ts``, ``severity_number``, ``severity``, ``body``
    (text; a structured body as JSON), ``attributes`` and ``resource`` (maps of key ->
    JSON text, strings as they are), ``scope``, ``trace_id`` and ``span_id`` (hex),
    ``log_index`` (the log record's position in its Kafka record), ``producer`` and ``seq``
    (from the headers) and ``_corrupt`` (the text of a value that is not OTLP: one row,
    other columns null). The input columns are kept; the decoding runs in a Python UDF on
    the executors (logsdk with the ``otel`` extra installed there).
    """
    if value_col not in df.columns:
        raise SparkSourceError(f"parse_otlp: no column {value_col!r} in {df.columns}")
    if encoding not in ("otlp_proto", "otlp_json"):
        raise SparkSourceError(
            f"parse_otlp: encoding must be otlp_proto or otlp_json: {encoding!r}"
        )
    _warn_without_headers(df, "parse_otlp")
    # Not Arrow-optimised: that needs pandas, which logsdk does not require.
    decode = F.udf(lambda v: _otlp_rows(v, encoding), ArrayType(OTLP_SCHEMA), useArrow=False)
    out = df.withColumn("__otlp", F.explode(decode(F.col(value_col).cast("binary"))))
    for field in OTLP_SCHEMA.fieldNames():
        out = out.withColumn(field, F.col(f"__otlp.{field}"))
    if "headers" in df.columns:
        out = out.withColumn("producer", _header("logsdk.producer").cast("string"))
        out = out.withColumn("seq", _header("logsdk.seq").cast("string").cast("long"))
    else:
        out = out.withColumn("producer", F.lit(None).cast("string"))
        out = out.withColumn("seq", F.lit(None).cast("long"))
    if "timestamp" in df.columns:
        out = out.withColumn("ts", F.coalesce("ts", F.col("timestamp").cast("timestamp")))
    return out.drop("__otlp")


def dedupe(df: DataFrame, *, watermark: str = "10 minutes", event_time: str = "ts") -> DataFrame:
    """Drop records sent twice by a producer: same (``producer``, ``seq``) within ``watermark``.

    Run it on `parse_logs()` or `parse_otlp()` output (the latter keyed by
    (``producer``, ``seq``, ``log_index``): the log records of one Kafka record share its
    headers). Records without the headers are never
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
    index = [F.col("log_index").cast("string")] if "log_index" in df.columns else []
    if index and {"topic", "partition", "offset"} <= set(df.columns):
        own = F.concat_ws(":", own, *index)
    key = F.when(
        F.col("producer").isNotNull() & F.col("seq").isNotNull(),
        F.concat_ws(":", F.lit("seq"), F.col("producer"), F.col("seq").cast("string"), *index),
    ).otherwise(own)
    keyed = df.withColumn("__dedupe", key)
    if not df.isStreaming:  # Spark allows the watermark variant on streams only
        return keyed.dropDuplicates(["__dedupe"]).drop("__dedupe")
    return (
        keyed.withWatermark(event_time, watermark)
        .dropDuplicatesWithinWatermark(["__dedupe"])
        .drop("__dedupe")
    )


__all__ = ["LOG_COLUMNS", "LOG_SCHEMA", "OTLP_SCHEMA", "dedupe", "parse_logs", "parse_otlp"]
