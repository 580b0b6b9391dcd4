"""``KafkaHandler``: a ``logging.Handler`` that ships JSON records through a LogProducer."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from logsdk.integrations._sender import JsonSender
from logsdk.producer import LogProducer
from logsdk.producer._config import check_seconds

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


#: (second, "YYYY-MM-DDTHH:MM:SS") of the last timestamp written: records of one second
#: share their date and time (formatting them took a quarter of emit()). Replaced whole.
_SECOND: tuple[int, str] = (-1, "")


def iso_utc(created: float) -> str:
    """``created`` (seconds since the epoch) as ``datetime.fromtimestamp(created,
    timezone.utc).isoformat()`` writes it: microseconds rounded half to even, left out
    when zero."""
    global _SECOND
    sec = int(created // 1)
    us = round((created - sec) * 1e6)
    if us >= 1_000_000:
        sec, us = sec + 1, us - 1_000_000
    cached = _SECOND
    if cached[0] != sec:
        cached = _SECOND = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    if us:
        return f"{cached[1]}.{us:06d}+00:00"
    return f"{cached[1]}+00:00"


def record_to_dict(
    record: logging.LogRecord, host: str, static: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON document written for one log record."""
    doc: dict[str, Any] = {
        "timestamp": iso_utc(record.created),
        "level": record.levelname,
        "logger": record.name,
        "message": record.getMessage(),
        "host": host,
        "pid": record.process,
        "thread": record.threadName,
    }
    if record.exc_info:
        doc["exception"] = logging.Formatter().formatException(record.exc_info)
    elif record.exc_text:
        doc["exception"] = record.exc_text
    attrs = vars(record)
    added = attrs.keys() - _STANDARD  # in C; most records have none, or one or two
    if added:
        extra = {k: v for k, v in attrs.items() if k in added and not k.startswith("_")}
        if extra:
            doc["extra"] = extra
    if static:
        doc.update(static)
    return doc


class KafkaHandler(logging.Handler):
    """Ship log records as JSON (timestamp, level, logger, message, exception, extra
    fields, host, pid) through a :class:`~logsdk.LogProducer`.

    Never raises into the application and, with a producer it owns, never blocks a call
    longer than ``max_block_s`` (twice with ``buffer="shm"``: the ring, then memory; a
    borrowed producer applies its own): a record the producer cannot take is counted in
    :attr:`dropped`. Pass an existing ``producer`` (not closed by the handler), or the
    producer arguments (``bootstrap_servers``, ``topic``, ``spool_dir``, ...) to own one, which
    ``close()`` closes: usable from ``logging.config.dictConfig``. Records of the
    ``logsdk`` loggers themselves are skipped, so the SDK never logs into itself.

    At exit, ``logging.shutdown()`` calls ``flush()`` then ``close()``. ``flush()`` makes
    the records durable (acknowledged by Kafka or committed to the spool, at most
    ``flush_timeout`` seconds); ``close()`` delivers an owned producer's records to Kafka,
    the spool included, for at most ``close_timeout`` seconds, and leaves in the spool
    only what Kafka could not take by then. An application that simply exits thus
    delivers what Kafka can take in ``close_timeout`` seconds.
    """

    def __init__(
        self,
        producer: LogProducer | None = None,
        *,
        level: int | str = logging.NOTSET,
        static_fields: Mapping[str, Any] | None = None,
        max_block_s: float = 0.5,
        close_timeout: float = 5.0,
        flush_timeout: float = 5.0,
        **producer_kwargs: Any,
    ) -> None:
        super().__init__(level)
        self.flush_timeout = check_seconds(flush_timeout, "flush_timeout")
        # Owning or borrowing the producer, JSON, the re-entrancy guard and the drop
        # count are the same for every adapter: JsonSender does them.
        self._sender = JsonSender(
            producer,
            static_fields=static_fields,
            max_block_s=max_block_s,
            producer_kwargs=producer_kwargs,
            close_timeout=close_timeout,
        )
        self.producer = self._sender.producer

    @property
    def dropped(self) -> int:
        """Records that could not be serialised or sent."""
        return self._sender.dropped

    def handle(self, record: logging.LogRecord) -> bool:
        """Filter and emit ``record`` (as ``logging.Handler.handle``) without taking the
        handler's lock: :meth:`emit` is safe on any number of threads at once (the
        producer's send path has its own lock). Records of the SDK's own loggers are
        skipped."""
        if record.name.startswith("logsdk"):
            return False
        rv = self.filter(record)
        if isinstance(rv, logging.LogRecord):  # Python 3.12+: a filter may return a record
            record = rv
        if not rv:
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        """Serialise and send one record; failures are counted, never raised."""
        try:
            doc = record_to_dict(record, self._sender.host, {})
        except Exception:
            self._sender.drop()
            return
        self._sender.send(doc, key=record.name)

    def flush(self) -> None:
        """Wait (at most ``flush_timeout``) until sent records are in Kafka or the spool."""
        self._sender.flush_durable(timeout=self.flush_timeout)

    def close(self) -> None:
        """Close the producer if this handler created it: deliver for ``close_timeout``."""
        try:
            self._sender.close()
        finally:
            super().close()


__all__ = ["KafkaHandler", "record_to_dict"]
