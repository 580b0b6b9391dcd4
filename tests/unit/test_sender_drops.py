"""What the logging adapters drop is said, not only counted (``JsonSender.drop``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.integrations import _sender
from logsdk.integrations._sender import JsonSender


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "logsdk.integrations"]


@pytest.fixture
def closed(tmp_path: Path) -> JsonSender:
    """A sender over a closed producer (nothing to connect to): every send() is refused."""
    p = LogProducer("127.0.0.1:9", "t", tmp_path)
    p.close(0)
    return JsonSender(p, static_fields=None, max_block_s=0.1, producer_kwargs={})


def test_the_first_drop_is_said_at_once_the_next_ones_within_the_interval_counted(
    closed: JsonSender, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "logsdk.integrations")
    for _ in range(3):
        assert closed.send({"message": "x"}, key=None) is None
    assert closed.dropped == 3
    said = _said(caplog)
    assert len(said) == 1, said
    assert said[0].startswith("logsdk: 1 log record(s) not sent to Kafka (1 in all")
    assert "ProducerClosedError" in said[0]


def test_a_drop_after_the_interval_says_how_many_went_unsaid(
    closed: JsonSender, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, "logsdk.integrations")
    closed.send({"message": "x"}, key=None)  # said
    closed.send({"message": "x"}, key=None)  # within the interval: counted only
    monkeypatch.setattr(_sender, "DROP_WARN_INTERVAL_S", 0.0)
    closed.drop(why="a reason of the caller's")  # the interval set then (10 s) has not passed
    assert len(_said(caplog)) == 1
    closed.drop(3, why="handed over, not sent", now=True)  # at close: said at once
    said = _said(caplog)
    assert len(said) == 2, said
    assert "5 log record(s) not sent to Kafka (6 in all" in said[1]
    assert said[1].endswith("the latest because: handed over, not sent")
    closed.drop()  # the interval is 0 now
    assert "1 log record(s) not sent to Kafka (7 in all" in _said(caplog)[2]
    assert closed.dropped == 7


def test_a_log_call_made_while_sending_is_counted_and_said(
    closed: JsonSender, caplog: pytest.LogCaptureFixture
) -> None:
    """A record logged on the thread that is inside send() (a library the producer uses,
    a signal handler) is skipped, not recursed into: counted and said like any drop."""
    caplog.set_level(logging.WARNING, "logsdk.integrations")
    inner: list[bytes | None] = []

    class Reentrant:
        def __str__(self) -> str:  # called by the JSON encoder, inside send()
            inner.append(closed.send({"message": "inner"}, key=None))
            return "outer value"

    closed.send({"message": "outer", "v": Reentrant()}, key=None)
    assert inner == [None]
    assert closed.dropped == 2  # the inner one, then the outer (the producer is closed)
    said = _said(caplog)
    assert len(said) == 1
    assert "logged while sending a record on the same thread" in said[0]
