"""loguru -> Kafka: a sink that ships each record as JSON through a LogProducer.

Extra ``loguru``:

    from loguru import logger
    from logsdk.integrations.loguru import KafkaSink

    logger.add(KafkaSink(bootstrap_servers="kafka:9092", topic="app-logs",
                         spool_dir="/var/lib/myapp/logsdk"), level="INFO")

The JSON document: ``timestamp``, ``level``, ``logger`` (the module's name), ``message``,
``module``, ``function``, ``line``, ``host``, ``pid``, ``thread``, ``extra`` (from
``bind()``/``contextualize()``, when any) and ``exception`` (the formatted traceback,
when any). The sink never raises into the application: what cannot be sent is
counted in ``dropped``; records logged from the SDK's own modules are not sent.
``logger.remove()`` (loguru also calls it at exit) closes a producer the sink owns.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import Any

from logsdk.integrations._sender import JsonSender, is_sdk_logger
from logsdk.producer import LogProducer


def record_to_dict(record: Mapping[str, Any], host: str) -> dict[str, Any]:
    """The JSON document written for one loguru record."""
    doc: dict[str, Any] = {
        "timestamp": record["time"].isoformat(timespec="milliseconds"),
        "level": record["level"].name,
        "logger": record["name"],
        "message": record["message"],
        "module": record["module"],
        "function": record["function"],
        "line": record["line"],
        "host": host,
        "pid": record["process"].id,
        "thread": record["thread"].name,
    }
    if record["extra"]:
        doc["extra"] = dict(record["extra"])
    exc = record["exception"]
    if exc is not None and exc.type is not None:
        doc["exception"] = "".join(traceback.format_exception(exc.type, exc.value, exc.traceback))
    return doc


class KafkaSink:
    """A loguru sink (``logger.add(KafkaSink(...))``) sending records through a LogProducer.

    Pass a ``producer`` (not closed here) or the LogProducer arguments
    (``bootstrap_servers``, ``topic``, ``spool_dir``, ...) to own one; an owned producer
    waits at most ``max_block_s`` when full. The record key is the logger name.
    ``static_fields`` are added to every document.
    """

    def __init__(
        self,
        producer: LogProducer | None = None,
        *,
        static_fields: Mapping[str, Any] | None = None,
        max_block_s: float = 0.5,
        close_timeout: float = 5.0,
        **producer_kwargs: Any,
    ) -> None:
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

    def write(self, message: Any) -> None:
        """Called by loguru with each formatted message; its ``record`` is what is sent."""
        try:
            record = message.record
            if is_sdk_logger(record["name"]):
                return
            doc = record_to_dict(record, self._sender.host)
        except Exception as exc:
            self._sender.drop(why=exc)
            return
        name = doc["logger"]
        self._sender.send(doc, key=None if name is None else str(name))

    # No ``flush`` attribute on purpose: loguru would call it after every message.
    def drain(self, timeout: float = 10.0) -> int:
        """Wait (bounded) until sent records are in Kafka; returns how many are not."""
        return self._sender.flush(timeout)

    def stop(self) -> None:
        """Called by ``logger.remove()``: close the producer if this sink created it, delivering
        for at most ``close_timeout`` seconds."""
        self._sender.close()

    def __repr__(self) -> str:
        return f"KafkaSink(topic={self.producer.config.topic!r})"


__all__ = ["KafkaSink", "record_to_dict"]
