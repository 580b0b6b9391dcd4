"""``logsdk tail``: follow a topic and print its JSON log records readably."""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import logging
import os
import re
import sys
import time
import uuid
from typing import IO, Any

from logsdk._cli._common import (
    Subparsers,
    UsageError,
    add_command,
    add_kafka_options,
    err,
    kafka_config,
    positive,
    seconds,
    sigterm_as_interrupt,
)
from logsdk.consumer._kafka import unassign
from logsdk.errors import ConsumerError

#: librdkafka's own log lines, as the producer's (logsdk.producer._client): through
#: Python logging (``logsdk:`` lines on stderr, as ``main()`` configures it).
rdlog = logging.getLogger("logsdk.librdkafka")

_RESET = "\033[0m"
_DIM = "\033[2m"
_COLOURS = {
    "TRACE": "\033[2m",
    "DEBUG": "\033[36m",
    "INFO": "\033[32m",
    "SUCCESS": "\033[32m",
    "NOTICE": "\033[34m",
    "WARN": "\033[33m",
    "WARNING": "\033[33m",
    "ERROR": "\033[31m",
    "CRITICAL": "\033[1;31m",
    "FATAL": "\033[1;31m",
}
# Field names the common JSON log formats use (KafkaHandler, structlog, loguru, ECS, ...).
_TIME_FIELDS = ("timestamp", "time", "@timestamp", "ts")
_LEVEL_FIELDS = ("level", "levelname", "severity", "log.level")
_LOGGER_FIELDS = ("logger", "name", "logger_name")
_MESSAGE_FIELDS = ("message", "msg", "event")
_MULTILINE_FIELDS = ("exception", "exc_info", "stack", "traceback")


def register(sub: Subparsers) -> None:
    """Add ``logsdk tail``."""
    p = add_command(
        sub,
        "tail",
        help="follow a topic, printing JSON log records readably",
        description=(
            "Print the records of a topic as they arrive: JSON log records as "
            "'time LEVEL logger: message key=value ...' (levels in colour on a terminal), "
            "anything else as text. Without --group it reads every partition without "
            "joining a consumer group and commits nothing; with --group it joins that "
            "group and commits what it printed, so the next run resumes there "
            "(--from-beginning then applies only where the group has no offset). "
            "Ctrl-C stops it (exit status 0)."
        ),
        examples="""
            logsdk tail -t app-logs -b localhost:9092
            logsdk tail -t app-logs --from-beginning --grep 'ERROR|timeout' --count 10
            logsdk tail -t app-logs --group oncall-tail --json | jq .value.message
        """,
    )
    p.add_argument("-t", "--topic", required=True, help="topic to follow")
    add_kafka_options(p, bootstrap_required=True)
    p.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the oldest record (default: only new records)",
    )
    p.add_argument("-g", "--group", default=None, help="consumer group to join and commit in")
    p.add_argument(
        "--grep",
        default=None,
        metavar="REGEX",
        help="print only records whose value matches (Python regex)",
    )
    p.add_argument("-i", "--ignore-case", action="store_true", help="--grep ignores case")
    p.add_argument(
        "-n", "--count", type=positive, default=None, help="stop after printing N records"
    )
    p.add_argument(
        "--idle-timeout",
        type=seconds,
        default=None,
        metavar="S",
        help="stop when no record arrived for S seconds",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per record (topic, partition, offset, timestamp, key, "
        "headers, value)",
    )
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour levels: auto = when stdout is a terminal and $NO_COLOR is unset",
    )
    p.set_defaults(func=run)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


#: Control characters (C0 but tab, DEL, C1) shown as escapes: a record's text must never
#: move the cursor, recolour the terminal or start a line that looks like another record.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), *range(127, 160)) if c != 9}
_CONTROL[10] = "\\n"
_CONTROL[13] = "\\r"


def _safe(text: str) -> str:
    return text.translate(_CONTROL)


def _fmt_ts(ms: int | None) -> str:
    if ms is None or ms <= 0:
        return "-"
    try:
        stamp = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    except (OverflowError, ValueError, OSError):  # beyond what datetime can show
        return f"{ms}ms"
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def render(value: bytes | None, ts_ms: int | None, colour: bool) -> str:
    """One record as a human-readable line (plus indented lines for a traceback)."""
    text = _text(value) or ""
    doc: Any = None
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
    if not isinstance(doc, dict):
        return f"{_fmt_ts(ts_ms)} {_safe(text)}"
    used: set[str] = set()

    def take(names: tuple[str, ...]) -> Any:
        for name in names:
            if doc.get(name) is not None:
                used.add(name)
                return doc[name]
        return None

    ts = take(_TIME_FIELDS)
    level = take(_LEVEL_FIELDS)
    if isinstance(level, dict):  # loguru's serialised {"name": ..., "no": ...}
        level = level.get("name")
    logger = take(_LOGGER_FIELDS)
    message = take(_MESSAGE_FIELDS)
    level_text = str(level).upper() if level is not None else "-"
    level_text = _safe(level_text)
    shown_level = f"{level_text:<7}"
    if colour:
        shown_level = f"{_COLOURS.get(level_text, '')}{shown_level}{_RESET}"
    parts = [_safe(str(ts)) if ts is not None else _fmt_ts(ts_ms), shown_level]
    if logger is not None:
        logger = _safe(str(logger))
        parts.append(f"{_DIM}{logger}:{_RESET}" if colour else f"{logger}:")
    parts.append("" if message is None else _safe(str(message)))
    skip = used | set(_MULTILINE_FIELDS) | {"extra"}
    fields = {k: v for k, v in doc.items() if k not in skip}
    extra = doc.get("extra")  # KafkaHandler's and loguru's extra fields, shown inline
    if isinstance(extra, dict):
        fields.update(extra)
    elif extra is not None:
        fields["extra"] = extra
    for k, v in fields.items():
        shown = v if isinstance(v, str) and v and " " not in v else json.dumps(v, default=str)
        k, shown = _safe(str(k)), _safe(shown)
        parts.append(f"{_DIM}{k}={shown}{_RESET}" if colour else f"{k}={shown}")
    line = " ".join(parts)
    for name in _MULTILINE_FIELDS:
        block = doc.get(name)
        if isinstance(block, str) and block.strip():
            line += "\n" + "\n".join("    " + _safe(ln) for ln in block.rstrip().splitlines())
    return line


