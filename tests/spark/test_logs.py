"""spark_sink.logs: KafkaHandler JSON into typed columns, corrupt rows kept, duplicates dropped."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from logsdk.integrations.logging import record_to_dict
from spark_sink.logs import dedupe, parse_logs, parse_otlp

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


def otlp_payloads() -> tuple[bytes, list[tuple[str, int]]]:
    """One OTLP request (as KafkaLogExporter writes it) with 3 log records, one in a span;
    and (body, severity number) of each."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry._logs import SeverityNumber
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = LoggerProvider(resource=Resource.create({"service.name": "svc"}))
    memory = InMemoryLogRecordExporter()
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    logger = provider.get_logger("app", "1.0")
    logger.emit(
        body="a", severity_number=SeverityNumber.INFO, attributes={"n": 1}, timestamp=10**18
    )
    with TracerProvider().get_tracer("t").start_as_current_span("s"):
        logger.emit(body="b", severity_number=SeverityNumber.ERROR, severity_text="ERROR",
                    attributes={"tags": ["x", "y"]}, timestamp=2 * 10**18)  # fmt: skip
    logger.emit(body={"k": 1}, severity_number=SeverityNumber.WARN, timestamp=10**18)
    payload = encode_logs(memory.get_finished_logs()).SerializeToString()
    provider.shutdown()
    return payload, [("a", 9), ("b", 17), ('{"k": 1}', 13)]


def test_parse_otlp_gives_a_row_per_log_record_and_dedupe_keeps_each_once(spark: Any) -> None:
    """An OTLP record of 3 log records, the same Kafka record sent twice (same headers), a
    value that is not OTLP: 7 rows with their fields; dedupe keeps 3 + the corrupt one."""
    import datetime as dt

    payload, expected = otlp_payloads()
    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    data = [
        ("t", 0, 0, now, payload, headers(0)),
        ("t", 0, 1, now, payload, headers(0)),  # resent after a cut: same headers
        ("t", 0, 2, now, b"not otlp", headers(1)),
    ]
    parsed = parse_otlp(spark.createDataFrame(data, SCHEMA))
    out = parsed.orderBy("offset", "log_index").collect()
    assert len(out) == 7
    first = out[:3]
    assert [(r.body, r.severity_number) for r in first] == expected
    assert [r.log_index for r in first] == [0, 1, 2]
    assert first[0].attributes == {"n": "1"}
    assert first[1].attributes == {"tags": '["x", "y"]'}
    assert first[1].severity == "ERROR"
    assert first[0].resource["service.name"] == "svc"
    assert first[0].scope == "app"
    assert first[0].trace_id is None
    assert len(first[1].trace_id) == 32
    assert len(first[1].span_id) == 16
    assert first[0].ts == dt.datetime.fromtimestamp(1e9, dt.timezone.utc).replace(tzinfo=None)
    assert (first[0].producer, first[0].seq) == ("p1", 0)
    assert out[6]._corrupt == "not otlp"
    assert out[6].body is None
    kept = dedupe(parsed, watermark="1 minute").collect()
    assert sorted((r.seq, r.log_index) for r in kept) == [(0, 0), (0, 1), (0, 2), (1, None)]
