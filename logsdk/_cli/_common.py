"""Helpers shared by the subcommands: parser construction, ``-X`` settings, signals."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from logsdk._types import ClientConfig
from logsdk.errors import ConfigError

#: argparse's "subparsers" object (its class is private in the standard library).
Subparsers = Any


class UsageError(ConfigError):
    """A command line that cannot work as given (exit status 2, like argparse's own errors)."""


def add_command(
    sub: Subparsers, name: str, *, help: str, description: str, examples: str
) -> argparse.ArgumentParser:
    """A subcommand parser whose ``--help`` ends with ``examples`` (kept as written)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=description,
        epilog="examples:\n" + textwrap.indent(textwrap.dedent(examples).strip("\n"), "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # SUPPRESS: `logsdk --debug cmd` and `logsdk cmd --debug` both work, neither resets.
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show tracebacks on errors",
    )
    return parser


def add_kafka_options(parser: argparse.ArgumentParser, *, bootstrap_required: bool) -> None:
    """``--bootstrap`` (or $LOGSDK_BOOTSTRAP) and repeatable ``-X key=value``."""
    env = os.environ.get("LOGSDK_BOOTSTRAP")
    parser.add_argument(
        "-b",
        "--bootstrap",
        default=env,
        required=bootstrap_required and not env,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: $LOGSDK_BOOTSTRAP)",
    )
    parser.add_argument(
        "-X",
        dest="kafka_config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka property, e.g. -X security.protocol=SASL_SSL (repeatable)",
    )


def kafka_config(args: argparse.Namespace) -> ClientConfig:
    """The ``-X key=value`` pairs as a librdkafka config dict."""
    out: ClientConfig = {}
    for item in args.kafka_config:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"-X takes KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def seconds(text: str) -> float:
    """argparse type: a duration in seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt like Ctrl-C, so cleanup runs."""

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def err(message: str) -> None:
    """One line on stderr, prefixed like argparse's own messages; a line that only repeats
    one said in the last minute (numbers aside) is folded (`REPEATS`)."""
    if REPEATS.first(message):
        print(f"logsdk: {message}", file=sys.stderr, flush=True)


class RepeatFolder(logging.Filter):
    """Says a line once, then counts its repeats: librdkafka says "Connect ... failed:
    Connection refused" each time it retries (194 lines in 10 s against a broker that was
    down). Two lines are the same when they differ only by their numbers, once the
    client's and thread's names are set aside; the same line comes out again after
    ``window`` seconds with the count of repeats, and `summary()` says what was held
    back when the command ends. As a logging filter it folds what goes through a handler;
    `first()` folds lines printed another way (a client's error callback). One
    command runs on one main thread, but librdkafka's log lines come from its threads:
    the table is guarded by a lock."""

    def __init__(self, window: float = 60.0) -> None:
        super().__init__()
        self.window = window
        self._lock = threading.Lock()
        #: key -> [when last said, repeats since, the text as first said]
        self._seen: dict[str, list[Any]] = {}

    @staticmethod
    def key(text: str) -> str:
        """What two repeats of one line share: the text after librdkafka's
        ``FAC [client] [thread]:`` prefix, its numbers replaced."""
        body = text.rsplit("]: ", 1)[-1].removeprefix("warning: ")
        body = _SUPPRESSED.sub("", body)  # librdkafka's own count of what it held back
        return re.sub(r"\d+", "#", body)

    def first(self, text: str) -> bool:
        """True when ``text`` is to be said now: new, or a repeat after the window (then
        with the count added by `filter()`, or by the caller from `repeats()`)."""
        k = self.key(text)
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(k)
            if seen is None:
                self._seen[k] = [now, 0, text]
                return True
            if now - seen[0] >= self.window:
                seen[0], seen[1] = now, 0
                return True
            seen[1] += 1
            return False

    def filter(self, record: logging.LogRecord) -> bool:
        return self.first(record.getMessage())

    def clear(self) -> None:
        """Forget what was said (after `summary()` was printed)."""
        with self._lock:
            self._seen.clear()

    def summary(self) -> list[str]:
        """One line per folded line still owing its count."""
        with self._lock:
            return [
                f"'{_short(text)}' came {n} more time(s)" for _, n, text in self._seen.values() if n
            ]


def _short(text: str, limit: int = 80) -> str:
    body = text.rsplit("]: ", 1)[-1]
    return body if len(body) <= limit else body[: limit - 3] + "..."


_SUPPRESSED = re.compile(r",? ?\d+ identical error\(s\) suppressed")


#: The command's folder of repeated lines (``main()`` puts it on the log handler).
REPEATS = RepeatFolder()
