"""Who may touch a LogProducer's state: checked while tests run (logsdk._owner)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsdk import LogProducer, _owner
from logsdk.errors import OwnershipError
from logsdk.producer._core import ErrorCounts
from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = pytest.mark.integration


@pytest.fixture
def provoked() -> Iterator[None]:
    """For tests that provoke violations on purpose: the plugin must not report them."""
    yield
    _owner.violations(clear=True)


def test_the_application_thread_cannot_touch_the_pumps_state(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path, provoked: None
) -> None:
    """The spool and the pump's own state belong to the pump thread while it runs: the
    application's thread (here, the test's) is refused at once, naming both threads; the
    producer goes on unharmed, and close() takes both back once the pump has ended."""
    topic = fresh_topic(1)
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p:
        p.send(b"before")
        with pytest.raises(OwnershipError, match="logsdk-pump") as spool_use:
            p._spool.append([(topic, None, b"x", None, 1, 10**9)])
        assert "MainThread" in str(spool_use.value)
        with pytest.raises(OwnershipError, match="logsdk-pump"):
            p._spool_pending()
        with pytest.raises(OwnershipError, match="logsdk-pump"):
            p._settle_spool()
        assert len(_owner.violations(clear=True)) == 3
        p.send(b"after")
        assert p.flush(30) == 0
    assert p._spool.owner.thread is threading.current_thread()
    assert p.stats()["spool_records"] == 0


def test_error_counts_lose_no_increment_across_threads() -> None:
    """The producer's error counts are added to by several threads at once (the send path,
    the pump, the health thread): 8 threads adding 20,000 each to the same kind count
    exactly 160,000 (a bare ``counter[kind] += 1`` can lose increments between threads)."""
    counts = ErrorCounts()
    start = threading.Barrier(8)

    def add() -> None:
        start.wait()
        for _ in range(20_000):
            counts.add("produce_error")

    threads = [threading.Thread(target=add) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert dict(counts) == {"produce_error": 160_000}
