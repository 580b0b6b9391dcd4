"""``KafkaHandler``: a ``logging.Handler`` that ships JSON records through a LogProducer."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

from logsdk.integrations._sender import JsonSender
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

    Never raises into the application and, with a producer it owns, never blocks a call
    longer than ``max_block_s`` (twice with ``buffer="shm"``: the ring, then memory; a
    borrowed producer applies its own): a record the producer cannot take is counted in
    :attr:`dropped`. Pass an existing ``producer`` (not closed by the handler), or the
    producer arguments (``bootstrap_servers``, ``topic``, ``spool_dir``, ...) to own one, which
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
        # Owning or borrowing the producer, JSON, the re-entrancy guard and the drop
        # count are the same for every adapter: JsonSender does them.
        self._sender = JsonSender(
            producer,
            static_fields=static_fields,
            max_block_s=max_block_s,
            producer_kwargs=producer_kwargs,
        )
        self.producer = self._sender.producer
        self.addFilter(lambda r: not r.name.startswith("logsdk"))

    @property
    def dropped(self) -> int:
        """Records that could not be serialised or sent."""
        return self._sender.dropped

    def emit(self, record: logging.LogRecord) -> None:
        """Serialise and send one record; failures are counted, never raised."""
        try:
            doc = record_to_dict(record, self._sender.host, {})
        except Exception:
            self._sender.drop()
            return
        self._sender.send(doc, key=record.name)

    def flush(self) -> None:
        """Wait (bounded) until sent records are acknowledged or spooled."""
        self._sender.flush(timeout=10.0)

    def close(self) -> None:
        """Close the producer if this handler created it."""
        try:
            self._sender.close()
        finally:
            super().close()


__all__ = ["KafkaHandler", "record_to_dict"]
