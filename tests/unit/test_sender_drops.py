"""What the logging adapters drop is said, not only counted (``JsonSender.drop``)."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.integrations import _sender
from logsdk.integrations._sender import JsonSender
from logsdk.integrations.logging import KafkaHandler
from tests.conftest import exit_codes, wait_until


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


class Unprintable:
    """A value whose ``str()`` raises: the adapters can write no JSON for it (dropped)."""

    def __str__(self) -> str:
        raise ValueError("this value has no text")


#: Children forked while the parent's threads drop records, and how long they all have to
#: make their one log call and leave (a healthy child needs a few milliseconds).
FORKS = 40
CHILDREN_TIMEOUT_S = 20.0


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_a_child_forked_while_other_threads_drop_records_logs_and_counts_its_own(
    tmp_path: Path, background: bool
) -> None:
    """Two threads log records the handler must drop while the main thread forks: every
    child's own log call of such a record returns and is counted (the drop count's lock,
    held by a parent thread at the fork, is never the child's)."""
    p = LogProducer("127.0.0.1:9", "t", tmp_path)
    p.close(0)  # nothing to connect to: the records here are dropped before Kafka anyway
    handler = KafkaHandler(p, background=background, flush_timeout=5.0, close_timeout=1.0)
    logger = logging.getLogger(f"tests.sender.fork.{background}")
    logger.propagate = False
    logger.addHandler(handler)
    stop = threading.Event()

    def drop_records() -> None:
        while not stop.is_set():
            logger.error("%s", Unprintable())  # dropped on this thread, in either mode

    def drops_go_on() -> None:
        n = handler.dropped
        wait_until(lambda: handler.dropped > n + 20, 10, "the threads' drops", 0.001)

    threads = [threading.Thread(target=drop_records) for _ in range(2)]
    for t in threads:
        t.start()
    pids: list[int] = []
    try:
        for _ in range(FORKS):
            drops_go_on()  # each fork falls while the threads drop, a little later each time
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    before = handler.dropped
                    logger.error("the child's", extra={"v": Unprintable()})
                    if background:
                        handler.flush()  # the handler's thread has worked the record
                    counted = handler.dropped == before + 1
                    # 4: the parent's drops are the parent's to count and say.
                    code = 3 if not counted else 4 if before != 0 else 0
                finally:
                    os._exit(code)
            pids.append(pid)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        codes = exit_codes(pids, CHILDREN_TIMEOUT_S)
        logger.removeHandler(handler)
        handler.close()
    assert codes == [0] * FORKS, (
        f"of {FORKS} children, {codes.count(None)} hung in the log call (killed after "
        f"{CHILDREN_TIMEOUT_S} s) and {codes.count(3)} did not count their record (the "
        f"handler's thread still on it after flush_timeout), {codes.count(4)} started "
        f"with the parent's count; exit codes {codes}"
    )
