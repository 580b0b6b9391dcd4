"""A sender that waited for room while the broker stalled is delivered once it is back."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, read_topic
from tests.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.fault]


def test_records_of_senders_that_waited_for_room_are_delivered(
    broker_factory: Callable[..., EmbeddedBroker],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
) -> None:
    """The broker stalls (SIGSTOP) with librdkafka's queue and the backlog full (16 each);
    4 more senders wait for room (``when_full="block"``); the broker comes back. Once the
    pump has fed the backlog to the client it lets send() produce directly again: the
    waiters' records must not stay behind in the backlog. flush() delivers all of them,
    in order (before: flush(5) returned 4 with the producer ONLINE and nothing failing,
    in 4 attempts of 4)."""
    broker = broker_factory()
    topic = create_topic(broker.bootstrap_servers, "waits", 1)
    p = make_producer(
        broker.bootstrap_servers,
        topic,
        tmp_path,
        buffer_max_records=16,
        stall_timeout_s=60,  # the stall is not an outage here: no degrade, no spool
        probe_interval_s=30,
        probe_timeout_s=30,
    )
    first = p.stats()["next_seq"]
    p.send(b"warm")
    assert p.flush(10) == 0
    broker.pause()
    try:
        for i in range(32):  # 16 into librdkafka's queue, 16 into the backlog
            p.send(b"fill-%d" % i)
        waiters = [threading.Thread(target=p.send, args=(b"wait-%d" % k,)) for k in range(4)]
        for t in waiters:
            t.start()
        # Each waiter takes its seq before it waits for room.
        wait_until(lambda: p.stats()["next_seq"] == first + 37, 10, "4 senders waiting")
        assert p.stats()["sent"] == 33
    finally:
        broker.resume()
    for t in waiters:
        t.join(30)
    assert p.stats()["sent"] == 37
    assert p.flush(10) == 0, p.stats()
    stats = p.stats()
    assert stats["state"] == "ONLINE"
    assert stats["transitions"] == 0
    rep = check_delivery(read_topic(broker.bootstrap_servers, topic))
    assert rep.missing(p.producer_id, range(first, first + 37)) == []
    assert rep.order_violations == 0
