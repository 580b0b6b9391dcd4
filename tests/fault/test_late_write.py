"""A broker that stores a produce request after the producer purged it.

Apache Kafka reads nothing more from a connection whose produce request waits in
purgatory (``acks=all`` with a follower in the ISR that is not fetching); once that request
is answered it reads and appends the requests the client sent behind it, even after the
client purged them, closed the connection and sent newer records through a new client
(seen in the chaos run on Apache Kafka: docs/engineering/chaos.md). The proxy's
``hold_produce`` does the same in front of the embedded broker, on demand.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logsdk import LogProducer
from logsdk.spool._codec import ROW_OVERHEAD
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, read_topic
from tests.conftest import FAST, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.fault]

BrokerFactory = Callable[..., EmbeddedBroker]
VALUE = b"v" * 200

#: FAST, and the records sent while the broker holds produce requests in one or two
#: requests however slowly the test's loop runs: at most five requests are in flight
#: (idempotence), and a record behind them would never reach the broker to be held.
LINGERING: dict[str, Any] = {**FAST, "kafka_config": {**FAST["kafka_config"], "linger.ms": 200}}


def test_records_purged_in_flight_and_stored_late_keep_their_order_when_the_spool_is_full(
    broker_factory: BrokerFactory, make_producer: Callable[..., LogProducer], tmp_path: Path
) -> None:
    """Records in flight at a degrade, stored by the broker only after newer records went
    through the next client, are still in send order in the topic, and no record counted
    as dropped arrives: ``when_full="drop_oldest"`` keeps their spooled copies (they are
    replayed first; the late originals are duplicates) and drops newer records instead."""
    broker = broker_factory(proxy=True)
    topic = create_topic(broker.bootstrap_servers, "late-write", 1)
    first, held, more = 100, 200, 400
    # The spool holds 300 records: the held ones fit, the held and the newer not.
    p = _online_after(broker, topic, make_producer, tmp_path, first, room=300)
    broker.hold_produce()
    for _ in range(held):
        p.send(VALUE)
    wait_until(lambda: broker.held_records == held, 30, "every new record held in flight")
    # Probes fail while the broker is paused: the producer degrades (its purge hands the
    # held records back: spooled) and stays DEGRADED while the newer records overflow the
    # spool.
    broker.pause()
    try:
        wait_until(lambda: p.stats()["state"] == "DEGRADED", 30, "the producer degraded")
        for _ in range(more):
            p.send(VALUE)
        wait_until(
            lambda: (s := p.stats())["buffered"] == 0 and s["dropped"] > 0,
            30,
            "the newer records spooled, the spool's overflow dropped",
        )
    finally:
        broker.resume()
    _replayed_then_stored_late(broker, topic, p, late=held, first=first, more=more)


def test_replayed_rows_purged_in_flight_and_stored_late_keep_their_order_when_the_spool_is_full(
    broker_factory: BrokerFactory, make_producer: Callable[..., LogProducer], tmp_path: Path
) -> None:
    """The same for spooled records whose replay was in flight at a degrade: the overflow
    policy keeps their rows (the replay starts again from the spool's first row) and drops
    newer records, so the replayed copies come first and no dropped record arrives."""
    broker = broker_factory(proxy=True)
    topic = create_topic(broker.bootstrap_servers, "late-replay", 1)
    first, spooled, more = 100, 200, 400
    # The spool holds 300 records: the spooled ones fit, those and the newer not.
    p = _online_after(broker, topic, make_producer, tmp_path, first, room=300)
    broker.pause()
    try:
        wait_until(lambda: p.stats()["state"] == "DEGRADED", 30, "the producer degraded")
        for _ in range(spooled):
            p.send(VALUE)
        wait_until(lambda: p.stats()["spool_records"] == spooled, 30, "the records spooled")
        broker.hold_produce()  # the replay's produce requests
    finally:
        broker.resume()
    wait_until(lambda: broker.held_records == spooled, 30, "the whole replay held in flight")
    broker.pause()  # the replay is not acknowledged, probes fail: a degrade
    try:
        wait_until(lambda: p.stats()["state"] == "DEGRADED", 30, "the producer degraded again")
        for _ in range(more):
            p.send(VALUE)
        wait_until(
            lambda: (s := p.stats())["buffered"] == 0 and s["dropped"] > 0,
            30,
            "the newer records spooled, the spool's overflow dropped",
        )
    finally:
        broker.resume()
    _replayed_then_stored_late(broker, topic, p, late=spooled, first=first, more=more)


def _online_after(
    broker: EmbeddedBroker,
    topic: str,
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
    first: int,
    room: int,
) -> LogProducer:
    """A producer whose spool holds ``room`` records of VALUE (``drop_oldest`` past it),
    ONLINE with its ``first`` records acknowledged."""
    p = make_producer(
        broker.bootstrap_servers,
        topic,
        tmp_path,
        **LINGERING,
        spool_max_bytes=room * (len(VALUE) + ROW_OVERHEAD),
        when_full="drop_oldest",
    )
    for _ in range(first):
        p.send(VALUE)
    wait_until(
        lambda: (s := p.stats())["state"] == "ONLINE" and s["acked"] == first,
        30,
        "the first records acknowledged",
    )
    return p


def _replayed_then_stored_late(
    broker: EmbeddedBroker, topic: str, p: LogProducer, *, late: int, first: int, more: int
) -> None:
    """The spool replayed, then the ``late`` records the broker held stored behind it;
    closed: every record once in send order, or counted dropped, never both."""
    wait_until(
        lambda: (
            (s := p.stats())["state"] == "ONLINE" and s["spool_records"] == 0 and s["buffered"] == 0
        ),
        60,
        "the spool replayed",
    )
    stored = len(read_topic(broker.bootstrap_servers, topic))
    broker.release_held()  # the broker now appends the purged requests
    wait_until(
        lambda: len(read_topic(broker.bootstrap_servers, topic)) >= stored + late,
        30,
        "the held records stored",
        step=0.5,
    )
    pid = p.producer_id
    p.close(30)
    stats = p.stats()

    rep = check_delivery(read_topic(broker.bootstrap_servers, topic))
    sent = first + late + more
    assert stats["sent"] == sent
    print(
        f"unique {rep.unique}, duplicates {rep.duplicates}, dropped {stats['dropped']}, "
        f"order violations {rep.order_violations} (first: {rep.order_violators[:5]})"
    )
    assert rep.order_violations == 0
    # Every record is in Kafka or counted dropped, never both.
    assert rep.unique + stats["dropped"] == sent
    assert rep.missing(pid, range(first + late)) == []  # the late records: their copies