def _bytes_json(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def as_json(msg: Any) -> str:
    """One record as a JSON line; a JSON value is embedded as an object."""
    value: Any = _bytes_json(msg.value())
    if isinstance(value, str) and value.lstrip().startswith("{"):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    raw_headers = msg.headers() or []
    headers = [[name, _bytes_json(v)] for name, v in raw_headers]
    doc = {
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp": msg.timestamp()[1],
        "key": _bytes_json(msg.key()),
        "headers": headers,
        "value": value,
    }
    return json.dumps(doc, ensure_ascii=False)


def run(args: argparse.Namespace) -> int:
    """Follow the topic until --count, --idle-timeout or Ctrl-C."""
    from confluent_kafka import (
        OFFSET_BEGINNING,
        OFFSET_END,
        Consumer,
        KafkaError,
        KafkaException,
        TopicPartition,
    )

    from logsdk import _fork

    pattern = None
    if args.grep is not None:
        try:
            pattern = re.compile(args.grep, re.IGNORECASE if args.ignore_case else 0)
        except re.error as exc:
            raise UsageError(f"--grep is not a valid regular expression: {exc}") from exc
    out: IO[str] = sys.stdout
    colour = args.color == "always" or (
        args.color == "auto" and out.isatty() and not os.environ.get("NO_COLOR")
    )
    last_error = [""]

    def on_error(error: KafkaError) -> None:
        if str(error) != last_error[0]:
            last_error[0] = str(error)
            err(f"warning: {error.str()}")

    conf: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "error_cb": on_error,
        "session.timeout.ms": 6000,  # the broker minimum: a quick join and a quick leave
    }
    if args.group:
        conf.update({"group.id": args.group, "enable.auto.offset.store": False})
    else:
        # No group membership: a throwaway id, nothing ever committed.
        conf.update({"group.id": f"logsdk-tail-{uuid.uuid4().hex[:8]}"})
        conf["enable.auto.commit"] = False
    conf.update(kafka_config(args))
    conf["logger"] = rdlog
    try:
        consumer = _fork.Consumer(conf)
    except KafkaException as exc:
        raise UsageError(f"bad Kafka setting: {exc}") from exc
    printed = 0
    now = time.monotonic
    idle_since = [now()]
    try:
        if args.group:
            # --idle-timeout counts from the assignment: a group join may take seconds.
            def on_assign(c: Consumer, parts: list[TopicPartition]) -> None:
                idle_since[0] = now()
                c.assign(parts)

            # Each callback assigns or unassigns itself: confluent-kafka's fallback can hang
            # close() for ever (see logsdk.consumer._kafka.unassign).
            consumer.subscribe(
                [args.topic], on_assign=on_assign, on_revoke=lambda c, _: unassign(c)
            )
        else:
            try:
                md = consumer.list_topics(args.topic, timeout=10).topics.get(args.topic)
            except KafkaException as exc:
                if exc.args and exc.args[0].code() in (
                    KafkaError._TRANSPORT,
                    KafkaError._TIMED_OUT,
                ):
                    raise ConsumerError(
                        f"no Kafka broker at {args.bootstrap} answered within 10 s: is it "
                        "running, and is the address right?"
                    ) from exc
                raise
            if md is None or md.error is not None or not md.partitions:
                why = md.error.str() if md is not None and md.error is not None else "no metadata"
                raise ConsumerError(f"topic {args.topic!r} not found ({why})")
            start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
            consumer.assign([TopicPartition(args.topic, p, start) for p in sorted(md.partitions)])
        with sigterm_as_interrupt():
            try:
                while args.count is None or printed < args.count:
                    if args.idle_timeout is not None and now() - idle_since[0] > args.idle_timeout:
                        break
                    msg = consumer.poll(0.2)
                    if msg is None:
                        continue
                    error = msg.error()
                    if error is not None:
                        if error.fatal():
                            raise ConsumerError(f"Kafka consumer failed: {error.str()}")
                        on_error(error)
                        continue
                    idle_since[0] = now()
                    value = msg.value()
                    if pattern is not None and not pattern.search(_text(value) or ""):
                        if args.group:
                            consumer.store_offsets(msg)
                        continue
                    line = as_json(msg) if args.json else render(value, msg.timestamp()[1], colour)
                    out.write(line + "\n")
                    out.flush()
                    printed += 1
                    if args.group:
                        consumer.store_offsets(msg)  # committed only once printed
            except KeyboardInterrupt:
                pass
    except KafkaException as exc:
        raise ConsumerError(f"Kafka call failed: {exc}") from exc
    finally:
        consumer.close()
    return 0
