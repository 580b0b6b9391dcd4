"""OpenTelemetry logs through KafkaLogExporter: what lands in Kafka, decoded with
opentelemetry-proto's own message classes, field by field; across a network cut."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.common")

from google.protobuf import json_format
from opentelemetry._logs import SeverityNumber
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from logsdk import LogProducer
from logsdk.errors import ConfigError
from logsdk.integrations.otel import KafkaLogExporter, decode_otlp, to_otlp_json
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, read_topic
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import FAST, wait_until

pytestmark = pytest.mark.integration

RESOURCE = {"service.name": "checkout", "deployment.environment": "test"}


class App:
    """An app's OTel logging: a LoggerProvider with a BatchLogRecordProcessor over the
    exporter, and a tracer for spans (not installed globally)."""

    def __init__(self, exporter: KafkaLogExporter) -> None:
        self.exporter = exporter
        self.provider = LoggerProvider(resource=Resource.create(RESOURCE), shutdown_on_exit=False)
        self.provider.add_log_record_processor(
            BatchLogRecordProcessor(exporter, schedule_delay_millis=50, max_export_batch_size=64)
        )
        self.logger = self.provider.get_logger("app.orders", "1.2")
        self.tracer = TracerProvider().get_tracer("app")
        #: What the app logged: i -> (body, severity, attributes, time ns, trace, span).
        self.logged: dict[int, tuple[str, int, dict[str, Any], int, int, int]] = {}

    def log(self, i: int, *, in_span: bool) -> None:
        body = f"order {i} paid"
        attrs = {"i": i, "order.total": i * 1.5, "paid": i % 2 == 0, "tags": ["a", f"t{i}"]}
        severity = SeverityNumber.WARN if i % 3 == 0 else SeverityNumber.INFO
        stamp = time.time_ns()
        if in_span:
            with self.tracer.start_as_current_span(f"pay {i}") as span:
                ctx = span.get_span_context()
                self.logger.emit(body=body, severity_number=severity, severity_text=severity.name,
                                 attributes=attrs, timestamp=stamp)  # fmt: skip
                trace, span_id = ctx.trace_id, ctx.span_id
        else:
            self.logger.emit(body=body, severity_number=severity, severity_text=severity.name,
                             attributes=attrs, timestamp=stamp)  # fmt: skip
            trace, span_id = 0, 0
        self.logged[i] = (body, severity.value, attrs, stamp, trace, span_id)

    def shutdown(self) -> None:
        self.provider.shutdown()


def decoded(values: list[bytes], encoding: str = "otlp_proto") -> Iterator[tuple[Any, Any, Any]]:
    """(resource, scope, log record) of every OTLP log record in the Kafka values."""
    for value in values:
        request = ExportLogsServiceRequest()
        if encoding == "otlp_json":
            doc = json.loads(value)
            for rl in doc["resourceLogs"]:
                for sl in rl["scopeLogs"]:
                    for lr in sl["logRecords"]:
                        for key in ("traceId", "spanId"):
                            if key in lr:  # OTLP/JSON's hex, back to protobuf JSON's base64
                                import base64

                                lr[key] = base64.b64encode(bytes.fromhex(lr[key])).decode()
            json_format.ParseDict(doc, request)
        else:
            request.ParseFromString(value)
        for rl in request.resource_logs:
            for sl in rl.scope_logs:
                for lr in sl.log_records:
                    yield rl.resource, sl.scope, lr


def plain(value: Any) -> Any:
    """An OTLP AnyValue as Python."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain(v) for v in value.array_value.values]
    return getattr(value, kind)


def check_fields(app: App, values: list[bytes], encoding: str = "otlp_proto") -> None:
    """Every logged record is in Kafka once, each field as the app logged it."""
    seen: dict[int, Any] = {}
    for resource, scope, lr in decoded(values, encoding):
        attrs = {a.key: plain(a.value) for a in lr.attributes}
        i = attrs["i"]
        assert i not in seen, f"log record {i} twice"
        seen[i] = lr
        body, severity, logged_attrs, stamp, trace, span = app.logged[i]
        assert lr.body.string_value == body
        assert lr.severity_number == severity
        assert lr.severity_text == ("WARN" if severity == SeverityNumber.WARN.value else "INFO")
        assert attrs == logged_attrs
        assert lr.time_unix_nano == stamp
        assert lr.observed_time_unix_nano >= stamp
        assert int.from_bytes(lr.trace_id, "big") == trace
        assert int.from_bytes(lr.span_id, "big") == span
        assert {a.key: plain(a.value) for a in resource.attributes}.items() >= RESOURCE.items()
        assert (scope.name, scope.version) == ("app.orders", "1.2")
    assert sorted(seen) == sorted(app.logged)


