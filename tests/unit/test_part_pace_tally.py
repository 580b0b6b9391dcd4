"""The replay's pace (``Pace``, a token bucket) on a fake clock, and ``Tally`` from many
threads: each part alone."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from logsdk.producer._counters import Tally
from logsdk.producer._replay import Pace
from tests.unit.producer_parts import FakeClock, fake_clock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return fake_clock(monkeypatch)


def test_the_pace_starts_empty(clock: FakeClock) -> None:
    """A new (or reset) pace allows nothing until time passes."""
    pace = Pace(100.0, 50)
    assert pace.allow(10) == 0
    clock.advance(0.1)
    assert pace.allow(10) == 10
    pace.spent(10)
    clock.advance(5)
    pace.reset()
    assert pace.allow(10) == 0


def test_the_pace_never_allows_more_than_the_burst_or_the_room(clock: FakeClock) -> None:
    """However long the pause, at most ``burst`` go at once, and never more than asked."""
    pace = Pace(1000.0, 50)
    clock.advance(3600)
    assert pace.allow(10_000) == 50
    assert pace.allow(7) == 7
    pace.spent(50)
    assert pace.allow(10_000) == 0
    clock.advance(0.01)  # 10 tokens
    assert pace.allow(10_000) == 10


@pytest.mark.parametrize("step", [0.0013, 0.013, 0.04])
def test_the_pace_allows_rate_times_the_span(clock: FakeClock, step: float) -> None:
    """Taking all it allows, step after step for 10 s, sends rate * 10 records (to one
    record: the fraction carried over), whatever the step (below the burst)."""
    rate, span = 1000.0, 10.0
    pace = Pace(rate, 50)
    sent = 0
    start = clock.now
    while clock.now - start < span - 1e-9:
        clock.advance(step)
        n = pace.allow(1_000_000)
        assert n <= 50
        pace.spent(n)
        sent += n
    assert rate * (clock.now - start) - 1 <= sent <= rate * (clock.now - start)


def test_no_rate_means_no_limit(clock: FakeClock) -> None:
    """``rate=None``: everything asked for goes, at once and always."""
    pace = Pace(None, 5)
    assert pace.allow(1_000_000) == 1_000_000
    pace.spent(1_000_000)
    assert pace.allow(3) == 3


@pytest.fixture
def switch_often() -> Iterator[None]:
    """Threads switch every microsecond: an unguarded ``+=`` would lose counts."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("switch_often")
def test_the_tally_counts_exactly_from_many_threads() -> None:
    """8 threads adding to the same kinds at once, new kinds included (a kind's first
    count goes through Counter.__missing__, where an unguarded ``+=`` loses counts):
    every count is exact."""
    tally = Tally()
    start = threading.Barrier(8)

    def add(i: int) -> None:
        start.wait()
        for k in range(5000):
            tally.add("shared")
            tally.add("by_three", 3)
            tally.add(f"own-{i}")
            tally.add(f"new-{k}")

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert dict(tally) == {
        "shared": 40_000,
        "by_three": 120_000,
        **{f"own-{i}": 5000 for i in range(8)},
        **{f"new-{k}": 8 for k in range(5000)},
    }
