"""Property: whatever a caller throws at send(), each call either raises a logsdk error or
the record arrives in Kafka; the process never crashes. Real broker, ONLINE and DEGRADED
(Kafka down while sending, the spool replayed once it is up)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsdk import LogProducer
from logsdk.errors import LogSDKError
from logsdk.testing import EmbeddedBroker, create_topic, free_port, read_topic
from tests.conftest import FAST

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPICS = ("prop-a", "prop.b", "prop_c-1")
# Text with every kind of character, lone surrogates and NUL included.
TEXT = st.text(st.characters(codec=None, categories=None), max_size=20)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
VALUES = st.binary(max_size=64) | TEXT | st.dictionaries(TEXT, JSONISH, max_size=4) | st.none()
HEADERS = st.none() | st.lists(
    st.tuples(TEXT, st.binary(max_size=8) | TEXT | st.none()), max_size=3
)
RECORDS = st.fixed_dictionaries(
    {
        "value": VALUES,
        "key": st.none() | st.binary(max_size=16) | TEXT,
        "headers": HEADERS,
        "topic": st.none() | st.sampled_from(TOPICS) | TEXT,
        "timestamp": st.none() | st.integers(min_value=-10, max_value=1 << 64),
    }
)


def _throw(p: LogProducer, accepted: list[int], topics: set[str]) -> None:
    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(RECORDS)
    def send_one(rec: dict[str, Any]) -> None:
        before = p.stats()["next_seq"]
        try:
            p.send(rec["value"], rec["key"], topic=rec["topic"], headers=rec["headers"],
                   timestamp=rec["timestamp"])  # fmt: skip
        except LogSDKError:
            assert p.stats()["next_seq"] == before  # refused: its seq given back
            return
        accepted.append(before)
        topics.add(rec["topic"] or "prop-default")  # a valid name made up by hypothesis too

    send_one()


def _seqs(bootstrap: str, pid: str, topics: set[str]) -> list[int]:
    seqs = []
    for topic in topics:
        for m in read_topic(bootstrap, topic):
            h = dict(m.headers() or [])
            assert h["logsdk.producer"] == pid.encode()
            seqs.append(int(h["logsdk.seq"]))
    return seqs


def _topics(bootstrap: str) -> None:
    for topic in (*TOPICS, "prop-default"):
        create_topic(bootstrap, topic, 1, exist_ok=True)


def test_any_send_is_refused_or_arrives_online(
    broker_factory: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    """ONLINE: every accepted record arrives, once; every other call raised a logsdk error."""
    broker = broker_factory()
    _topics(broker.bootstrap_servers)
    accepted: list[int] = []
    topics: set[str] = set()
    p = LogProducer(broker.bootstrap_servers, "prop-default", tmp_path, **FAST)
    try:
        _throw(p, accepted, topics)
        assert p.flush(60) == 0
        assert p.stats()["state"] == "ONLINE"
    finally:
        p.close()
    assert accepted, "hypothesis never got a record accepted: the test proved nothing"
    assert sorted(_seqs(broker.bootstrap_servers, p.producer_id, topics)) == accepted


def test_any_send_is_refused_or_arrives_degraded(
    broker_factory: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    """DEGRADED (Kafka down while sending: every accepted record is spooled), then Kafka
    starts and flush() replays: every accepted record arrives, once."""
    port = free_port()
    accepted: list[int] = []
    topics: set[str] = set()
    p = LogProducer(f"127.0.0.1:{port}", "prop-default", tmp_path, **FAST)
    try:
        _throw(p, accepted, topics)
        assert p.flush_durable(30) == 0
        assert p.stats()["state"] == "DEGRADED"
        broker = broker_factory(port=port)
        _topics(broker.bootstrap_servers)
        assert p.flush(60) == 0
    finally:
        p.close()
    assert accepted
    assert sorted(_seqs(broker.bootstrap_servers, p.producer_id, topics)) == accepted
