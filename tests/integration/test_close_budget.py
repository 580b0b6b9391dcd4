"""close(timeout) returns in about ``timeout`` with Kafka down, and what stays behind in a
slot is reported once, by the producer that left it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
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
    records too (left alone: no drain while Kafka does not answer). close(0) and close(0.5)
    return within 0.6 s of their timeout (they took 2.0 and 3.9 s: a probe and the
    client's first connection were waited out whole)."""
    nowhere = f"127.0.0.1:{free_port()}"
    holder = make_producer(nowhere, "t", tmp_path)  # keeps slot 0 while slot 1 is filled
    assert _leave(tmp_path, nowhere, 10) == 1
    holder.send(b"x")
    holder.close(0)  # slot 0 holds a record too now
    p = LogProducer(nowhere, "t", tmp_path)
    assert p.stats()["slot"] == 0
    assert p.stats()["recovered_at_start"] == 1
    assert p.stats()["undelivered"] == 11  # slot 1's 10 count, waiting for Kafka
    t0 = time.monotonic()
    p.close(budget)
    took = time.monotonic() - t0
    assert took < budget + 0.6, took
    assert p.stats()["spool_records"] == 1
    assert p.stats()["draining_slots"] == 0


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


# argv: bootstrap (nowhere), spool dir. Kafka down: 3,000 records, then close(5), and a
# SIGALRM handler (a common shutdown pattern) calls close(5) again, 1 s into the first.
_CLOSED_FROM_A_HANDLER = """
import json, signal, sys, time
from logsdk import LogProducer

p = LogProducer(sys.argv[1], "t", sys.argv[2])
for i in range(3000):
    p.send(b"%d" % i)
handler_took = []

def on_alarm(signum, frame):
    t0 = time.monotonic()
    p.close(5)
    handler_took.append(time.monotonic() - t0)

signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 1.0)
t0 = time.monotonic()
p.close(5)
took = time.monotonic() - t0
print(json.dumps({"close_s": took, "handler_s": handler_took,
                  "spooled": p.stats()["spool_records"]}))
"""


def test_close_called_again_by_a_signal_handler_during_close_returns_at_once(
    tmp_path: Path, spawn: Callable[..., subprocess.Popen[str]]
) -> None:
    """Kafka down, 3,000 records sent, the app in close(5); a SIGALRM handler calls close(5)
    on the same thread 1 s in: the handler's call returns at once and the first close
    ends in about its 5 s, all 3,000 records in the spool (the handler's call waited 65 s
    for the close it had interrupted, the app took 67 s)."""
    script = tmp_path / "app.py"
    script.write_text(_CLOSED_FROM_A_HANDLER)
    nowhere = f"127.0.0.1:{free_port()}"
    proc = spawn([sys.executable, str(script), nowhere, str(tmp_path / "spool")],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the app still runs after {time.monotonic() - t0:.0f}s") from None
    assert proc.returncode == 0, err[-3000:]
    got = json.loads(out)
    assert got["spooled"] == 3000
    assert len(got["handler_s"]) == 1, got  # the alarm went off inside close()
    assert got["handler_s"][0] < 0.5, got
    assert 4.5 < got["close_s"] < 6.5, got
