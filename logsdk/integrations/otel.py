"""OpenTelemetry logs to Kafka: a ``LogRecordExporter`` for the OTel Python SDK.

    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from logsdk.integrations.otel import KafkaLogExporter

    provider = LoggerProvider(resource=Resource.create({"service.name": "checkout"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(KafkaLogExporter(
        bootstrap_servers="kafka:9092", topic="otlp_logs", spool_dir="/var/lib/app/otel")))

Each export batch becomes one Kafka record (more when it is larger than
``max_record_bytes``): an OTLP ``ExportLogsServiceRequest``, the payload the OpenTelemetry
Collector's Kafka receiver reads with ``encoding: otlp_proto`` (the default), or
``otlp_json``. The records go through a :class:`~logsdk.LogProducer`: kept in the spool
while Kafka is unreachable and replayed, safe at fork and exit, each with the producer's
``(producer, seq)`` headers.

``export()`` returns ``SUCCESS`` once the producer has accepted the batch (in Kafka, on
its way, or kept on disk); ``FAILURE`` only when the producer refused it (closed, or full
past ``max_block_s``), counted in :attr:`KafkaLogExporter.failed`. ``force_flush()`` waits
until what was exported is durable (in Kafka or the spool); ``shutdown()`` closes a
producer the exporter owns, delivering what Kafka takes within ``close_timeout``.

Reading them back: :func:`decode_otlp` (a LogConsumer's handler), or
``spark_sink.logs.parse_otlp`` in Spark.

Needs the ``otel`` extra: ``pip install 'logsdk[otel]'`` (opentelemetry-sdk and its
OTLP protobuf encoder).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult

from logsdk.errors import ConfigError, LogSDKError
from logsdk.producer import LogProducer
from logsdk.producer._config import check_seconds

log = logging.getLogger("logsdk.integrations.otel")

ENCODINGS = ("otlp_proto", "otlp_json")
#: OTLP/JSON writes these bytes fields as hex strings, not base64 (the OTLP spec).
_HEX_FIELDS = ("traceId", "spanId")


def _convert_ids(node: Any, convert: Callable[[str], str]) -> None:
    """Rewrite, in place, every trace and span id of a JSON document with ``convert``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _HEX_FIELDS and isinstance(value, str):
                node[key] = convert(value)
            else:
                _convert_ids(value, convert)
    elif isinstance(node, list):
        for item in node:
            _convert_ids(item, convert)


