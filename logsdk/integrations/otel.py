"""OpenTelemetry logs to Kafka: a ``LogRecordExporter`` for the OTel Python SDK.

    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from logsdk.integrations.otel import KafkaLogExporter

    provider = LoggerProvider(resource=Resource.create({"service.name": "checkout"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(KafkaLogExporter(
        bootstrap_servers="kafka:9092", topic="otlp_logs", spool_dir="/var/lib/app/otel")))

Each export batch becomes one Kafka record (more when it is larger than
``max_record_bytes``, or than the producer's ``message_max_bytes`` less room for the
record's headers): an OTLP ``ExportLogsServiceRequest``, the payload the OpenTelemetry
Collector's Kafka receiver reads with ``encoding: otlp_proto`` (the default), or
``otlp_json``. Text UTF-8 cannot carry (a lone surrogate: undecodable bytes of a file name
or argv, surrogate-escaped by Python) is written with the escape the JSON adapters use,
``\\udcXX``; a log record OTLP cannot carry even so (a body of an int beyond 64 bits) is
left out of its batch, counted in `KafkaLogExporter.failed` and said on this
module's logger, once per batch. The records go through a [`LogProducer`][logsdk.LogProducer]:
kept in the spool while Kafka is unreachable and replayed, safe at fork and exit, each
with the producer's ``(producer, seq)`` headers.

``export()`` returns ``SUCCESS`` once the producer has accepted the batch (in Kafka, on
its way, or kept on disk); ``FAILURE`` when the producer refused some of it (closed, or
full past ``max_block_s``) or a log record could not be encoded, those log records
counted in `KafkaLogExporter.failed`. ``force_flush()`` waits until what was
exported is durable (in Kafka or the spool); ``shutdown()`` closes a producer the exporter
owns, delivering what Kafka takes within ``close_timeout``.

At exit nothing is lost, whatever the order the app set things up in. Exit hooks run
last-registered first, and which of OTel's (a ``LoggerProvider``'s ``shutdown_on_exit``)
and logsdk's (registered when the exporter's producer is made) runs first depends on
which was made first, which no library can choose after the fact. So neither order is
relied on: logsdk's hook first has every processor that exports to one of its exporters
(and the global ``LoggerProvider``) export what it holds, then closes the exporter's
producer; an export that comes after that (any later exit hook that logs) gets a producer
made again on the same ``spool_dir``, and returns once its records are durable (in Kafka
or the spool); the exporter's ``shutdown()`` closes that producer, delivering within
``close_timeout`` (on Python 3.12.0 and 3.12.1, where no thread starts at interpreter
shutdown, such an export is counted in `KafkaLogExporter.failed` and said).

Reading them back: [`decode_otlp()`][logsdk.integrations.otel.decode_otlp] (a LogConsumer's
handler), or ``spark_sink.logs.parse_otlp`` in Spark.

Needs the ``otel`` extra: ``pip install 'logsdk[otel]'`` (opentelemetry-sdk and its
OTLP protobuf encoder).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import gc
import json
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from logsdk.errors import ConfigError, LogSDKError, ProducerClosedError
from logsdk.integrations._sender import utf8
from logsdk.producer import LogProducer
from logsdk.producer._config import check_seconds
from logsdk.producer._process import close_at_exit, leaving

log = logging.getLogger("logsdk.integrations.otel")

ENCODINGS = ("otlp_proto", "otlp_json")
#: Bytes kept free under the producer's message size limit for what Kafka adds to a value:
#: its framing in a record batch (61 bytes of batch header, at most 36 of record) and the
#: headers the producer adds (``logsdk.producer`` and ``logsdk.seq``: under 100 bytes).
HEADROOM_BYTES = 1024
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


def _unencodable(value: Any) -> bool:
    """True when ``value`` (an OTel ``AnyValue``, or a tuple of them) holds text UTF-8
    cannot carry."""
    if isinstance(value, str):
        if value.isascii():
            return False
        try:
            value.encode()
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, Mapping):
        return any(_unencodable(k) or _unencodable(v) for k, v in value.items())
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return any(_unencodable(v) for v in value)
    return False


def _escape(value: Any) -> Any:
    """``value`` (an OTel ``AnyValue``) with every text in it as `utf8()` writes it."""
    if isinstance(value, str):
        return utf8(value).decode()
    if value is None or isinstance(value, (bytes, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {_escape(k): _escape(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [_escape(v) for v in value]
    return value  # not an AnyValue: the encoder refuses it, escaped or not


def _escaped(record: ReadableLogRecord) -> ReadableLogRecord:
    """``record`` itself when UTF-8 carries all its text, else a copy with its text (body,
    severity text, event name, attributes, scope, resource) as `utf8()` writes it;
    ``record`` is not changed."""
    lr = record.log_record
    attrs = dict(lr.attributes or {})
    scope = record.instrumentation_scope
    scope_text = () if scope is None else (scope.name, scope.version, dict(scope.attributes or {}))
    resource = record.resource
    resource_attrs = dict(resource.attributes)
    own = (lr.body, lr.severity_text, lr.event_name, attrs)
    if not _unencodable((*own, *scope_text, resource_attrs)):
        return record
    lr = copy.copy(lr)
    lr.body = _escape(lr.body)
    lr.severity_text = _escape(lr.severity_text)
    lr.event_name = _escape(lr.event_name)
    attributes = BoundedAttributes(attributes=_escape(attrs), immutable=False)
    attributes.dropped = record.dropped_attributes  # the count OTLP carries, kept
    lr.attributes = attributes
    if scope is not None and _unencodable(scope_text):
        name, version, scope_attrs = _escape(scope_text)
        scope = InstrumentationScope(name, version, scope.schema_url, scope_attrs)
    if _unencodable(resource_attrs):
        resource = Resource(_escape(resource_attrs), resource.schema_url)
    return dataclasses.replace(
        record, log_record=lr, resource=resource, instrumentation_scope=scope
    )


def _encoded(batch: Sequence[ReadableLogRecord]) -> Any:
    """The OTLP request of ``batch``, or None when OTel's encoder refused a log record
    (it raises on text UTF-8 cannot carry in a body, on an int beyond 64 bits) or dropped
    an attribute of one (it does so, and logs it, for such text in an attribute)."""
    try:
        request = encode_logs(batch)
    except Exception:  # the encoder's errors are not typed
        return None
    held = sum(len(lr.attributes) for rl in request.resource_logs
               for sl in rl.scope_logs for lr in sl.log_records)  # fmt: skip
    return request if held == sum(len(r.log_record.attributes or ()) for r in batch) else None


def _hex(raw: bytes) -> str | None:
    return raw.hex() if raw and any(raw) else None


def decode_otlp(value: bytes, encoding: str = "otlp_proto") -> list[dict[str, Any]]:
    """The log records of one Kafka record written by
    [`KafkaLogExporter`][logsdk.integrations.otel.KafkaLogExporter], in order.

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


