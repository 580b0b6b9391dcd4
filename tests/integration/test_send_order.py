"""Senders that wait for room take their turn in send order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.testing import check_delivery, read_topic
from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = pytest.mark.integration


def test_senders_waiting_for_a_full_buffer_keep_send_order(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
) -> None:
    """A small buffer (16 records, librdkafka's queue too) and 4 threads sending 40 each
    to one partition, with a healthy broker: senders keep waiting for room
    (``when_full="block"``), and every record reaches Kafka once, in seq order. Waiters
    used to append in the order they woke up, and a sender arriving meanwhile went ahead
    of them (order violated in 5 runs of 5)."""
    topic = fresh_topic(1)
    p = make_producer(kafka_broker.bootstrap_servers, topic, tmp_path, buffer_max_records=16)
    first = p.stats()["next_seq"]
    failures: list[BaseException] = []

    def run(t: int) -> None:
        try:
            for i in range(40):
                p.send(b"%d-%d" % (t, i))
        except BaseException as exc:  # every refusal fails the test
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    assert p.flush(30) == 0
    assert p.stats()["seq_waits"] == 0
    rep = check_delivery(read_topic(kafka_broker.bootstrap_servers, topic))
    assert rep.missing(p.producer_id, range(first, first + 160)) == []
    assert rep.order_violations == 0, rep.order_violators[:10]
