"""Who may touch a LogProducer's state: checked while tests run (logsdk._owner)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from logsdk import _owner
from logsdk.producer._counters import Tally

pytestmark = pytest.mark.integration


@pytest.fixture
def provoked() -> Iterator[None]:
    """For tests that provoke violations on purpose: the plugin must not report them."""
    yield
    _owner.violations(clear=True)


def test_error_counts_lose_no_increment_across_threads() -> None:
    """The producer's counts (errors, dropped, rejected) are added to from several threads
    (the send path, the pump, the health thread): 8 threads adding 20,000 each to the same
    kind count exactly 160,000 (a bare ``counter[kind] += 1`` can lose increments)."""
    counts = Tally()
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