#: The exporters made in this process (see ``flush_at_exit``).
_EXPORTERS: weakref.WeakSet[KafkaLogExporter] = weakref.WeakSet()


def flush_at_exit() -> None:
    """Run by logsdk's exit hook before it closes any producer: every processor that holds
    a live exporter of ours exports what it holds (a provider made before the exporter
    shuts down at exit only after logsdk's hook; one made with ``shutdown_on_exit=False``
    is flushed by nothing else), then the global ``LoggerProvider``, when it is the SDK's.
    """
    live = [e for e in list(_EXPORTERS) if not e.is_shut_down]
    if not live:
        return
    timeout_ms = int(max(e.close_timeout for e in live) * 1000)
    for exporter in live:
        for processor in _holders(exporter):
            try:
                processor.force_flush(timeout_ms)
            except Exception:  # the others are flushed all the same
                log.exception("flushing an OpenTelemetry processor at exit failed")
    from opentelemetry._logs import get_logger_provider

    flush = getattr(get_logger_provider(), "force_flush", None)
    if callable(flush):
        flush(timeout_ms)


def _holders(exporter: KafkaLogExporter) -> list[Any]:
    """The objects that export to ``exporter`` and can flush: OTel's processors (the
    SDK's batch processor keeps its exporter as ``_exporter``, on itself or on a helper it
    owns). Found through the garbage collector's referrers, at exit only: OTel has no
    registry of processors, and a provider made before the exporter is shut down (and its
    processor flushed) only after logsdk's exit hook has closed the producer."""
    out: list[Any] = []
    for ref in gc.get_referrers(exporter):
        # Python 3.10 reports an instance's __dict__, later ones the instance itself.
        owners = [ref]
        if isinstance(ref, dict):
            owners = [o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref]
        for o in owners:
            if getattr(o, "_exporter", None) is exporter and callable(
                getattr(o, "force_flush", None)
            ):
                out.append(o)
    return out


