"""stats()["possible_duplicates"] is never less than the records that arrive twice."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, read_topic
from tests.conftest import FAST, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]


def test_records_that_arrive_twice_after_a_cut_are_counted(
    broker_factory: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    """A steady send (60,000 records in 3 s) with the network cut twice: batches in flight
    at each cut are put back in librdkafka's queue for a retry and handed back by the
    purge as merely queued, although the broker may have stored them; they are spooled
    and resent. Every record is in Kafka, and ``possible_duplicates`` is at least the
    number that arrived twice (it was 0 while hundreds did)."""
    broker = broker_factory(durable=True, proxy=True)
    topic = create_topic(broker.bootstrap_servers, "dups", 3)
    p = LogProducer(broker.bootstrap_servers, topic, tmp_path, **FAST)
    try:
        for i in range(60_000):
            p.send(b"%d" % i, key=b"%d" % (i % 24))
            if i % 500 == 499:
                time.sleep(0.025)
            if i in (15_000, 40_000):
                broker.cut()
                wait_until(lambda: p.stats()["state"] == "DEGRADED", 30, "degraded by the cut")
                broker.heal()
        assert p.flush(120) == 0
        stats = p.stats()
    finally:
        p.close(5)
    rep = check_delivery(read_topic(broker.bootstrap_servers, topic, timeout=120))
    assert rep.missing(p.producer_id, range(60_000)) == []
    assert stats["possible_duplicates"] >= rep.duplicates, (
        f"{rep.duplicates} arrived twice, {stats['possible_duplicates']} counted; "
        f"errors {stats['errors']}"
    )
