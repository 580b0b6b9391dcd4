"""spark_sink.logs: KafkaHandler JSON into typed columns, corrupt rows kept, duplicates dropped."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from logsdk.integrations.logging import record_to_dict
from spark_sink.logs import dedupe, parse_logs

pytestmark = pytest.mark.spark

SCHEMA = (
    "topic string, partition int, offset bigint, timestamp timestamp, value binary, "
    "headers array<struct<key: string, value: binary>>"
)


def log_json(level: int, message: str, **extra: Any) -> bytes:
    record = logging.LogRecord("app.db", level, __file__, 1, message, None, None)
    record.__dict__.update(extra)
    return json.dumps(record_to_dict(record, "host-1", {}), default=str).encode()


def headers(seq: int) -> list[tuple[str, bytes]]:
    return [("logsdk.producer", b"p1"), ("logsdk.seq", str(seq).encode())]


def rows(spark: Any) -> Any:
    import datetime as dt

    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    data = [
        ("t", 0, 0, now, log_json(logging.INFO, "hello", user="ann", n=3), headers(0)),
        ("t", 0, 1, now, log_json(logging.ERROR, "boom"), headers(1)),
        ("t", 0, 2, now, log_json(logging.ERROR, "boom"), headers(1)),  # sent twice
        ("t", 0, 3, now, b"{not json", headers(2)),
        ("t", 0, 4, now, b"[1, 2]", []),
        ("t", 0, 5, now, b"plain text", []),
    ]
    return spark.createDataFrame(data, SCHEMA)


def test_parse_logs_types_fields_and_keeps_corrupt_rows(spark: Any) -> None:
    """Valid JSON becomes typed columns; invalid or non-object values land in _corrupt."""
    out = parse_logs(rows(spark)).orderBy("offset").collect()
    assert len(out) == 6  # nothing dropped
    hello, boom = out[0], out[1]
    assert (hello.level, hello.logger, hello.message, hello.host) == (
        "INFO",
        "app.db",
        "hello",
        "host-1",
    )
    assert hello.extra == {"user": "ann", "n": "3"}
    assert hello.producer == "p1"
    assert hello.seq == 0
    assert hello.ts is not None
    assert hello._corrupt is None
    assert boom.level == "ERROR"
    assert [r._corrupt for r in out[3:]] == ["{not json", "[1, 2]", "plain text"]
    assert all(r.level is None and r.ts is not None for r in out[3:])


def test_dedupe_drops_producer_duplicates_only(spark: Any) -> None:
    """The same (producer, seq) twice is kept once; rows without headers are all kept."""
    out = dedupe(parse_logs(rows(spark)), watermark="1 minute").collect()
    assert sorted(r.offset for r in out if r.seq == 1) in ([1], [2])
    assert len(out) == 5
