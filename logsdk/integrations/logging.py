"""``KafkaHandler``: a ``logging.Handler`` that ships JSON records through a LogProducer."""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket
import threading
from collections.abc import Mapping
from typing import Any

from logsdk.producer import LogProducer

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def record_to_dict(
    record: logging.LogRecord, host: str, static: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON document written for one log record."""
    doc: dict[str, Any] = {
        "timestamp": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(),
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
    extra = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
    if extra:
        doc["extra"] = extra
    if static:
        doc.update(static)
    return doc


class KafkaHandler(logging.Handler):
    """Ship log records as JSON (timestamp, level, logger, message, exception, extra
    fields, host, pid) through a :class:`~logsdk.LogProducer`.

    Never raises into the application and never blocks longer than ``max_block_s``:
    a record the producer cannot take is counted in :attr:`dropped`. Pass an
    existing ``producer`` (not closed by the handler), or the producer arguments
    (``bootstrap_servers``, ``topic``, ``spool_dir``, ...) to own one, which
    ``close()`` closes: usable from ``logging.config.dictConfig``. Records of the
    ``logsdk`` loggers themselves are skipped, so the SDK never logs into itself.
    """

    def __init__(
        self,
        producer: LogProducer | None = None,
        *,
        level: int | str = logging.NOTSET,
        static_fields: Mapping[str, Any] | None = None,
        max_block_s: float = 0.5,
        **producer_kwargs: Any,
    ) -> None:
        super().__init__(level)
        if producer is None:
            producer_kwargs.setdefault("max_block_s", max_block_s)
            producer = LogProducer(**producer_kwargs)
            self._owned = True
        else:
            self._owned = False
        self.producer = producer
        self.static_fields = dict(static_fields or {})
        self.host = socket.gethostname()
        self.dropped = 0
        self._busy = threading.local()
        self.addFilter(lambda r: not r.name.startswith("logsdk"))

    def emit(self, record: logging.LogRecord) -> None:
        """Serialise and send one record; failures are counted, never raised."""
        if getattr(self._busy, "on", False):
            return  # a log call made while sending: never recurse into ourselves
        self._busy.on = True
        try:
            doc = record_to_dict(record, self.host, self.static_fields)
            value = json.dumps(doc, default=str, ensure_ascii=False).encode()
            self.producer.send(value, key=record.name)
        except Exception:
            self.dropped += 1
        finally:
            self._busy.on = False

    def flush(self) -> None:
        """Wait (bounded) until sent records are acknowledged or spooled."""
        self.producer.flush(timeout=10.0)

    def close(self) -> None:
        """Close the producer if this handler created it."""
        try:
            if self._owned:
                self.producer.close()
        finally:
            super().close()


__all__ = ["KafkaHandler", "record_to_dict"]
