"""The ``DiskAlarm`` alone, on a fake clock: raised and logged once, cleared by the kind of
operation that raised it, retried a second later; a damaged database (a real spool with a
page overwritten) rebuilt at most once a minute."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsdk._owner import Owner
from logsdk.errors import SpoolCorruptError, SpoolError
from logsdk.producer._alarm import DiskAlarm
from logsdk.producer._counters import Counters
from logsdk.spool import Spool
from tests.unit.producer_parts import FakeClock, Parts, damage_a_page, fake_clock, parts_factory

OPS = ("write", "settle", "read")


@pytest.fixture
def make_parts(tmp_path: Path) -> Iterator[Callable[..., Parts]]:
    with parts_factory(tmp_path) as make:
        yield make


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return fake_clock(monkeypatch)


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


@pytest.mark.parametrize("op", OPS)
def test_the_alarm_is_raised_once_and_cleared_only_by_the_same_kind_of_op(
    clock: FakeClock, make_parts: Callable[..., Parts], caplog: pytest.LogCaptureFixture, op: str
) -> None:
    """Failures of ``op`` raise the alarm (logged once, each counted); the other kinds of
    operation succeeding leave it up; ``op`` succeeding clears it (logged once)."""
    p = make_parts()
    alarm = p.alarm
    caplog.set_level(logging.INFO, logger="logsdk.producer")
    assert alarm.reason is None
    alarm.failed(SpoolError("disk full"), op)
    alarm.failed(SpoolError("disk still full"), op)
    assert alarm.reason == "disk still full"
    assert p.counters.errors["spool_io"] == 2
    assert len(lines(caplog, logging.ERROR)) == 1
    for other in OPS:
        if other != op:
            alarm.ok(other)
    assert alarm.reason == "disk still full"
    alarm.ok(op)
    assert alarm.reason is None
    alarm.ok(op)
    assert lines(caplog, logging.WARNING) == [f"spool usable again ({op}): disk still full cleared"]
    assert len(lines(caplog, logging.ERROR)) == 1


def test_a_failed_op_is_retried_a_second_after_the_last_failure(
    clock: FakeClock, make_parts: Callable[..., Parts]
) -> None:
    """With the alarm up, the disk is tried again 1 s after the last failure, not before;
    close() may try at once (retry_now)."""
    alarm = make_parts().alarm
    assert alarm.ready()
    alarm.failed(SpoolError("disk full"), "write")
    clock.advance(0.875)  # binary fractions: exact sums
    assert not alarm.ready()
    clock.advance(0.125)
    assert alarm.ready()
    alarm.failed(SpoolError("disk full"), "write")
    assert not alarm.ready()
    clock.advance(0.5)
    alarm.retry_now()
    assert alarm.ready()


def test_a_damaged_database_is_rebuilt_at_most_once_a_minute(
    clock: FakeClock, tmp_path: Path
) -> None:
    """A read finds a damaged page (SpoolCorruptError): the spool is rebuilt from what can
    be read, no alarm; damaged again within a minute, the alarm goes up instead (the disk
    itself fails); a minute after the rebuild, it is rebuilt again."""
    damage_a_page(tmp_path)
    spool = Spool(tmp_path).open()
    counters = Counters()
    errors = counters.errors
    try:
        alarm = DiskAlarm(spool, counters, Owner("the alarm under test"))
        with pytest.raises(SpoolCorruptError) as info:
            spool.read_after(0, 10**6)
        damaged = info.value
        alarm.failed(damaged, "read")
        assert alarm.reason is None
        assert (errors["spool_rebuilt"], errors["spool_io"]) == (1, 0)
        assert spool.corrupt_files_moved == 1
        assert alarm.take_rebuilt()
        assert not alarm.take_rebuilt()
        assert 0 < len(spool.read_after(0, 10**6)) < 3000  # the readable rows, readable
        clock.advance(59.5)
        alarm.failed(damaged, "read")
        assert alarm.reason is not None
        assert (errors["spool_rebuilt"], errors["spool_io"]) == (1, 1)
        assert spool.corrupt_files_moved == 1
        assert not alarm.take_rebuilt()
        clock.advance(0.5)
        alarm.failed(damaged, "read")
        assert (errors["spool_rebuilt"], errors["spool_io"]) == (2, 1)
        assert spool.corrupt_files_moved == 2
        assert alarm.take_rebuilt()
    finally:
        spool.close()
