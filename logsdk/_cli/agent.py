"""``logsdk agent``: drain the shared-memory rings of a spool root to Kafka, in the
foreground, until SIGTERM or Ctrl-C (`logsdk.agent._agent`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType

from logsdk._cli._common import Subparsers, UsageError, add_command, kafka_config, seconds
from logsdk.agent._agent import Agent, AgentConfig
from logsdk.agent._spawn import ENV_KAFKA_CONFIG

log = logging.getLogger("logsdk.agent")


def register(sub: Subparsers) -> None:
    """Add ``logsdk agent``."""
    p = add_command(
        sub,
        "agent",
        help="ship the shm rings of LogProducer(delivery='agent') processes to Kafka",
        description=(
            "Run the host agent in the foreground: find the shared-memory rings of every "
            "LogProducer(delivery='agent') on SPOOL_ROOT (processes appearing and going), "
            "produce their records with one idempotent acks=all client, spool them under "
            "SPOOL_ROOT/agent while Kafka is unreachable and replay them when it is back. "
            "One agent per spool root. SIGTERM or Ctrl-C: stop within --stop-timeout, the "
            "rest left in the rings and spools for the next agent."
        ),
        examples="""
            logsdk agent --spool-root /var/lib/myapp/logsdk --bootstrap-servers kafka:9092
            logsdk agent --spool-root /srv/logs -b k1:9092,k2:9092 -X security.protocol=SSL
        """,
    )
    p.add_argument("--spool-root", required=True, type=Path, help="the producers' spool_dir")
    p.add_argument(
        "-b",
        "--bootstrap-servers",
        "--bootstrap",
        dest="bootstrap",
        required=True,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers",
    )
    p.add_argument(
        "-X",
        dest="kafka_config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka property (repeatable); acks and idempotence are the agent's",
    )
    p.add_argument("--stop-timeout", type=seconds, default=10.0, help="seconds (default 10)")
    p.add_argument(
        "--replay-max-rate",
        type=float,
        default=200_000.0,
        metavar="RECORDS_PER_S",
        help="spooled records replayed per second at most (default 200000)",
    )
    p.add_argument(
        "--stall-timeout",
        type=seconds,
        default=10.0,
        help="records in flight and no acknowledgement for this long: the client is "
        "replaced (default 10)",
    )
    p.add_argument(
        "--trust-uid",
        dest="trusted_uids",
        action="append",
        default=[],
        type=_uid,
        metavar="USER",
        help="also read the rings of this user (a name or a uid; repeatable): for an agent "
        "run as root beside applications of other users",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log what the agent does")
    p.set_defaults(func=_cmd_agent)


def _uid(text: str) -> int:
    """A user name or a numeric uid, as a uid."""
    import pwd

    if text.isdigit():
        return int(text)
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise argparse.ArgumentTypeError(f"no user named {text!r}") from None


def _kafka_config(args: argparse.Namespace) -> dict[str, str | int | float | bool]:
    """$LOGSDK_AGENT_KAFKA_CONFIG (JSON: how a producer that starts an agent passes its
    properties, secrets included, out of the command line), then the -X pairs."""
    conf: dict[str, str | int | float | bool] = {}
    raw = os.environ.get(ENV_KAFKA_CONFIG)
    if raw:
        try:
            found = json.loads(raw)
        except ValueError as exc:
            raise UsageError(f"${ENV_KAFKA_CONFIG} is not JSON: {exc}") from None
        if not isinstance(found, dict):
            raise UsageError(f"${ENV_KAFKA_CONFIG} must hold a JSON object")
        conf.update(found)
    conf.update(kafka_config(args))
    return conf


def _cmd_agent(args: argparse.Namespace) -> int:
    if args.verbose:
        logging.getLogger("logsdk.agent").setLevel(logging.INFO)
    agent = Agent(
        AgentConfig(
            spool_root=args.spool_root,
            bootstrap_servers=args.bootstrap,
            kafka_config=_kafka_config(args),
            replay_max_rate=args.replay_max_rate,
            stall_timeout_s=args.stall_timeout,
            trusted_uids=tuple(args.trusted_uids),
        )
    )
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        agent.start()
        print(f"logsdk agent: draining {args.spool_root}", flush=True)
        while not stop.wait(1.0):
            if not agent.running:  # its thread failed (logged): exit non-zero, to be restarted
                break
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        ok = agent.stop(args.stop_timeout)
    left = agent.stats()
    log.info("logsdk agent stopped: %s", left)
    return 0 if ok and stop.is_set() else 1
