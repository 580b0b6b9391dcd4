"""The pytest plugin's fixtures: the session broker, fresh topics, the external override."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from logsdk.testing import read_topic
from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = pytest.mark.integration


def test_fresh_topics_are_unique(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    make_kafka_producer: Callable[..., Producer],
) -> None:
    """Each fresh_topic() call makes a new topic with the partitions asked for."""
    a, b = fresh_topic(2), fresh_topic(5)
    assert a != b
    p = make_kafka_producer(kafka_broker.client_config("producer"))
    for part in range(5):
        p.produce(b, b"x", partition=part)
    assert p.flush(10) == 0
    assert {m.partition() for m in read_topic(kafka_broker.bootstrap_servers, b)} == set(range(5))


def test_external_bootstrap_is_honoured(kafka_broker: KafkaTarget, tmp_path: Path) -> None:
    """With LOGSDK_TEST_BOOTSTRAP set, the fixtures use it and fault tests are skipped."""
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(
        textwrap.dedent(
            f"""
            def test_uses_external(kafka_broker, fresh_topic):
                assert kafka_broker.kind == "external"
                assert kafka_broker.bootstrap_servers == "{kafka_broker.bootstrap_servers}"
                assert fresh_topic(1)

            def test_fault_skipped(broker_factory):
                raise AssertionError("must be skipped")
            """
        )
    )
    env = {
        **__import__("os").environ,
        "LOGSDK_TEST_BOOTSTRAP": kafka_broker.bootstrap_servers,
    }
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(test_file)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "1 passed, 1 skipped" in out.stdout, out.stdout + out.stderr
    assert "external cluster" in out.stdout
