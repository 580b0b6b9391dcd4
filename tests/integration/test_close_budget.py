"""close(timeout) returns in about ``timeout`` with Kafka down, and what stays behind in a
slot is reported once, by the producer that left it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.testing import free_port

pytestmark = pytest.mark.integration


def _leave(spool: Path, nowhere: str, n: int) -> int:
    """A producer on ``spool`` sends ``n`` records with Kafka down and closes: they stay in
    its slot. Returns the slot."""
    p = LogProducer(nowhere, "t", spool)
    for i in range(n):
        p.send(b"%d" % i)
    slot = int(p.stats()["slot"])
    p.close(0)
    return slot


@pytest.mark.parametrize("budget", [0.0, 0.5])
def test_close_takes_about_its_timeout_with_leftovers_and_kafka_down(
    tmp_path: Path, budget: float, make_producer: Callable[..., LogProducer]
) -> None:
    """Kafka down; the producer's own slot holds records of an earlier run (it replays them
    first: a client is connecting, a probe may be under way) and another slot, free, holds
    records too (a drain delivers it). close(0) and close(0.5) return within 0.6 s of their
    timeout (they took 2.0 and 3.9 s: a probe and the client's first connection were
    waited out whole)."""
    nowhere = f"127.0.0.1:{free_port()}"
    holder = make_producer(nowhere, "t", tmp_path)  # keeps slot 0 while slot 1 is filled
    assert _leave(tmp_path, nowhere, 10) == 1
    holder.send(b"x")
    holder.close(0)  # slot 0 holds a record too now
    p = LogProducer(nowhere, "t", tmp_path)
    assert p.stats()["slot"] == 0
    assert p.stats()["recovered_at_start"] == 1
    assert p.stats()["draining_slots"] == 1
    t0 = time.monotonic()
    p.close(budget)
    took = time.monotonic() - t0
    assert took < budget + 0.6, took
    assert p.stats()["spool_records"] == 1


def test_each_leftover_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, make_producer: Callable[..., LogProducer]
) -> None:
    """Records a process left in its slot (Kafka down) are reported by that process's
    close(); the producers that start after it, try to deliver them and close with Kafka
    still down (a pool's workers, one after another) do not report them again."""
    nowhere = f"127.0.0.1:{free_port()}"
    holder = make_producer(nowhere, "t", tmp_path)
    with caplog.at_level(logging.WARNING, logger="logsdk.producer"):
        assert _leave(tmp_path, nowhere, 10) == 1
        holder.close(0)
        for _ in range(4):
            LogProducer(nowhere, "t", tmp_path).close(0.3)
    about_slot_1 = [r for r in caplog.records if "slots/1" in r.getMessage()]
    assert len(about_slot_1) == 1, [r.getMessage() for r in about_slot_1]
    assert about_slot_1[0].getMessage().startswith("close(): 10 record(s) not delivered")
