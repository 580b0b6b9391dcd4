"""The CLI's folding of repeated lines: librdkafka says the same connection failure each
time it retries; a command says it once, then how many times it came again."""

from __future__ import annotations

import logging

from logsdk._cli._common import RepeatFolder

FAIL = (
    "FAIL [rdkafka#consumer-1] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: "
    "Connect to ipv4#127.0.0.1:1 failed: Connection refused (after {ms}ms in state CONNECT{x})"
)


def test_a_line_that_differs_only_by_its_numbers_is_said_once_then_counted() -> None:
    """The same failure with other timings, librdkafka's own suppression count, or from
    the error callback ("warning: ..." without the client's prefix) is one line."""
    fold = RepeatFolder()
    assert fold.first(FAIL.format(ms=0, x=""))
    assert not fold.first(FAIL.format(ms=17, x=""))
    assert not fold.first(FAIL.format(ms=0, x=", 1 identical error(s) suppressed"))
    assert not fold.first("warning: " + FAIL.format(ms=3, x="").rsplit("]: ", 1)[-1])
    assert fold.first("1/1 brokers are down")  # another line
    (summary,) = fold.summary()
    assert "came 3 more time(s)" in summary
    assert "Connection refused" in summary


def test_a_repeat_after_the_window_is_said_again(monkeypatch: object) -> None:
    """After ``window`` seconds the line comes out again (a long follow says it now and
    then, not only once)."""
    fold = RepeatFolder(window=0.0)
    assert fold.first(FAIL.format(ms=0, x=""))
    assert fold.first(FAIL.format(ms=1, x=""))
    assert fold.summary() == []


def test_as_a_logging_filter_it_folds_what_goes_through_a_handler() -> None:
    """On a handler: the first record passes, its repeats do not."""
    fold = RepeatFolder()
    rec = [
        logging.LogRecord("logsdk.librdkafka", logging.ERROR, __file__, 1, FAIL, None, None)
        for _ in range(3)
    ]
    for r in rec:
        r.msg = FAIL.format(ms=rec.index(r), x="")
    assert [fold.filter(r) for r in rec] == [True, False, False]
