"""structlog and loguru adapters against a real broker: fields, SDK logs skipped, drops."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from loguru import logger as loguru_logger

from logsdk import LogProducer
from logsdk.integrations.loguru import KafkaSink
from logsdk.integrations.structlog import KafkaProcessor, KafkaRenderer
from logsdk.testing import read_topic
from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = pytest.mark.integration


def docs_of(bootstrap: str, topic: str) -> list[tuple[bytes | None, dict[str, Any]]]:
    """(key, JSON value) of every record in the topic."""
    return [(m.key(), json.loads(m.value() or b"")) for m in read_topic(bootstrap, topic)]


def test_structlog_processor_tees_events_to_kafka(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """KafkaProcessor sends each event as JSON (level, timestamp, bound fields, traceback,
    host; key from a field), passes it on to the console renderer, skips the SDK's own
    events, and counts instead of raising when the producer is closed."""
    topic = fresh_topic(1)
    console = io.StringIO()
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p:
        kafka = KafkaProcessor(p, key_field="service", static_fields={"env": "test"})
        log = structlog.wrap_logger(
            structlog.PrintLogger(console),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.format_exc_info,
                kafka,
                structlog.processors.KeyValueRenderer(key_order=["event"]),
            ],
        ).bind(service="billing")
        log.info("user logged in", user="ann", obj=object())
        try:
            1 / 0  # noqa: B018
        except ZeroDivisionError:
            log.error("charge failed", exc_info=True)
        log.warning("internal", logger="logsdk.producer")  # the SDK's own: not sent
        assert kafka.flush(10) == 0
        assert kafka.dropped == 0
    assert "event='user logged in'" in console.getvalue()  # the chain went on
    log.info("after close")  # the producer is closed: counted, not raised, said
    assert kafka.dropped == 1
    said = [r.getMessage() for r in caplog.records if r.name == "logsdk.integrations"]
    assert len(said) == 1, said
    assert "ProducerClosedError" in said[0]

    got = docs_of(kafka_broker.bootstrap_servers, topic)
    assert [d["event"] for _, d in got] == ["user logged in", "charge failed"]
    key, first = got[0]
    assert key == b"billing"
    assert first["level"] == "info"
    assert first["user"] == "ann"
    assert first["env"] == "test"
    assert first["obj"].startswith("<object object")
    assert {"timestamp", "host", "service"} <= set(first)
    assert "ZeroDivisionError" in got[1][1]["exception"]


def test_structlog_renderer_returns_or_drops_the_json(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """KafkaRenderer (owning its producer) returns the JSON it sent; output=False prints
    nothing; close() delivers."""
    topic = fresh_topic(1)
    out = io.StringIO()
    render = KafkaRenderer(
        bootstrap_servers=kafka_broker.bootstrap_servers, topic=topic, spool_dir=tmp_path / "a"
    )
    silent = KafkaRenderer(render.producer, output=False)
    try:
        chain = [structlog.processors.add_log_level]
        structlog.wrap_logger(structlog.PrintLogger(out), processors=[*chain, render]).info(
            "shown", n=1
        )
        structlog.wrap_logger(structlog.PrintLogger(out), processors=[*chain, silent]).info(
            "hidden", n=2
        )
    finally:
        render.close()
    printed = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [d["event"] for d in printed] == ["shown"]
    got = [d for _, d in docs_of(kafka_broker.bootstrap_servers, topic)]
    assert [(d["event"], d["n"], d["level"]) for d in got] == [
        ("shown", 1, "info"),
        ("hidden", 2, "info"),
    ]


def test_structlog_renderer_never_raises_on_a_bad_event(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A value that contains itself, one whose str() raises, a key that is not text: the
    event is dropped and counted, the renderer still returns a line, the app never sees an
    exception; the next good event is sent. The first drop is said at once on the
    ``logsdk.integrations`` logger with its reason, the next two (within 10 s) only
    counted."""

    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no text for you")

    loop: dict[str, Any] = {}
    loop["self"] = loop
    topic = fresh_topic(1)
    out = io.StringIO()
    render = KafkaRenderer(
        bootstrap_servers=kafka_broker.bootstrap_servers, topic=topic, spool_dir=tmp_path
    )
    try:
        log = structlog.wrap_logger(structlog.PrintLogger(out), processors=[render])
        log.info("loop", d=loop)
        log.info("hostile", h=Hostile())
        log.info("tuple key", **{"k": {(1, 2): "v"}})
        log.info("fine", n=1)
        assert render.dropped == 3
        said = [r.getMessage() for r in caplog.records if r.name == "logsdk.integrations"]
        assert len(said) == 1, said
        assert "1 log record(s) not sent to Kafka (1 in all" in said[0]
        assert "ValueError: Circular reference detected" in said[0]
    finally:
        render.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert json.loads(lines[0])["event"] == "unserialisable event"
    got = [d for _, d in docs_of(kafka_broker.bootstrap_servers, topic)]
    assert [d["event"] for d in got] == ["fine"]


def test_loguru_sink_ships_records(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """KafkaSink sends loguru records as JSON (level, logger, message, extra, exception,
    source location); skips the SDK's own; logger.remove() closes its producer, which
    delivers everything."""
    topic = fresh_topic(1)
    sink = KafkaSink(
        bootstrap_servers=kafka_broker.bootstrap_servers, topic=topic, spool_dir=tmp_path
    )
    handler_id = loguru_logger.add(sink, level="INFO", catch=False)
    try:
        loguru_logger.bind(request_id="r-1").info("request done in {ms} ms", ms=12)
        loguru_logger.debug("below the level")
        try:
            {}["missing"]
        except KeyError:
            loguru_logger.exception("lookup failed")
        loguru_logger.patch(lambda r: r.update(name="logsdk.producer")).warning("internal")
    finally:
        loguru_logger.remove(handler_id)  # calls sink.stop(): closes the owned producer
    assert sink.producer.state.value == "CLOSED"
    assert sink.dropped == 0
    got = docs_of(kafka_broker.bootstrap_servers, topic)
    assert [d["message"] for _, d in got] == ["request done in 12 ms", "lookup failed"]
    key, first = got[0]
    assert key == __name__.encode()
    assert first["level"] == "INFO"
    assert first["logger"] == __name__
    assert first["extra"] == {"request_id": "r-1", "ms": 12}
    assert first["function"] == "test_loguru_sink_ships_records"
    assert {"timestamp", "host", "pid", "thread", "line", "module"} <= set(first)
    assert got[1][1]["level"] == "ERROR"
    assert "KeyError: 'missing'" in got[1][1]["exception"]


def test_loguru_sink_never_raises(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A sink whose producer is closed counts the record and the app goes on."""
    producer = LogProducer(kafka_broker.bootstrap_servers, fresh_topic(1), tmp_path)
    producer.close()
    sink = KafkaSink(producer)
    handler_id = loguru_logger.add(sink, catch=False)
    try:
        loguru_logger.info("lost, but counted")
    finally:
        loguru_logger.remove(handler_id)
    assert sink.dropped == 1
