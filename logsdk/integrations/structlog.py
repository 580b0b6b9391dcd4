"""structlog -> Kafka: a processor that tees event dicts to a LogProducer, and a renderer.

Extra ``structlog``. Either keep your console output and tee every event to Kafka:

    import structlog
    from logsdk.integrations.structlog import KafkaProcessor

    kafka = KafkaProcessor(bootstrap_servers="kafka:9092", topic="app-logs",
                           spool_dir="/var/lib/myapp/logsdk")
    structlog.configure(processors=[
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        kafka,                                    # sends a JSON copy, passes the dict on
        structlog.dev.ConsoleRenderer(),
    ])

or end the chain with [`KafkaRenderer`][logsdk.integrations.structlog.KafkaRenderer], which sends
the event and returns its JSON line (``output=False``: drops it, so nothing else prints it).

Both never raise into the application: what cannot be serialised or sent is counted in
``dropped``. Events of the SDK's own loggers (``logger`` starting with ``logsdk``) are
not sent. Keys starting with ``_`` (structlog internals such as ``_record``) are left
out of the JSON; values JSON cannot encode are sent as ``str(value)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from logsdk.integrations import _sender
from logsdk.integrations._sender import JsonSender, is_sdk_logger, utc_now_iso
from logsdk.producer import LogProducer

EventDict = MutableMapping[str, Any]


class KafkaProcessor:
    """A structlog processor that sends a JSON copy of each event and passes it on.

    Pass a ``producer`` (not closed here) or the LogProducer arguments
    (``bootstrap_servers``, ``topic``, ``spool_dir``, ...) to own one, closed by
    [`close()`][logsdk.integrations.structlog.KafkaProcessor.close]; an owned producer waits at most
    ``max_block_s`` when full. The record key is the event's ``key_field`` (default ``logger``;
    None: no key). ``timestamp`` (UTC now) and ``host`` are added when missing, then
    ``static_fields``.
    """

    def __init__(
        self,
        producer: LogProducer | None = None,
        *,
        key_field: str | None = "logger",
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
        self.key_field = key_field

    @property
    def dropped(self) -> int:
        """Events that could not be serialised or sent."""
        return self._sender.dropped

    def send(self, event_dict: EventDict) -> bytes | None:
        """Send one event as JSON; returns what was sent, None if skipped or dropped."""
        record = event_dict.get("_record")  # set by structlog.stdlib.ProcessorFormatter
        name = event_dict.get("logger", getattr(record, "name", None))
        if is_sdk_logger(name):
            return None
        try:
            doc = _public(event_dict)
            if "timestamp" not in doc:
                doc["timestamp"] = utc_now_iso()
            doc.setdefault("host", self._sender.host)
            key = doc.get(self.key_field) if self.key_field else None
            key = None if key is None else str(key)
        except Exception as exc:  # a key or field that will not turn into text
            self._sender.drop(why=exc)
            return None
        return self._sender.send(doc, key)

    def __call__(self, logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
        self.send(event_dict)
        return event_dict

    def flush(self, timeout: float = 10.0) -> int:
        """Wait (bounded) until sent events are in Kafka; returns how many are not."""
        return self._sender.flush(timeout)

    def close(self) -> None:
        """Close the producer if this processor created it: deliver for ``close_timeout``."""
        self._sender.close()


class KafkaRenderer(KafkaProcessor):
    """The last processor: sends the event as JSON, returns that JSON line for the logger.

    With ``output=False`` the event is dropped after sending (``structlog.DropEvent``),
    so the wrapped logger prints nothing.
    """

    def __init__(self, producer: LogProducer | None = None, *, output: bool = True, **kw: Any):
        super().__init__(producer, **kw)
        self.output = output

    def __call__(self, logger: Any, method_name: str, event_dict: EventDict) -> Any:
        sent = self.send(event_dict)
        if not self.output:
            raise structlog.DropEvent
        if sent is None:  # not sent (an SDK event, or a failure): still printed
            try:
                return _sender.dumps(_public(event_dict)).decode()
            except Exception as exc:  # e.g. a value that contains itself: never raised
                return json.dumps({"event": "unserialisable event", "error": repr(exc)})
        return sent.decode()


def _public(event_dict: EventDict) -> dict[str, Any]:
    """The event's fields without structlog's private ones (``_record``...); keys as text."""
    return {k: v for k, v in event_dict.items() if not (isinstance(k, str) and k.startswith("_"))}


__all__ = ["KafkaProcessor", "KafkaRenderer"]
