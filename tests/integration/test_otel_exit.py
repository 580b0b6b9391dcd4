"""OpenTelemetry at exit: an app that sets up a LoggerProvider with a
BatchLogRecordProcessor over KafkaLogExporter, logs and just returns delivers every log
record, whatever the order it set things up in and whether OTel shuts down at exit."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.common")

from logsdk import LogProducer
from logsdk.integrations.otel import decode_otlp
from logsdk.testing import EmbeddedBroker, create_topic, read_topic
from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = pytest.mark.integration

# argv: bootstrap, topic, spool dir, order, shutdown_on_exit ("1"/"0"), global ("1"/"0"),
# close_timeout. OTel's batch processor exports 512 of the 1,000 log records at once and
# holds the rest (its schedule is 1 s) when the app returns.
APP = """
import sys
from opentelemetry._logs import set_logger_provider
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from logsdk.integrations.otel import KafkaLogExporter

bootstrap, topic, spool, order, on_exit, make_global, close_timeout = sys.argv[1:8]

def exporter():
    return KafkaLogExporter(bootstrap_servers=bootstrap, topic=topic, spool_dir=spool,
                            close_timeout=float(close_timeout))

if order == "provider_first":  # as logsdk.integrations.otel's docstring shows
    provider = LoggerProvider(shutdown_on_exit=on_exit == "1")
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter()))
else:
    made = exporter()
    provider = LoggerProvider(shutdown_on_exit=on_exit == "1")
    provider.add_log_record_processor(BatchLogRecordProcessor(made))
if make_global == "1":
    set_logger_provider(provider)
logger = provider.get_logger("app")
for i in range(1000):
    logger.emit(body=f"line {i}", attributes={"i": i})
# returns: neither provider.shutdown() nor force_flush()
"""


def _run(spawn: Callable[..., Any], app: Path, *args: str) -> str:
    proc = spawn([sys.executable, str(app), *args], stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return str(err)


def _logged(bootstrap: str, topic: str) -> list[int]:
    """The ``i`` of every log record in the topic, sorted (once each)."""
    got = set()
    for m in read_topic(bootstrap, topic, timeout=120):
        for lr in decode_otlp(m.value() or b""):
            got.add(lr["attributes"]["i"])
    return sorted(got)


@pytest.mark.parametrize(
    ("order", "on_exit", "make_global"),
    [
        ("provider_first", "1", "0"),
        ("exporter_first", "1", "0"),
        ("provider_first", "0", "1"),
        ("exporter_first", "0", "1"),
        ("provider_first", "0", "0"),
        ("exporter_first", "0", "0"),
    ],
    ids=[
        "provider-first",
        "exporter-first",
        "provider-first-global-no-shutdown-on-exit",
        "exporter-first-global-no-shutdown-on-exit",
        "provider-first-no-shutdown-on-exit",
        "exporter-first-no-shutdown-on-exit",
    ],
)
def test_an_app_that_returns_delivers_what_the_batch_processor_held(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    tmp_path: Path,
    spawn: Callable[..., Any],
    order: str,
    on_exit: str,
    make_global: str,
) -> None:
    """1,000 log records through a BatchLogRecordProcessor, the app returns: all 1,000 in
    Kafka, the provider made before the exporter or after it, shut down by OTel at exit or
    not, global or not. (Made first, with OTel's defaults, 488 were lost: logsdk's exit
    hook closed the producer before OTel's flushed the processor, and on Python 3.12.1 the
    producer could not be made again; not shut down at exit, the processor's 488 were
    exported by nothing.)"""
    topic = fresh_topic(2)
    app = tmp_path / "app.py"
    app.write_text(APP)
    err = _run(spawn, app, kafka_broker.bootstrap_servers, topic, str(tmp_path / "s"), order,
               on_exit, make_global, "5")  # fmt: skip
    assert "not exported" not in err, err[-3000:]
    assert _logged(kafka_broker.bootstrap_servers, topic) == list(range(1000))


@pytest.mark.fault
def test_with_kafka_down_what_the_batch_processor_held_is_in_the_spool(
    broker_factory: Callable[..., EmbeddedBroker],
    tmp_path: Path,
    spawn: Callable[..., Any],
    make_producer: Callable[..., LogProducer],
) -> None:
    """The provider made first (OTel's defaults), Kafka unreachable: the app returns and
    all 1,000 log records are in the spool (the next producer on the spool_dir, once Kafka
    is back, delivers all 1,000)."""
    broker = broker_factory(proxy=True)
    topic = create_topic(broker.bootstrap_servers, "otel-exit", 2)
    app = tmp_path / "app.py"
    app.write_text(APP)
    spool = tmp_path / "s"
    broker.cut()
    err = _run(spawn, app, broker.bootstrap_servers, topic, str(spool), "provider_first", "1",
               "0", "1")  # fmt: skip
    assert "not exported" not in err, err[-3000:]
    broker.heal()
    make_producer(broker.bootstrap_servers, topic, spool).close(60)
    assert _logged(broker.bootstrap_servers, topic) == list(range(1000))
