"""confluent-kafka's purge() passes librdkafka's NON_BLOCKING flag when ``blocking`` is
true, the reverse of its docstring. The producer must never wait on a blocking purge (a
broker thread that cannot answer would hold it for ever: tests/fault/test_fork_resolver.py),
so this pins which value is the non-blocking one, from librdkafka's own debug line."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from logsdk.producer._client import purge_without_waiting
from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = [pytest.mark.integration]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_purge_without_waiting_is_librdkafkas_non_blocking_purge(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    make_kafka_producer: Callable[..., Producer],
) -> None:
    topic = fresh_topic(1)
    lines = _Lines()
    rdlog = logging.getLogger("test.librdkafka.purge")
    rdlog.addHandler(lines)
    rdlog.setLevel(logging.DEBUG)
    rdlog.propagate = False
    client = make_kafka_producer(
        {"bootstrap.servers": kafka_broker.bootstrap_servers, "debug": "queue", "logger": rdlog}
    )
    client.produce(topic, b"x")
    purge_without_waiting(client)
    deadline = time.monotonic() + 20
    purges: list[str] = []
    while not purges and time.monotonic() < deadline:
        client.poll(0.1)
        purges = [m for m in lines.lines if "Purging queues with flags" in m]
    client.flush(10)
    assert purges, "librdkafka logged no purge"
    assert all("non-blocking" in m for m in purges), purges
