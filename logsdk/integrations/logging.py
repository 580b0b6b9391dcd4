"""``KafkaHandler``: a ``logging.Handler`` that ships JSON records through a LogProducer."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from logsdk.errors import ConfigError
from logsdk.integrations._handoff import Handoff
from logsdk.integrations._sender import JsonSender, add_trace_context, trace_context
from logsdk.producer import LogProducer
from logsdk.producer._config import check_seconds

log = logging.getLogger("logsdk.integrations")

#: Records a background handler holds at most, handed over and not yet sent.
BACKGROUND_MAX_RECORDS = 10_000

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


def exception_text(record: logging.LogRecord) -> str | None:
    """The record's formatted traceback (``exc_info``), or its ``exc_text``, or None."""
    if record.exc_info:
        return logging.Formatter().formatException(record.exc_info)
    return record.exc_text or None


def record_to_dict(
    record: logging.LogRecord,
    host: str,
    static: Mapping[str, Any],
    taken: tuple[str, str | None] | None = None,
) -> dict[str, Any]:
    """The JSON document written for one log record. ``taken``: its message and exception
    text as they were at the log call (else they are read from the record now)."""
    message, exception = (record.getMessage(), exception_text(record)) if taken is None else taken
    doc: dict[str, Any] = {
        "timestamp": iso_utc(record.created),
        "level": record.levelname,
        "logger": record.name,
        "message": message,
        "host": host,
        "pid": record.process,
        "thread": record.threadName,
    }
    if exception is not None:
        doc["exception"] = exception
    attrs = vars(record)
    added = attrs.keys() - _STANDARD  # in C; most records have none, or one or two
    if added:
        # A copy made in C, at once: another handler may be setting the record's attributes
        # on the application's thread meanwhile (background mode).
        extra = {k: v for k, v in list(attrs.items()) if k in added and not k.startswith("_")}
        if extra:
            doc["extra"] = extra
    if static:
        doc.update(static)
    return doc


class KafkaHandler(logging.Handler):
    """Ship log records as JSON (timestamp, level, logger, message, exception, extra
    fields, host, pid) through a [`LogProducer`][logsdk.LogProducer].

    Never raises into the application and, with a producer it owns, never blocks a call
    longer than ``max_block_s`` (twice with ``buffer="shm"``: the ring, then memory; a
    borrowed producer applies its own): a record the producer cannot take is counted in
    [`dropped`][logsdk.integrations.logging.KafkaHandler.dropped]. Pass an existing ``producer``
    (not closed by the handler), or the producer arguments (``bootstrap_servers``, ``topic``,
    ``spool_dir``, ...) to own one, which ``close()`` closes: usable from
    ``logging.config.dictConfig``. Records of the ``logsdk`` loggers themselves are skipped, so the
    SDK never logs into itself.

    ``background=True`` keeps the application's thread to what must be taken at the call
    (the message, the exception's text, the OpenTelemetry span) and hands the record to a
    thread of the handler's (``logsdk-handler``), which builds the JSON document and sends
    it, in the order of the calls. A call then costs a few microseconds instead of the
    document's building and the producer's ``send()``; in exchange the record waits in
    this process's memory until that thread sends it (at most ``BACKGROUND_MAX_RECORDS``:
    past them a call waits up to ``max_block_s``, then the record is dropped and counted),
    and ``extra`` values are read on that thread: pass values, not objects changed after
    the call. ``flush()``, ``close()``, the exit and a fork account for handed-over
    records as for the producer's own; it cannot be combined with ``buffer="shm"`` (whose
    records must survive the process: a handed-over one would not).

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
        background: bool = False,
        **producer_kwargs: Any,
    ) -> None:
        super().__init__(level)
        self.flush_timeout = check_seconds(flush_timeout, "flush_timeout")
        cfg = None if producer is None else producer.config
        buffer = producer_kwargs.get("buffer") if cfg is None else cfg.buffer
        delivery = producer_kwargs.get("delivery") if cfg is None else cfg.delivery
        if delivery == "agent":
            buffer = "shm"  # delivery="agent": every record in the ring, as with buffer="shm"
        if background and buffer == "shm":
            raise ConfigError(
                "background=True holds records in this process until its thread sends "
                "them; buffer='shm' keeps them past the process's death: use one or the other"
            )
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
        self._handoff: Handoff | None = None
        if background:
            self._handoff = Handoff(
                self._send_taken,
                bound=BACKGROUND_MAX_RECORDS,
                max_block_s=check_seconds(max_block_s, "max_block_s"),
                name="logsdk-handler",
                close_timeout=self._sender.close_timeout,
                on_left=self._left_unsent,
            )

    @property
    def dropped(self) -> int:
        """Records that could not be serialised or sent."""
        return self._sender.dropped

    def handle(self, record: logging.LogRecord) -> bool:
        """Filter and emit ``record`` (as ``logging.Handler.handle``) without taking the
        handler's lock: [`emit()`][logsdk.integrations.logging.KafkaHandler.emit] is safe on any
        number of threads at once (the producer's send path has its own lock). Records of the SDK's
        own loggers are skipped."""
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
        """Serialise and send one record (or, in background mode, hand it over); failures
        are counted, never raised."""
        handoff = self._handoff
        if handoff is not None:
            why: BaseException | str
            try:
                item = (record, record.getMessage(), exception_text(record), trace_context())
                if handoff.put(item):
                    return
                why = "the handler's thread is closed, or its queue stayed full for max_block_s"
            except Exception as exc:  # an unprintable argument; no thread at shutdown
                why = exc
            self._sender.drop(why=why)
            return
        try:
            doc = record_to_dict(record, self._sender.host, {})
        except Exception as exc:
            self._sender.drop(why=exc)
            return
        self._sender.send(doc, key=record.name)

    def _send_taken(self, item: tuple[logging.LogRecord, str, str | None, Any]) -> None:
        """The hand-over thread: the document of a record handed over, sent."""
        record, message, exception, trace = item
        try:
            doc = record_to_dict(record, self._sender.host, {}, (message, exception))
            if trace is not None:
                add_trace_context(doc, trace)
        except Exception as exc:
            self._sender.drop(why=exc)
            return
        self._sender.send(doc, key=record.name)

    def _left_unsent(self, n: int) -> None:
        """Records handed over that the hand-over thread did not send by close()."""
        if n:
            timeout = self._sender.close_timeout
            why = f"handed to the handler's thread, not sent within close_timeout={timeout} s"
            self._sender.drop(n, why=why, now=True)

    def flush(self) -> None:
        """Wait (at most ``flush_timeout``) until sent records are in Kafka or the spool
        (records handed over first reach the producer)."""
        deadline = time.monotonic() + self.flush_timeout
        if self._handoff is not None:
            self._handoff.drain(self.flush_timeout)
        self._sender.flush_durable(timeout=max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Send what was handed over (background mode), then close the producer if this
        handler created it: deliver for ``close_timeout``."""
        try:
            if self._handoff is not None:
                self._left_unsent(self._handoff.close(self._sender.close_timeout))
            self._sender.close()
        finally:
            super().close()


__all__ = ["BACKGROUND_MAX_RECORDS", "KafkaHandler", "record_to_dict"]