@pytest.mark.each_broker
@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
def test_every_field_lands_in_kafka_as_logged(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path, encoding: str
) -> None:
    """300 log records, half inside spans: body, severity, attributes (int, float, bool,
    list), timestamps, trace and span ids, resource and scope, each once."""
    topic = fresh_topic(2)
    exporter = KafkaLogExporter(
        bootstrap_servers=kafka.bootstrap_servers, topic=topic,
        spool_dir=tmp_path / "spool", encoding=encoding,
    )  # fmt: skip
    app = App(exporter)
    for i in range(300):
        app.log(i, in_span=i % 2 == 0)
    app.shutdown()  # the processor exports what it holds, then the exporter closes its producer
    values = [m.value() or b"" for m in read_topic(kafka.bootstrap_servers, topic)]
    check_fields(app, values, encoding)
    # The decode helper a LogConsumer handler uses gives the same records, in order.
    rows = [r for v in values for r in decode_otlp(v, encoding)]
    assert sorted(r["attributes"]["i"] for r in rows) == list(range(300))
    for r in rows:
        body, severity, attrs, stamp, trace, span = app.logged[r["attributes"]["i"]]
        assert (r["body"], r["severity_number"], r["attributes"]) == (body, severity, attrs)
        assert r["time_unix_nano"] == stamp
        assert r["trace_id"] == (format(trace, "032x") if trace else None)
        assert r["span_id"] == (format(span, "016x") if span else None)
        assert r["resource"]["service.name"] == "checkout"
    with pytest.raises(ValueError, match="not an OTLP logs request"):
        decode_otlp(b"{not otlp", encoding)
    assert exporter.exported == 300
    assert exporter.failed == 0
    assert exporter.records == len(values)
    if encoding == "otlp_json":
        first = json.loads(values[0])["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
        with_trace = [lr for lr in first if "traceId" in lr]
        assert with_trace
        assert all(len(lr["traceId"]) == 32 and len(lr["spanId"]) == 16 for lr in with_trace)


def test_every_field_lands_in_kafka_through_the_host_agent(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """``delivery="agent"``: the exporter only writes its process's ring; a host agent on the
    same spool root ships it. The provider's shutdown() returns once the agent has every
    record acknowledged (the exporter's close waits for it), and each field is as logged."""
    from logsdk.agent._agent import Agent, AgentConfig

    topic = fresh_topic(2)
    root = tmp_path / "spool"
    agent = Agent(
        AgentConfig(
            spool_root=root,
            bootstrap_servers=kafka_broker.bootstrap_servers,
        )
    ).start()
    try:
        exporter = KafkaLogExporter(
            bootstrap_servers=kafka_broker.bootstrap_servers, topic=topic, spool_dir=root,
            delivery="agent", close_timeout=30,
        )  # fmt: skip
        assert exporter.producer.config.delivery == "agent"
        app = App(exporter)
        for i in range(300):
            app.log(i, in_span=i % 2 == 0)
        app.shutdown()
        assert exporter.exported == 300
        assert exporter.failed == 0
        assert exporter.producer.stats()["undelivered"] == 0
    finally:
        assert agent.stop(10)
    values = [m.value() or b"" for m in read_topic(kafka_broker.bootstrap_servers, topic)]
    check_fields(app, values)
    report = check_delivery(read_topic(kafka_broker.bootstrap_servers, topic))
    assert (report.unique, report.duplicates) == (exporter.records, 0)


def test_large_batches_are_split_under_max_record_bytes(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = fresh_topic(1)
    exporter = KafkaLogExporter(
        bootstrap_servers=kafka_broker.bootstrap_servers, topic=topic,
        spool_dir=tmp_path / "spool", max_record_bytes=4096,
    )  # fmt: skip
    app = App(exporter)
    for i in range(200):
        app.log(i, in_span=True)
    app.shutdown()
    values = [m.value() or b"" for m in read_topic(kafka_broker.bootstrap_servers, topic)]
    assert all(len(v) <= 4096 for v in values)
    assert len(values) >= 10
    check_fields(app, values)


#: What ``os.listdir`` returns for a file name whose bytes are not UTF-8 (``caf\xe9``).
UNDECODABLE = b"caf\xe9".decode("utf-8", "surrogateescape")


def emitting(exporter: KafkaLogExporter, processor: str) -> tuple[LoggerProvider, Any]:
    """A LoggerProvider over ``exporter`` with OTel's ``"batch"`` processor (its default
    batch of 512, a queue that drops nothing here) or its ``"simple"`` one; and a logger."""
    provider = LoggerProvider(shutdown_on_exit=False)
    if processor == "batch":
        provider.add_log_record_processor(
            BatchLogRecordProcessor(exporter, schedule_delay_millis=50, max_queue_size=10_000)
        )
    else:
        provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    return provider, provider.get_logger("app.files", "1.0")


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
@pytest.mark.parametrize("processor", ["batch", "simple"])
def test_text_utf8_cannot_carry_is_escaped_and_its_batch_delivered(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path,
    encoding: str, processor: str,
) -> None:  # fmt: skip
    """1,000 log records, three carrying a surrogate-escaped file name (a str body, a map
    body, an attribute): all 1,000 in Kafka, that text written with the JSON adapters'
    escape (``caf\\udce9``), everything else as logged; nothing counted in ``failed``."""
    topic = fresh_topic(1)
    exporter = KafkaLogExporter(
        bootstrap_servers=kafka_broker.bootstrap_servers, topic=topic,
        spool_dir=tmp_path / "spool", encoding=encoding,
    )  # fmt: skip
    provider, logger = emitting(exporter, processor)
    for i in range(1000):
        body: Any = f"line {i}"
        attributes: dict[str, Any] = {"i": i}
        if i == 100:
            body = f"opened {UNDECODABLE}"
        elif i == 500:
            body = {"op": "open", "file": UNDECODABLE}
        elif i == 900:
            attributes["file"] = UNDECODABLE
        logger.emit(body=body, attributes=attributes)
    provider.shutdown()
    values = [m.value() or b"" for m in read_topic(kafka_broker.bootstrap_servers, topic)]
    rows = [r for v in values for r in decode_otlp(v, encoding)]
    by_i = {r["attributes"]["i"]: r for r in rows}
    assert len(rows) == 1000
    assert sorted(by_i) == list(range(1000))
    assert by_i[100]["body"] == "opened caf\\udce9"
    assert by_i[500]["body"] == {"op": "open", "file": "caf\\udce9"}
    assert by_i[900]["attributes"] == {"i": 900, "file": "caf\\udce9"}
    assert all(r["body"] == f"line {i}" for i, r in by_i.items() if i not in (100, 500))
    assert (exporter.exported, exporter.failed) == (1000, 0)


def test_a_log_record_otlp_cannot_carry_is_counted_and_said_once(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """One batch of 100 log records, two of them with a body no OTLP value holds (an int
    beyond 64 bits): the 98 others in Kafka, ``failed`` 2, and one warning for the two."""
    import logging

    topic = fresh_topic(1)
    exporter = KafkaLogExporter(
        bootstrap_servers=kafka_broker.bootstrap_servers, topic=topic,
        spool_dir=tmp_path / "spool",
    )  # fmt: skip
    provider = LoggerProvider(shutdown_on_exit=False)
    # Exported only by force_flush below: the 100 log records go as one batch.
    provider.add_log_record_processor(
        BatchLogRecordProcessor(exporter, schedule_delay_millis=600_000)
    )
    logger = provider.get_logger("app")
    for i in range(100):
        logger.emit(body=2**70 if i in (10, 60) else f"line {i}", attributes={"i": i})
    with caplog.at_level(logging.WARNING, logger="logsdk.integrations.otel"):
        assert provider.force_flush()
    provider.shutdown()
    rows = [
        r
        for m in read_topic(kafka_broker.bootstrap_servers, topic)
        for r in decode_otlp(m.value() or b"")
    ]
    assert sorted(r["attributes"]["i"] for r in rows) == [
        i for i in range(100) if i not in (10, 60)
    ]
    assert (exporter.exported, exporter.failed) == (98, 2)
    said = [r for r in caplog.records if r.name == "logsdk.integrations.otel"]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "2 log record(s)" in said[0].getMessage()


@pytest.mark.parametrize(
    "limit",
    [{"message_max_bytes": 256_000}, {"kafka_config": {"message.max.bytes": 256_000}}],
    ids=["message_max_bytes", "kafka_config"],
)
@pytest.mark.each_broker
def test_batches_are_split_under_the_producers_message_max_bytes(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path,
    limit: dict[str, Any],
) -> None:  # fmt: skip
    """A 256,000-byte limit on the exporter's producer (for a cluster with a lower
    ``max.message.bytes``), as ``message_max_bytes`` or librdkafka's own property, and
    3,000 log records of about 650 B in OTel's default batches of 512 (about 330 kB
    each): split under the producer's limit, all 3,000 in Kafka. On Apache Kafka the
    topic itself has ``max.message.bytes=256000``, which the broker applies per batch."""
    topic = (
        fresh_topic(1, config={"max.message.bytes": "256000"})
        if kafka.kind == "apache"
        else fresh_topic(1)
    )
    exporter = KafkaLogExporter(
        bootstrap_servers=kafka.bootstrap_servers, topic=topic,
        spool_dir=tmp_path / "spool", **limit,
    )  # fmt: skip
    provider, logger = emitting(exporter, "batch")
    for i in range(3000):
        logger.emit(body=f"request {i} " + "x" * 600, attributes={"i": i, "path": "/orders"})
    provider.shutdown()
    values = [m.value() or b"" for m in read_topic(kafka.bootstrap_servers, topic)]
    rows = [r for v in values for r in decode_otlp(v)]
    assert sorted(r["attributes"]["i"] for r in rows) == list(range(3000))
    assert max(len(v) for v in values) <= 256_000
    assert 600 <= len(values[0]) / len(decode_otlp(values[0])) <= 700  # about 650 B each
    assert (exporter.exported, exporter.failed) == (3000, 0)


def test_a_borrowed_producer_is_left_open_and_shares_its_guarantees(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path,
    make_producer: Callable[..., LogProducer],
) -> None:  # fmt: skip
    topic = fresh_topic(1)
    producer = make_producer(kafka_broker.bootstrap_servers, topic, tmp_path / "spool")
    exporter = KafkaLogExporter(producer)
    app = App(exporter)
    app.log(1, in_span=False)
    app.shutdown()
    assert producer.stats()["state"] != "CLOSED"
    producer.send(b"after")  # still open
    assert producer.flush(30) == 0
    rep = check_delivery(read_topic(kafka_broker.bootstrap_servers, topic))
    assert rep.missing(producer.producer_id, range(2)) == []


def test_bad_settings_are_refused(tmp_path: Path, make_producer: Callable[..., Any]) -> None:
    with pytest.raises(ConfigError, match="encoding"):
        KafkaLogExporter(bootstrap_servers="127.0.0.1:1", topic="t", encoding="otlp_xml")
    with pytest.raises(ConfigError, match="max_record_bytes"):
        KafkaLogExporter(bootstrap_servers="127.0.0.1:1", topic="t", max_record_bytes=10)
    producer = make_producer("127.0.0.1:1", "t", tmp_path / "spool")
    with pytest.raises(ConfigError, match="not both"):
        KafkaLogExporter(producer, spool_dir=tmp_path)


def test_export_after_shutdown_fails_and_counts(tmp_path: Path) -> None:
    """An exporter shut down refuses a batch (FAILURE, counted), and shutdown is idempotent."""
    from opentelemetry.sdk._logs.export import LogRecordExportResult

    exporter = KafkaLogExporter(
        bootstrap_servers="127.0.0.1:1", topic="t", spool_dir=tmp_path, close_timeout=0
    )
    exporter.shutdown()
    exporter.shutdown()
    assert exporter.export([object()]) == LogRecordExportResult.FAILURE
    assert exporter.failed == 1


def test_otlp_json_writes_ids_as_hex() -> None:
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

    lr = LogRecord(trace_id=bytes(range(16)), span_id=bytes(range(8)), severity_number=9)
    request = ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=[lr])])]
    )
    doc = json.loads(to_otlp_json(request))
    out = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    assert out == {
        "traceId": bytes(range(16)).hex(),
        "spanId": bytes(range(8)).hex(),
        "severityNumber": 9,
    }


