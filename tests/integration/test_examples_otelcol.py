"""Smoke test: examples/otel_collector.py, the OpenTelemetry Collector reading on Apache
Kafka what KafkaLogExporter wrote, every field as logged, with both encodings.

Runs when the Collector is in its cache (``python examples/otel_collector.py --build-only``
builds it: minutes of CPU, see docs/engineering/otel-collector.md); skipped otherwise."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = [pytest.mark.integration, pytest.mark.apache_kafka, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "otel_collector.py"


pytest.importorskip("opentelemetry.sdk")


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("otel_collector_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


#: Where the example keeps the Collector its manifest builds (known before any broker starts).
BINARY = example().collector_dir() / "otelcol-logsdk"


@pytest.mark.skipif(
    not BINARY.is_file(),
    reason=f"no Collector built in {BINARY.parent}: examples/otel_collector.py --build-only",
)
def test_the_collector_writes_every_field_as_logged(
    apache_kafka: KafkaTarget, tmp_path: Path
) -> None:
    """300 log records with each encoding (otlp_proto, otlp_json): the Collector's file exporter
    wrote each once, every field as the app logged it."""
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--bootstrap", apache_kafka.bootstrap_servers,
         "--workdir", str(tmp_path), "--timeout", "60"],
        capture_output=True, text=True, timeout=240, cwd=EXAMPLE.parents[1],
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    for encoding in ("otlp_proto", "otlp_json"):
        section = out.stdout.split(f"\n{encoding}: 300 log records logged\n")[1]
        lines = section.split("\n  verdict:")[0].splitlines()
        assert len(lines) == 12, section  # one line a field, each 300 of 300
        assert all(line.split()[1:] == ["300/300", "match"] for line in lines), section
    assert out.stdout.count("verdict: every field matches") == 2
