"""A producer recovering while the app keeps sending gets back to ONLINE."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, read_topic
from tests.conftest import FAST, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]


def test_a_steady_sender_does_not_keep_the_producer_recovering(
    broker_factory: Callable[..., EmbeddedBroker],
    tmp_path: Path,
    make_producer: Callable[..., LogProducer],
) -> None:
    """5,000 records/s from one thread, a 2 s network cut, a buffer of 2,000 records (its
    half, where the backlog spills to the spool while the spool is replayed, is 0.2 s of
    sending). The spool replayed, the producer is ONLINE again while the sender goes on,
    and stops sending through the disk: it spilled each new record to the spool as fast as
    it replayed it, RECOVERING for as long as the app sent. Every record in Kafka once
    (by producer and seq)."""
    broker = broker_factory(proxy=True)
    topic = create_topic(broker.bootstrap_servers, "steady", 2)
    p = make_producer(broker.bootstrap_servers, topic, tmp_path, buffer_max_records=2000, **FAST)
    stop = threading.Event()
    sent = [0]

    def sender() -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - t0) * 5000)
            while sent[0] < due:
                p.send(b"%d" % sent[0], key=b"%d" % (sent[0] % 16))
                sent[0] += 1
            time.sleep(0.002)

    thread = threading.Thread(target=sender, name="steady-sender")
    thread.start()
    try:
        wait_until(lambda: sent[0] > 5000, 30, "a second of sending")
        broker.cut()
        wait_until(lambda: p.stats()["state"] == "DEGRADED", 30, "degraded by the cut")
        time.sleep(2)  # the outage: records go to the spool
        broker.heal()
        wait_until(lambda: p.stats()["state"] == "RECOVERING", 30, "recovering")
        wait_until(lambda: p.stats()["state"] == "ONLINE", 30, "ONLINE while the app sends")
        spooled = p.stats()["spooled"]
        at = sent[0]
        wait_until(lambda: sent[0] > at + 10_000, 30, "2 s more of sending")
        assert p.stats()["state"] == "ONLINE"
        assert p.stats()["spooled"] == spooled  # nothing through the disk once ONLINE
    finally:
        stop.set()
        thread.join()
    assert p.flush(60) == 0
    rep = check_delivery(read_topic(broker.bootstrap_servers, topic, timeout=120))
    assert rep.missing(p.producer_id, range(sent[0])) == []