class KafkaLogExporter(LogRecordExporter):
    """An OTel ``LogRecordExporter`` writing OTLP to Kafka through a LogProducer.

    Pass a ``producer`` (not closed by
    [`shutdown()`][logsdk.integrations.otel.KafkaLogExporter.shutdown]) or the producer's arguments
    (``bootstrap_servers``, ``topic``, ``spool_dir``, ...) to own one. ``topic`` overrides the
    producer's topic for these records. ``encoding``: ``"otlp_proto"`` (default) or ``"otlp_json"``.
    A batch whose encoding exceeds ``max_record_bytes``, or the producer's ``message_max_bytes``
    (its ``kafka_config["message.max.bytes"]`` when that is lower) less `HEADROOM_BYTES` for the
    record's framing and headers, is split into several records (a single log record larger than
    that goes alone, and the producer may refuse it: see
    [`export()`][logsdk.integrations.otel.KafkaLogExporter.export]).

    Threads: ``export()`` runs on the batch processor's thread (with
    ``SimpleLogRecordProcessor``, on the thread that emitted); `exported`,
    `records` and `failed` are written there only (read anywhere), and so is
    `producer` once logsdk's exit hook closed an owned one (see the module
    docstring).
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
            self._producer_kwargs = producer_kwargs  # to make it again after the exit hook
            # An app that simply exits still delivers (as the logging adapters): the
            # producer is closed at interpreter exit and at a multiprocessing child's end.
            close_at_exit(self.producer, self.close_timeout)
        else:
            self.producer = producer
            self._owned = False
        self.topic = topic
        self.encoding = encoding
        self.max_record_bytes = max_record_bytes
        # What the producer takes: its own check (send() refuses a value above
        # message_max_bytes) and librdkafka's (message.max.bytes, which a kafka_config may
        # set lower), each counting the headers and framing too.
        cfg = self.producer.config
        limit = cfg.message_max_bytes
        limit = min(limit, int(cfg.kafka_config.get("message.max.bytes", limit)))
        #: Payloads above this are split (unless a single log record): the smaller limit.
        self._split_above = max(1, min(max_record_bytes, limit - HEADROOM_BYTES))
        #: Log records accepted by the producer, Kafka records made of them, and log
        #: records whose batch the producer refused.
        self.exported = 0
        self.records = 0
        self.failed = 0
        # A plain flag, not an Event: a child forked while a thread set an Event would
        # inherit its lock held; reading and writing a bool takes no lock.
        self._shut_down = False
        self._after_exit_hook = False  # self.producer was made after logsdk's exit hook
        _EXPORTERS.add(self)

    def _encode(
        self, batch: Sequence[ReadableLogRecord]
    ) -> tuple[list[tuple[bytes, int]], int, BaseException | None]:
        """The batch as (payload, log records in it) parts, the number of log records left
        out, and the first reason. As it is when OTLP carries it whole; else with text
        UTF-8 cannot carry escaped (`_escaped()`); else each log record is tried alone
        and one OTLP cannot carry is left out."""
        request = _encoded(batch)
        if request is None:
            escaped = [_escaped(r) for r in batch]
            request = _encoded(escaped)
            batch = escaped
        if request is not None:
            return self._split(batch, request), 0, None
        kept: list[ReadableLogRecord] = []
        left, why = 0, None
        for record in batch:
            try:
                encode_logs([record])
            except Exception as exc:  # the encoder's errors are not typed
                left += 1
                why = why or exc
                continue
            kept.append(record)
        return (self._split(kept, encode_logs(kept)) if kept else []), left, why

    def _split(self, batch: Sequence[ReadableLogRecord], request: Any) -> list[tuple[bytes, int]]:
        """``batch`` (encoded as ``request``) as (payload, log records in it), each payload
        within the split limit (the batch halved until they fit) unless one log record
        alone is larger."""
        if self.encoding == "otlp_json":
            payload = to_otlp_json(request)
        else:
            payload = request.SerializeToString()
        if len(payload) > self._split_above and len(batch) > 1:
            half = len(batch) // 2
            return self._split(batch[:half], encode_logs(batch[:half])) + self._split(
                batch[half:], encode_logs(batch[half:])
            )
        return [(payload, len(batch))]

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        """Hand the batch to the producer as OTLP records; SUCCESS once all are accepted.

        A part the producer refuses (closed, full past ``max_block_s``, larger than its
        ``message_max_bytes``) is counted in `failed` and logged; so are the log
        records OTLP cannot carry even escaped (one warning for them all); the other parts
        are kept, and the result is FAILURE.
        """
        if self._shut_down:
            log.warning("export after shutdown: %d log record(s) not exported", len(batch))
            self.failed += len(batch)
            return LogRecordExportResult.FAILURE
        if not batch:
            return LogRecordExportResult.SUCCESS
        try:
            parts, left, why = self._encode(batch)
        except Exception as exc:  # never into OTel: it drops the batch unsaid
            parts, left, why = [], len(batch), exc
        ok = not left
        if left:
            self.failed += left
            log.warning(
                "%d log record(s) not exported (counted in `failed`): OTLP cannot carry them: "
                "%s: %s",
                left,
                type(why).__name__,
                why,
            )
        for payload, n in parts:
            try:
                self._send(payload)
            except LogSDKError as exc:
                ok = False
                self.failed += n
                log.warning("%d log record(s) not exported: %s", n, exc)
                continue
            self.exported += n
            self.records += 1
        if self._after_exit_hook:  # no exit hook of logsdk's is left to close it
            self.producer.flush_durable(self.close_timeout)
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def _send(self, payload: bytes) -> None:
        """Hand one payload to the producer; an owned producer that logsdk's exit hook has
        closed is made again first (see the module docstring)."""
        try:
            self.producer.send(payload, topic=self.topic)
        except ProducerClosedError:
            if not (self._owned and leaving()):
                raise
            try:
                self.producer = LogProducer(**self._producer_kwargs)
            except RuntimeError as exc:  # Python 3.12.0-3.12.1: no thread starts at exit
                raise ProducerClosedError(
                    f"the producer was closed at exit and cannot be made again: {exc}"
                ) from exc
            close_at_exit(self.producer, self.close_timeout)
            self._after_exit_hook = True
            log.debug("export after logsdk's exit hook: producer made again on its spool_dir")
            self.producer.send(payload, topic=self.topic)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """True once every exported record is in Kafka or in the spool (durable)."""
        return self.producer.flush_durable(max(0, timeout_millis) / 1000) == 0

    @property
    def is_shut_down(self) -> bool:
        """True once [`shutdown()`][logsdk.integrations.otel.KafkaLogExporter.shutdown] was called:
        exports are refused."""
        return self._shut_down

    def shutdown(self) -> None:
        """Refuse further exports; close the producer if the exporter made it."""
        if self._shut_down:
            return
        self._shut_down = True
        if self._owned:
            self.producer.close(self.close_timeout)