@pytest.mark.fault
def test_records_logged_while_the_network_is_cut_arrive_once(
    broker_factory: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    """2,000 log records, the network cut for the middle 1,000: the exporter keeps
    returning SUCCESS (the producer spools), and after the cut every log record is in
    Kafka once, its fields intact."""
    broker = broker_factory(proxy=True)
    topic = create_topic(broker.bootstrap_servers, "otlp-logs", 2)
    exporter = KafkaLogExporter(
        bootstrap_servers=broker.bootstrap_servers, topic=topic, spool_dir=tmp_path / "spool",
        close_timeout=60, **FAST,
    )  # fmt: skip
    app = App(exporter)
    for i in range(2000):
        app.log(i, in_span=i % 4 == 0)
        if i == 500:
            app.provider.force_flush()
            broker.cut()
            wait_until(
                lambda: exporter.producer.stats()["state"] == "DEGRADED", 30, "degraded by the cut"
            )
        if i == 1500:
            # OTel's batch processor exports what it holds; it does not call the
            # exporter's force_flush(), which is what waits until they are durable.
            app.provider.force_flush()
            assert exporter.force_flush()
            assert exporter.producer.stats()["spooled"] > 0
            broker.heal()
    app.shutdown()
    assert exporter.failed == 0
    messages = read_topic(broker.bootstrap_servers, topic, timeout=120)
    rep = check_delivery(messages)
    assert rep.missing(exporter.producer.producer_id, range(exporter.records)) == []
    # A Kafka record resent after the cut may be there twice (its headers say so): a
    # reader keeps one per (producer, seq); then every log record is there once.
    unique = {tuple(sorted(m.headers() or [])): m.value() or b"" for m in messages}
    check_fields(app, list(unique.values()))


EXITING_APP = """
import multiprocessing, sys
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from logsdk.integrations.otel import KafkaLogExporter

bootstrap, topic, spool = sys.argv[1:4]
exporter = KafkaLogExporter(bootstrap_servers=bootstrap, topic=topic, spool_dir=spool)
provider = LoggerProvider(shutdown_on_exit=False)  # nothing of OTel's own exit handling
provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
logger = provider.get_logger("app")

def work(start):
    for i in range(start, start + 100):
        logger.emit(body=f"line {i}", attributes={"i": i})

if __name__ == "__main__":
    ctx = multiprocessing.get_context("fork")
    children = [ctx.Process(target=work, args=(1000 * (n + 1),)) for n in range(2)]
    for c in children:
        c.start()  # forked: each child's records go through its own copy of the producer
    for i in range(500):
        logger.emit(body=f"line {i}", attributes={"i": i})
    for c in children:
        c.join()
    # returns without provider.shutdown() nor force_flush()
"""


def test_an_app_that_just_exits_and_its_forked_workers_deliver_every_record(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path,
    spawn: Callable[..., Any],
) -> None:  # fmt: skip
    """SimpleLogRecordProcessor over the exporter: each log record is handed to the
    producer as it is emitted, so the producer's fork and exit handling covers it: an app
    that returns without shutting OTel down, and two fork workers that leave through
    multiprocessing's os._exit, deliver all 700 log records."""
    topic = fresh_topic(2)
    script = tmp_path / "app.py"
    script.write_text(EXITING_APP)
    args = [sys.executable, str(script), kafka_broker.bootstrap_servers, topic, str(tmp_path / "s")]
    proc = spawn(args, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-3000:]
    got = sorted(
        plain(a.value)
        for _, _, lr in decoded([m.value() or b"" for m in read_topic(
            kafka_broker.bootstrap_servers, topic)])
        for a in lr.attributes
        if a.key == "i"
    )  # fmt: skip
    assert got == [*range(500), *range(1000, 1100), *range(2000, 2100)]


def test_the_logging_adapters_add_the_active_span(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path,
    make_producer: Callable[..., LogProducer],
) -> None:  # fmt: skip
    """KafkaHandler (inline and in background mode, where another thread builds the
    record), structlog's KafkaProcessor and loguru's KafkaSink write ``trace_id`` and
    ``span_id`` (hex, as OTel writes them) of the span active where the app logged;
    nothing outside a span; a field the record has already is kept."""
    import logging

    import structlog
    from loguru import logger as loguru_logger

    from logsdk.integrations.logging import KafkaHandler
    from logsdk.integrations.loguru import KafkaSink
    from logsdk.integrations.structlog import KafkaProcessor

    topic = fresh_topic(1)
    producer = make_producer(kafka_broker.bootstrap_servers, topic, tmp_path / "spool")
    handler = KafkaHandler(producer)
    std = logging.getLogger("otel.adapters")
    std.addHandler(handler)
    std.propagate = False
    background = KafkaHandler(producer, background=True)
    bg = logging.getLogger("otel.adapters.background")
    bg.addHandler(background)
    bg.propagate = False
    processor = KafkaProcessor(producer)
    slog = structlog.wrap_logger(structlog.ReturnLogger(), processors=[processor])
    sink = loguru_logger.add(KafkaSink(producer), format="{message}")
    tracer = TracerProvider().get_tracer("app")
    try:
        with tracer.start_as_current_span("request") as span:
            ctx = span.get_span_context()
            std.warning("std in span")
            bg.warning("background in span")
            slog.info("structlog in span")
            slog.info("structlog own ids", trace_id="mine")
            loguru_logger.info("loguru in span")
        std.warning("std outside")
        bg.warning("background outside")
        loguru_logger.info("loguru outside")
    finally:
        loguru_logger.remove(sink)
        std.removeHandler(handler)
        bg.removeHandler(background)
        background.close()  # its thread hands what it holds to the (borrowed) producer
    assert producer.flush(30) == 0
    docs = [json.loads(m.value() or b"") for m in read_topic(kafka_broker.bootstrap_servers, topic)]
    by_text = {d.get("message") or d.get("event"): d for d in docs}
    trace, span_id = format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
    for text in ("std in span", "background in span", "structlog in span", "loguru in span"):
        assert (by_text[text]["trace_id"], by_text[text]["span_id"]) == (trace, span_id), text
    assert by_text["structlog own ids"]["trace_id"] == "mine"
    assert by_text["structlog own ids"]["span_id"] == span_id
    for text in ("std outside", "background outside", "loguru outside"):
        assert "trace_id" not in by_text[text]
        assert "span_id" not in by_text[text]


def test_the_adapters_do_not_import_opentelemetry(tmp_path: Path) -> None:
    """A KafkaHandler log call in a process that never imported OpenTelemetry does not
    import it (the trace context costs a dict lookup there)."""
    code = (
        "import logging, sys\n"
        "from logsdk.integrations.logging import KafkaHandler\n"
        f"h = KafkaHandler(bootstrap_servers='127.0.0.1:1', topic='t', spool_dir={str(tmp_path)!r},"
        " close_timeout=0)\n"
        "logging.getLogger('x').addHandler(h)\n"
        "logging.getLogger('x').warning('hi')\n"
        "assert h._sender.dropped == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


RESTARTING_APP = """
import sys
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from logsdk.integrations.otel import KafkaLogExporter

bootstrap, topic, spool, first, count = sys.argv[1:6]
exporter = KafkaLogExporter(bootstrap_servers=bootstrap, topic=topic, spool_dir=spool,
                            close_timeout=1)
provider = LoggerProvider()
provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
logger = provider.get_logger("app")
for i in range(int(first), int(first) + int(count)):
    logger.emit(body=f"line {i}", attributes={"i": i})
provider.shutdown()
print(exporter.producer.stats()["spool_records"])
"""


@pytest.mark.fault
def test_an_app_restarted_after_an_outage_delivers_what_the_first_run_kept(
    broker_factory: Callable[..., EmbeddedBroker], tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    """The app logs 300 records while the network is cut and exits (its close gives up
    after 1 s: the records stay in the spool); after the cut the app starts again on the
    same spool_dir and logs 200 more: all 500 log records are in Kafka."""
    broker = broker_factory(proxy=True)
    topic = create_topic(broker.bootstrap_servers, "otlp-restart", 2)
    script = tmp_path / "app.py"
    script.write_text(RESTARTING_APP)
    spool = str(tmp_path / "spool")

    def run(first: int, count: int) -> int:
        args = [sys.executable, str(script), broker.bootstrap_servers, topic, spool]
        proc = spawn([*args, str(first), str(count)], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)  # fmt: skip
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-3000:]
        return int(out.decode().split()[-1])

    broker.cut()
    assert run(0, 300) == 300  # all kept in the spool at exit
    broker.heal()
    assert run(1000, 200) == 0
    got = sorted(
        plain(a.value)
        for _, _, lr in decoded([m.value() or b"" for m in read_topic(
            broker.bootstrap_servers, topic, timeout=120)])
        for a in lr.attributes
        if a.key == "i"
    )  # fmt: skip
    assert sorted(set(got)) == [*range(300), *range(1000, 1200)]
