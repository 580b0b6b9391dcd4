"""What every logging adapter shares: a LogProducer, JSON, and never raising into the app.

Invariants:
- a forked child starts each sender it inherited with a lock of its own and nothing
  counted (the parent's lock may have been held by one of its threads at the fork, and
  the parent says its own drops): a log call in the child never waits for a thread that
  exists only in the parent.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

try:  # the extra `orjson`: the same fields written about ten times faster
    import orjson
except ImportError:  # pragma: no cover - depends on the install
    orjson = None  # type: ignore[assignment]

from logsdk import _fork
from logsdk.producer import LogProducer
from logsdk.producer._config import check_seconds
from logsdk.producer._process import close_at_exit

log = logging.getLogger("logsdk.integrations")

#: A dropped record is said on the ``logsdk.integrations`` logger at most this often (with
#: the count since the last time and the latest reason); every one is counted in ``dropped``.
DROP_WARN_INTERVAL_S = 10.0


def _default(value: object) -> object:
    """A value JSON has no type for: an enum as its value, a tuple subclass (a namedtuple)
    as a list, a float subclass as a float, anything else as ``str(value)``."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


#: One encoder for every record (``json.dumps`` with arguments builds one per call: about
#: 1 µs of a log call here); ``encode()`` keeps no state between calls, so threads share it.
#: Compact, as orjson writes.
ENCODER = json.JSONEncoder(default=_default, ensure_ascii=False, separators=(",", ":"))


def utf8(text: str) -> bytes:
    """``text`` in UTF-8, where a lone surrogate (undecodable bytes of a file name or argv,
    surrogate-escaped by Python), which UTF-8 cannot carry, is written as its escape
    \\udcXX: the one rule of every adapter for such text (in JSON, that escape decodes back
    to the same text; the OpenTelemetry exporter's OTLP strings carry it as written)."""
    return text.encode("utf-8", "backslashreplace")


def dumps_json(doc: Mapping[str, Any]) -> bytes:
    """A document as UTF-8 JSON, with the standard library; lone surrogates as
    `utf8()` writes them."""
    return utf8(ENCODER.encode(doc))


if orjson is not None:
    # Datetimes and dataclasses go to _default (str()), as with json; orjson's own forms
    # of them would change what a field holds depending on the install.
    _ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS

    def dumps_orjson(doc: Mapping[str, Any]) -> bytes:
        """The same fields as `dumps_json()`, with orjson. What orjson refuses (a lone
        surrogate, a key that is not a str, an int beyond 64 bits, nesting deeper than 254)
        is written by `dumps_json()`. One difference: NaN and ±Infinity are written as
        ``null`` (strict JSON), where json writes ``NaN``/``Infinity``."""
        try:
            return orjson.dumps(doc, default=_default, option=_ORJSON_OPTIONS)
        except orjson.JSONEncodeError:
            return dumps_json(doc)


#: What the adapters write a record with: orjson when it is installed, else json.
dumps: Callable[[Mapping[str, Any]], bytes] = dumps_orjson if orjson is not None else dumps_json


