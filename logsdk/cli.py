"""The ``logsdk`` command.

Exit codes: 0 success, 1 failure at run time, 2 bad usage. Errors go to stderr
without a traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from logsdk.errors import LogSDKError
from logsdk.placement import _cli as placement_cli
from logsdk.shm import _cli as shm_cli


def _cmd_broker(args: argparse.Namespace) -> int:
    from logsdk.testing import EmbeddedBroker

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with EmbeddedBroker(port=args.port, durable=args.durable) as broker:
        print(broker.bootstrap_servers, flush=True)
        print("embedded broker running; Ctrl-C to stop", file=sys.stderr, flush=True)
        stop.wait()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logsdk",
        description="Operate logsdk: a local broker for development, and more to come.",
        epilog="example: logsdk broker --port 9092",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "broker",
        help="run the embedded Kafka broker in the foreground",
        description="Run the embedded broker (Tansu) and print its bootstrap address.",
        epilog="example: logsdk broker --port 9092 --durable",
    )
    p.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p.add_argument("--durable", action="store_true", help="keep data across broker restarts")
    p.set_defaults(func=_cmd_broker)
    placement_cli.register(sub)
    shm_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``logsdk`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except LogSDKError as exc:
        if args.debug:
            raise
        print(f"logsdk: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