def to_otlp_json(request: Any) -> bytes:
    """``request`` (an OTLP protobuf message) in OTLP/JSON: camelCase field names, enums
    as integers, trace and span ids as hex strings (protobuf's JSON writes bytes as
    base64, which OTLP/JSON does not take)."""
    doc = json_format.MessageToDict(request, use_integers_for_enums=True)
    _convert_ids(doc, lambda text: base64.b64decode(text).hex())
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` as Python (bytes stay bytes; an empty value is None)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def _hex(raw: bytes) -> str | None:
    return raw.hex() if raw and any(raw) else None


def decode_otlp(value: bytes, encoding: str = "otlp_proto") -> list[dict[str, Any]]:
    """The log records of one Kafka record written by :class:`KafkaLogExporter`, in order.

    Each is a dict: ``time_unix_nano``, ``observed_time_unix_nano``, ``severity_number``,
    ``severity_text``, ``body`` (a str, or the Python value of a structured body),
    ``attributes`` and ``resource`` (dicts of Python values), ``scope`` and
    ``scope_version``, ``trace_id`` and ``span_id`` (hex, None when not set), ``index``
    (its position in the Kafka record: with the record's (producer, seq) headers it
    names the log record, for dedupe). ``encoding`` as the exporter's. A value that is not
    OTLP raises ``ValueError``.
    """
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceRequest,
    )

    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    request = ExportLogsServiceRequest()
    try:
        if encoding == "otlp_json":
            doc = json.loads(value)
            _convert_ids(doc, lambda text: base64.b64encode(bytes.fromhex(text)).decode())
            json_format.ParseDict(doc, request)
        else:
            request.ParseFromString(value)
    except (DecodeError, json_format.ParseError, ValueError, TypeError) as exc:
        raise ValueError(f"not an OTLP logs request ({encoding}): {exc}") from exc
    out: list[dict[str, Any]] = []
    for rl in request.resource_logs:
        resource = {a.key: _any_value(a.value) for a in rl.resource.attributes}
        for sl in rl.scope_logs:
            for lr in sl.log_records:
                out.append(
                    {
                        "time_unix_nano": lr.time_unix_nano,
                        "observed_time_unix_nano": lr.observed_time_unix_nano,
                        "severity_number": lr.severity_number,
                        "severity_text": lr.severity_text,
                        "body": _any_value(lr.body),
                        "attributes": {a.key: _any_value(a.value) for a in lr.attributes},
                        "resource": resource,
                        "scope": sl.scope.name,
                        "scope_version": sl.scope.version,
                        "trace_id": _hex(lr.trace_id),
                        "span_id": _hex(lr.span_id),
                        "index": len(out),
                    }
                )
    return out


class KafkaLogExporter(LogRecordExporter):
    """An OTel ``LogRecordExporter`` writing OTLP to Kafka through a LogProducer.

    Pass a ``producer`` (not closed by :meth:`shutdown`) or the producer's arguments
    (``bootstrap_servers``, ``topic``, ``spool_dir``, ...) to own one. ``topic`` overrides
    the producer's topic for these records. ``encoding``: ``"otlp_proto"`` (default) or
    ``"otlp_json"``. A batch whose encoding exceeds ``max_record_bytes`` is split into
    several records (a single log record larger than that goes alone, and the producer
    may refuse it: see :meth:`export`).

    Threads: ``export()`` runs on the batch processor's thread; :attr:`exported`,
    :attr:`records` and :attr:`failed` are written there only (read anywhere).
    """

    def __init__(
        self,
        producer: LogProducer | None = None,
        *,
        topic: str | None = None,
        encoding: str = "otlp_proto",
        max_record_bytes: int = 900_000,
        close_timeout: float = 5.0,
        **producer_kwargs: Any,
    ) -> None:
        if encoding not in ENCODINGS:
            raise ConfigError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
        if isinstance(max_record_bytes, bool) or not isinstance(max_record_bytes, int):
            raise ConfigError(f"max_record_bytes must be an int, got {max_record_bytes!r}")
        if max_record_bytes < 1024:
            raise ConfigError(f"max_record_bytes must be at least 1024, got {max_record_bytes}")
        self.close_timeout = check_seconds(close_timeout, "close_timeout")
        if producer is not None and producer_kwargs:
            raise ConfigError(
                "give either a producer or the producer's arguments "
                f"({', '.join(sorted(producer_kwargs))}), not both"
            )
        if producer is None:
            if topic is not None:
                producer_kwargs.setdefault("topic", topic)
            self.producer = LogProducer(**producer_kwargs)
            self._owned = True
            # An app that simply exits still delivers (as the logging adapters): the
            # producer is closed at interpreter exit and at a multiprocessing child's end.
            self.producer._close_at_exit(self.close_timeout)
        else:
            self.producer = producer
            self._owned = False
        self.topic = topic
        self.encoding = encoding
        self.max_record_bytes = max_record_bytes
        #: Log records accepted by the producer, Kafka records made of them, and log
        #: records whose batch the producer refused.
        self.exported = 0
        self.records = 0
        self.failed = 0
        self._shutdown = threading.Event()

    def _encode(self, batch: Sequence[ReadableLogRecord]) -> list[tuple[bytes, int]]:
        """The batch as (payload, log records in it), each payload at most
        ``max_record_bytes`` (the batch halved until they fit) unless one log record
        alone is larger."""
        request = encode_logs(batch)
        if self.encoding == "otlp_json":
            payload = to_otlp_json(request)
        else:
            payload = request.SerializeToString()
        if len(payload) > self.max_record_bytes and len(batch) > 1:
            half = len(batch) // 2
            return self._encode(batch[:half]) + self._encode(batch[half:])
        return [(payload, len(batch))]

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        """Hand the batch to the producer as OTLP records; SUCCESS once all are accepted.

        A part the producer refuses (closed, full past ``max_block_s``, larger than its
        ``max_record_bytes``) is counted in :attr:`failed` and logged; the other parts
        are kept, and the result is FAILURE.
        """
        if self._shutdown.is_set():
            log.warning("export after shutdown: %d log record(s) not exported", len(batch))
            self.failed += len(batch)
            return LogRecordExportResult.FAILURE
        ok = True
        for payload, n in self._encode(batch) if batch else ():
            try:
                self.producer.send(payload, topic=self.topic)
            except LogSDKError as exc:
                ok = False
                self.failed += n
                log.warning("%d log record(s) not exported: %s", n, exc)
                continue
            self.exported += n
            self.records += 1
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """True once every exported record is in Kafka or in the spool (durable)."""
        return self.producer.flush_durable(max(0, timeout_millis) / 1000) == 0

    def shutdown(self) -> None:
        """Refuse further exports; close the producer if the exporter made it."""
        if self._shutdown.is_set():
            return
        self._shutdown.set()
        if self._owned:
            self.producer.close(self.close_timeout)