def utc_now_iso() -> str:
    """Now, as ISO 8601 UTC with milliseconds (the ``timestamp`` of a record)."""
    now = dt.datetime.now(dt.timezone.utc)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def trace_context() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` (lower-case hex, 32 and 16 digits, as OpenTelemetry writes
    them) of the span active on this thread, when OpenTelemetry is in use; else None.

    Costs one dict lookup when ``opentelemetry.trace`` was never imported (it is not
    imported here)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        ctx = trace.get_current_span().get_span_context()
    except Exception:  # an API too old or broken: the record goes without
        return None
    if ctx.is_valid:
        return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
    return None


def add_trace_context(doc: dict[str, Any], ctx: tuple[str, str] | None = None) -> None:
    """Add ``trace_id`` and ``span_id`` of ``ctx``, or of the span active on this thread
    (see `trace_context()`); fields the record already has are kept."""
    if ctx is None:
        ctx = trace_context()
        if ctx is None:
            return
    doc.setdefault("trace_id", ctx[0])
    doc.setdefault("span_id", ctx[1])


def is_sdk_logger(name: object) -> bool:
    """True for the SDK's own loggers: never shipped, so the SDK never logs into itself."""
    return isinstance(name, str) and (name == "logsdk" or name.startswith("logsdk."))


class JsonSender:
    """Sends dicts as JSON through a producer it owns or borrows; counts what it cannot send.

    ``send`` never raises and never waits longer than ``max_block_s`` (for an owned
    producer); a log call made while sending (from a library the producer uses) is
    skipped rather than recursed into. An owned producer is closed by `close()`, and
    at interpreter exit if nothing closed it before, delivering to Kafka for at most
    ``close_timeout`` seconds (what Kafka cannot take by then stays in the spool).
    """

    def __init__(
        self,
        producer: LogProducer | None,
        *,
        static_fields: Mapping[str, Any] | None,
        max_block_s: float,
        producer_kwargs: dict[str, Any],
        close_timeout: float = 5.0,
    ) -> None:
        self.close_timeout = check_seconds(close_timeout, "close_timeout")
        if producer is None:
            producer_kwargs.setdefault("max_block_s", max_block_s)
            producer = LogProducer(**producer_kwargs)
            self.owned = True
            # An application that simply exits still delivers: exit hooks run while the
            # producer's daemon threads are alive (logging.shutdown() closes a handler too),
            # in a forked or multiprocessing child as well.
            close_at_exit(producer, self.close_timeout)
        else:
            self.owned = False
        self.producer = producer
        self.static_fields = dict(static_fields or {})
        self.host = socket.gethostname()
        self.pid = os.getpid()
        #: Records that could not be serialised or sent (never raised into the app), in
        #: this process (a forked child counts its own from 0).
        self.dropped = 0
        self._busy = threading.local()
        self._count_lock = threading.Lock()
        #: Drops not yet said, and when the next warning may be given (``_count_lock``).
        self._unsaid = 0
        self._warn_at = 0.0
        _LIVE.add(self)

    def drop(
        self, n: int = 1, why: BaseException | str | None = None, *, now: bool = False
    ) -> None:
        """Count ``n`` records not sent (thread-safe: adapters run on many threads), and
        say so on the ``logsdk.integrations`` logger, at most once per
        ``DROP_WARN_INTERVAL_S`` (``now``: at once, as at close) with the count since the
        last warning and ``why``: a log line the application made and Kafka never got is
        never only a counter."""
        with self._count_lock:
            self.dropped += n
            self._unsaid += n
            t = time.monotonic()
            if t < self._warn_at and not now:
                return
            self._warn_at = t + DROP_WARN_INTERVAL_S
            unsaid, self._unsaid, total = self._unsaid, 0, self.dropped
        if isinstance(why, BaseException):
            why = f"{type(why).__name__}: {why}"
        # Outside the lock: a handler of the logsdk loggers may log or block.
        log.warning(
            "logsdk: %d log record(s) not sent to Kafka (%d in all, counted in `dropped`); "
            "the latest because: %s",
            unsaid,
            total,
            why or "not said",
        )

    def send(self, doc: dict[str, Any], key: str | None) -> bytes | None:
        """Serialise and send; returns the JSON sent, or None (``dropped`` + 1) on failure."""
        if getattr(self._busy, "on", False):
            # A log call made while this thread is sending (a signal handler, or a library
            # the producer uses): skipped, not recursed into, and counted.
            self.drop(why="logged while sending a record on the same thread")
            return None
        self._busy.on = True
        try:
            add_trace_context(doc)
            if self.static_fields:
                doc.update(self.static_fields)
            value = dumps(doc)
            self.producer.send(value, key=key)
            return value
        except Exception as exc:
            self.drop(why=exc)
            return None
        finally:
            self._busy.on = False

    def flush(self, timeout: float = 10.0) -> int:
        """Wait (bounded) until sent records are in Kafka; returns how many are not."""
        return self.producer.flush(timeout=timeout)

    def flush_durable(self, timeout: float = 10.0) -> int:
        """Wait (bounded) until sent records are in Kafka or the spool; returns the rest."""
        return self.producer.flush_durable(timeout=timeout)

    def close(self) -> None:
        """Close the producer if this sender created it: deliver for ``close_timeout``."""
        if self.owned:
            self.producer.close(timeout=self.close_timeout)

    def forked(self) -> None:
        """In a forked child (one thread runs): the parent's lock is kept, never freed or
        used (one of its threads may have held it at the fork); a fresh one, and a count
        of the child's own drops."""
        _fork.bury(self._count_lock)
        self._count_lock = threading.Lock()
        self.dropped = 0
        self._unsaid = 0
        self._warn_at = 0.0


#: Every sender alive (a forked child starts the ones it inherited afresh).
_LIVE: weakref.WeakSet[JsonSender] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for sender in list(_LIVE):
        sender.forked()


_fork.at_fork_in_child(_after_fork_in_child)
