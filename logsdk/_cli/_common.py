"""Helpers shared by the subcommands: parser construction, ``-X`` settings, signals."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
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
    """One line on stderr, prefixed like argparse's own messages."""
    print(f"logsdk: {message}", file=sys.stderr, flush=True)
