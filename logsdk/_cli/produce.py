"""``logsdk produce``: lines from stdin -> a LogProducer (spooled, replayed, never lost)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logsdk._cli._common import (
    Subparsers,
    UsageError,
    add_command,
    add_kafka_options,
    err,
    kafka_config,
    seconds,
    sigterm_as_interrupt,
)
from logsdk.errors import LogSDKError
from logsdk.spool._status import records_left_by_this_process

if TYPE_CHECKING:
    pass


def default_spool_dir(topic: str) -> Path:
    """``$XDG_CACHE_HOME/logsdk/produce/<topic>`` (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "logsdk" / "produce" / topic


def register(sub: Subparsers) -> None:
    """Add ``logsdk produce``."""
    p = add_command(
        sub,
        "produce",
        help="send lines from stdin to a topic",
        description=(
            "Send each line of stdin as one record through a LogProducer: while Kafka is "
            "unreachable records go to the spool dir and are replayed when it is back. "
            "With --format auto (default) a line holding a JSON object is sent as is and "
            "any other line is wrapped in a JSON log record "
            '{"timestamp", "level", "message", "host"}. '
            "At end of input it waits (up to --timeout) until Kafka acknowledged every "
            "record; records it could not deliver stay in the spool (exit status 1) for "
            "`logsdk spool replay`."
        ),
        examples="""
            echo '{"level": "ERROR", "message": "disk full"}' | logsdk produce -t app-logs
            tail -F /var/log/app.log | logsdk produce -t app-logs -b kafka1:9092 --level INFO
            logsdk produce -t raw-lines --format raw --key host-1 < lines.txt
        """,
    )
    p.add_argument("-t", "--topic", required=True, help="topic to send to")
    add_kafka_options(p, bootstrap_required=True)
    p.add_argument(
        "--spool-dir",
        type=Path,
        default=None,
        help="spool directory, one producer at a time (default: ~/.cache/logsdk/produce/TOPIC)",
    )
    p.add_argument("-k", "--key", default=None, help="key of every record")
    p.add_argument(
        "--key-field",
        default=None,
        metavar="FIELD",
        help="for JSON lines, take the key from this field (falls back to --key)",
    )
    p.add_argument(
        "--format",
        choices=("auto", "json", "raw"),
        default="auto",
        help="auto: JSON objects as is, other lines wrapped; json: only JSON objects "
        "(others reported, skipped, exit 1); raw: every line as is",
    )
    p.add_argument("--level", default="INFO", help="level of wrapped lines (default INFO)")
    p.add_argument(
        "--timeout",
        type=seconds,
        default=30.0,
        help="seconds to wait at the end for Kafka's acknowledgements (default 30)",
    )
    p.set_defaults(func=run)


def _wrap(text: str, level: str, host: str) -> bytes:
    doc = {
        "timestamp": dt.datetime.now(dt.timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "level": level,
        "message": text,
        "host": host,
    }
    return json.dumps(doc, ensure_ascii=False).encode()


def _as_object(line: bytes) -> dict[str, Any] | None:
    if not line.lstrip().startswith(b"{"):
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def run(args: argparse.Namespace) -> int:
    """Read stdin to its end (or Ctrl-C), send, then wait for delivery."""
    from logsdk.producer import LogProducer  # imported late: --help stays quick

    if not args.topic.strip():
        raise UsageError("--topic must not be empty")
    spool_dir = args.spool_dir or default_spool_dir(args.topic)
    host = socket.gethostname()
    bad = 0
    producer = LogProducer(args.bootstrap, args.topic, spool_dir, kafka_config=kafka_config(args))
    try:
        with sigterm_as_interrupt():
            try:
                for n, raw in enumerate(sys.stdin.buffer, 1):
                    line = raw.rstrip(b"\r\n")
                    if not line.strip():
                        continue
                    key = args.key
                    if args.format == "raw":
                        value = line
                    else:
                        doc = _as_object(line)
                        if doc is not None:
                            value = line.strip()
                            if args.key_field and doc.get(args.key_field) is not None:
                                key = str(doc[args.key_field])
                        elif args.format == "json":
                            bad += 1
                            err(f"line {n} is not a JSON object; skipped")
                            continue
                        else:
                            text = line.decode("utf-8", errors="replace")
                            value = _wrap(text, args.level, host)
                    try:
                        producer.send(value, key=key)
                    except LogSDKError as exc:  # too large, buffer full: report, go on
                        bad += 1
                        err(f"line {n} not sent: {exc}")
            except KeyboardInterrupt:
                err("interrupted; delivering what was read")
            producer.flush(args.timeout)
    finally:
        # flush() had its timeout: what Kafka did not take by then goes to the spool now.
        producer.close(timeout=0)
    s = producer.stats()
    # Read once the producer closed, from every slot it held: its own, and the free slots
    # other processes left that it took over (its stats() count its own slot alone).
    kept = records_left_by_this_process(spool_dir, warn=err)
    lost = int(s["errors"].get("lost_on_close", 0))
    # acked counts the replays of what the spool held at the start too (an earlier run's).
    earlier = int(s["recovered_at_start"])
    also = f" (with {earlier} left in the spool by an earlier run)" if earlier else ""
    print(
        f"logsdk: sent {s['sent']} record(s) to {args.topic}: acknowledged {s['acked']}"
        f"{also}, in spool {kept}, dropped {s['dropped']}, rejected {s['rejected']}",
        file=sys.stderr,
    )
    if lost:
        err(f"{lost} record(s) could not be written to the spool and are lost (see the log)")
    if kept:
        err(
            f"{kept} record(s) not delivered within {args.timeout:g}s are kept in {spool_dir}; "
            f"deliver them with: logsdk spool replay {shlex.quote(str(spool_dir))} -b BOOTSTRAP"
        )
    if kept or lost:
        return 1
    return 1 if bad or s["dropped"] or s["rejected"] else 0
