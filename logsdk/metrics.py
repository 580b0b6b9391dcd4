"""Prometheus metrics for ``LogProducer.stats()`` and ``LogConsumer.stats()`` (extra ``metrics``).

Every ``stats()`` key is documented here as a counter (only ever grows during the
object's life) or a gauge (a current value), in
[`PRODUCER_METRICS`][logsdk.metrics.PRODUCER_METRICS] and
[`CONSUMER_METRICS`][logsdk.metrics.CONSUMER_METRICS].
[`PrometheusExporter`][logsdk.metrics.PrometheusExporter] serves them over HTTP; its collector calls
``stats()`` at scrape time, so nothing copies numbers in the background and a scrape always sees the
current values:

    from logsdk.metrics import PrometheusExporter

    with PrometheusExporter(producer, consumer, port=9464) as exporter:
        ...   # curl http://127.0.0.1:9464/metrics

Or register the collector in an existing registry (e.g. the default one that
``prometheus_client.start_http_server`` already serves):

    from prometheus_client import REGISTRY
    REGISTRY.register(StatsCollector([producer]))
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from logsdk.errors import ConfigError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

Kind = Literal["counter", "gauge"]
Source = Literal["producer", "consumer"]


@dataclass(frozen=True)
class MetricDoc:
    """How one ``stats()`` key is exported: its kind, shape and meaning.

    ``shape``: ``value`` (a number; None is left out), ``flag`` (1 when truthy),
    ``state`` (one series per value in ``label``, 1 for the current one), ``by`` (a dict:
    one series per key, labelled ``label``), ``len`` (the length of a list), or
    ``label`` (a string put on every series as a label instead of a metric).
    """

    kind: Kind
    help: str
    shape: Literal["value", "flag", "state", "by", "len", "label"] = "value"
    label: str = ""


PRODUCER_METRICS: dict[str, MetricDoc] = {
    "state": MetricDoc(
        "gauge",
        "1 for the current state, 0 for the others",
        "state",
        "ONLINE DEGRADED RECOVERING CLOSED",
    ),
    "producer_id": MetricDoc("gauge", "stable producer id (kept in spool_dir): a label", "label"),
    "sent": MetricDoc("counter", "records accepted by send()"),
    "acked": MetricDoc("counter", "records acknowledged by Kafka (fresh and replayed)"),
    "spooled": MetricDoc("counter", "records committed to the spool"),
    "replayed": MetricDoc("counter", "spooled records acknowledged by Kafka after a replay"),
    "dropped": MetricDoc("counter", "records removed by the when_full policy"),
    "rejected": MetricDoc("counter", "bad records set aside (too large, refused by Kafka)"),
    "buffered": MetricDoc("gauge", "records in memory, neither acknowledged nor spooled"),
    "in_flight": MetricDoc("gauge", "records handed to librdkafka and not yet reported"),
    "spool_records": MetricDoc("gauge", "records the spool holds now"),
    "spool_bytes": MetricDoc("gauge", "bytes the spool holds now (as counted by spool_max_bytes)"),
    "recovered_at_start": MetricDoc("gauge", "records found in the spool when the producer opened"),
    "possible_duplicates": MetricDoc(
        "counter", "records resent that may already be in Kafka: at least those that arrive twice"
    ),
    "unconfirmed_acks": MetricDoc(
        "counter", "records reported delivered without an offset (duplicate sequence): resent"
    ),
    "transitions": MetricDoc("counter", "state changes"),
    "alarm": MetricDoc(
        "gauge", "1 while the spool's disk cannot be used (full, I/O error)", "flag"
    ),
    "spool_corrupt_files": MetricDoc("counter", "corrupt spool files moved aside"),
    "spool_unreadable": MetricDoc(
        "counter", "ids of a damaged spool that could not be read (left in the file set aside)"
    ),
    "retired_clients": MetricDoc(
        "gauge", "replaced librdkafka clients that still owe delivery reports"
    ),
    "next_seq": MetricDoc("gauge", "the logsdk.seq the next record will get"),
    "seq_waits": MetricDoc(
        "counter", "send() calls that waited for seqs to be reserved (0 unless the pump stalls)"
    ),
    "degraded_s": MetricDoc("counter", "seconds spent DEGRADED (spooling) since the start"),
    "slot": MetricDoc("gauge", "the slot of spool_dir this producer holds (one per process)"),
    "draining_slots": MetricDoc(
        "gauge", "slots left by other processes this producer is delivering"
    ),
    "drained": MetricDoc(
        "counter", "records of slots left by other processes its drains got acknowledged"
    ),
    "drain_rejected": MetricDoc(
        "counter", "records of slots left by other processes its drains set aside as refused"
    ),
    "free_slot_records": MetricDoc(
        "gauge",
        "records in slots left by other processes it leaves alone while Kafka does not answer",
    ),
    "undelivered": MetricDoc(
        "gauge",
        "records not yet in Kafka (memory, spool, slots being drained): what flush waits for",
    ),
    "errors": MetricDoc(
        "counter", "errors by kind (librdkafka error names, spool_io, ...)", "by", "kind"
    ),
}

CONSUMER_METRICS: dict[str, MetricDoc] = {
    "state": MetricDoc(
        "gauge", "1 for the current state, 0 for the others", "state", "new running stopped"
    ),
    "error": MetricDoc("gauge", "1 when an error stopped the consumer", "flag"),
    "semantics": MetricDoc("gauge", "at_least_once or exactly_once: a label", "label"),
    "ordering": MetricDoc("gauge", "partition, key or none: a label", "label"),
    "rebalance": MetricDoc("gauge", "eager, cooperative or consumer: a label", "label"),
    "fetched": MetricDoc("counter", "records fetched from Kafka"),
    "processed": MetricDoc("counter", "records the handler finished"),
    "skipped": MetricDoc("counter", "records skipped (already done per the commit metadata)"),
    "retries": MetricDoc("counter", "batch retries after a handler error"),
    "failed_batches": MetricDoc("counter", "batches whose handler raised"),
    "dead_lettered": MetricDoc("counter", "records written to the dead-letter topic"),
    "rollbacks": MetricDoc("counter", "exactly-once batches rolled back"),
    "fenced": MetricDoc("counter", "commits refused as coming from a zombie owner"),
    "rewinds": MetricDoc("counter", "partitions rewound to the stored offsets"),
    "commits": MetricDoc("counter", "offset commits"),
    "commit_errors": MetricDoc("counter", "offset commits that failed"),
    "metadata_truncated": MetricDoc("counter", "commits whose out-of-order metadata was cut"),
    "assignments": MetricDoc("counter", "assignments that gave this member partitions"),
    "revocations": MetricDoc("counter", "revocations that took partitions from this member"),
    "partitions_revoked": MetricDoc("counter", "partitions taken by those revocations"),
    "lost": MetricDoc("counter", "partitions lost (session expired)"),
    "paused": MetricDoc("counter", "times fetching was paused for backpressure"),
    "resumed": MetricDoc("counter", "times fetching resumed"),
    "refetched": MetricDoc(
        "counter", "polled records left out to keep the byte bound (fetched again)"
    ),
    "discarded": MetricDoc("counter", "queued records dropped because their partition was revoked"),
    "queue_size": MetricDoc("gauge", "the queue bound (records)"),
    "queue_depth": MetricDoc("gauge", "records queued for the workers now"),
    "queue_bytes": MetricDoc("gauge", "bytes queued for the workers now"),
    "max_queue_depth": MetricDoc("gauge", "highest queue depth seen"),
    "max_queue_bytes": MetricDoc("gauge", "most record bytes queued at once"),
    "paused_partitions": MetricDoc("gauge", "partitions paused now", "len"),
    "assigned": MetricDoc("gauge", "partitions assigned now", "len"),
    "committed": MetricDoc("gauge", "last committed offset by partition", "by", "partition"),
    "lag": MetricDoc("gauge", "records not yet fetched (high watermark - position)"),
    "committable_lag": MetricDoc("gauge", "records after the oldest unfinished one"),
    "partition_lag": MetricDoc("gauge", "records not yet fetched, by partition", "by", "partition"),
    "metadata_supported": MetricDoc("gauge", "1 when the broker keeps commit metadata", "flag"),
}


class HasStats(Protocol):
    """Anything with a ``stats()`` dict: LogProducer, LogConsumer."""

    def stats(self) -> dict[str, Any]: ...


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "logsdk.metrics needs prometheus_client: pip install 'logsdk[metrics]'"
        ) from exc
    return prometheus_client


def _source_kind(obj: HasStats) -> Source:
    from logsdk.consumer import LogConsumer
    from logsdk.producer import LogProducer

    if isinstance(obj, LogProducer):
        return "producer"
    if isinstance(obj, LogConsumer):
        return "consumer"
    raise ConfigError(f"expected a LogProducer or LogConsumer, got {type(obj).__name__}")


class StatsCollector:
    """A Prometheus collector reading ``stats()`` of producers and consumers at scrape time.

    Series of several sources of one kind are told apart by their labels: a producer
    always has ``producer_id``; give each consumer distinct ``labels`` (e.g. its group).
    """

    def __init__(
        self,
        sources: Sequence[HasStats] = (),
        *,
        labels: Mapping[str, str] | None = None,
        namespace: str = "logsdk",
    ) -> None:
        self.namespace = namespace
        self._sources: list[tuple[HasStats, Source, dict[str, str]]] = []
        for s in sources:
            self.add(s, labels=labels)

    def add(self, source: HasStats, *, labels: Mapping[str, str] | None = None) -> None:
        """Export one more producer or consumer, with constant ``labels``."""
        kind = _source_kind(source)
        fixed = dict(labels or {})
        if kind == "consumer":
            for other, other_kind, other_labels in self._sources:
                if other_kind == "consumer" and other_labels == fixed and other is not source:
                    raise ConfigError(
                        "two consumers with the same labels would export the same series; "
                        "pass distinct labels, e.g. labels={'group': 'billing'}"
                    )
        self._sources.append((source, kind, fixed))

    def describe(self) -> list[Metric]:
        """Nothing up front: the registry then never calls ``stats()`` at registration."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Read every source's ``stats()`` now and yield one family per metric."""
        core = _prometheus().metrics_core
        series: dict[str, tuple[MetricDoc, list[tuple[dict[str, str], float]]]] = {}
        for source, kind, fixed in self._sources:
            docs = PRODUCER_METRICS if kind == "producer" else CONSUMER_METRICS
            stats = source.stats()
            base = dict(fixed)
            for key, doc in docs.items():
                if doc.shape == "label" and stats.get(key) is not None:
                    base[key] = str(stats[key])
            for key, doc in docs.items():
                if doc.shape == "label" or key not in stats:
                    continue
                name = f"{self.namespace}_{kind}_{key}"
                samples = series.setdefault(name, (doc, []))[1]
                samples.extend(({**base, **extra}, v) for extra, v in _samples(doc, stats[key]))
        for name, (doc, samples) in series.items():
            # One label set per family: a label some series lack is empty on those.
            names = sorted({k for labels, _ in samples for k in labels})
            cls = core.CounterMetricFamily if doc.kind == "counter" else core.GaugeMetricFamily
            fam = cls(name, doc.help, labels=names)
            for labels, value in samples:
                fam.add_metric([labels.get(k, "") for k in names], value)
            yield fam


def _samples(doc: MetricDoc, raw: Any) -> list[tuple[dict[str, str], float]]:
    if doc.shape == "value":
        return [] if raw is None else [({}, float(raw))]
    if doc.shape == "flag":
        return [({}, 1.0 if raw else 0.0)]
    if doc.shape == "len":
        return [({}, float(len(raw or ())))]
    if doc.shape == "state":
        return [({"state": st}, 1.0 if st == str(raw) else 0.0) for st in doc.label.split()]
    if doc.shape == "by":
        return [({doc.label: str(k)}, float(v)) for k, v in (raw or {}).items() if v is not None]
    raise AssertionError(doc.shape)  # pragma: no cover


class PrometheusExporter:
    """Serve the metrics of producers and consumers on ``http://addr:port/metrics``.

    Nothing is started by the constructor; [`start()`][logsdk.metrics.PrometheusExporter.start] (or
    ``with``) binds the port (``port=0`` picks a free one, see
    [`port`][logsdk.metrics.PrometheusExporter.port]) and serves from a daemon thread;
    [`close()`][logsdk.metrics.PrometheusExporter.close] stops it. A registry of its own is used
    unless ``registry`` is given.
    """

    def __init__(
        self,
        *sources: HasStats,
        port: int = 0,
        addr: str = "127.0.0.1",
        labels: Mapping[str, str] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port must be 0..65535 (0: any free port), got {port!r}")
        prom = _prometheus()
        self.collector = StatsCollector(sources, labels=labels)
        self.registry: CollectorRegistry = registry or prom.CollectorRegistry(auto_describe=True)
        self.registry.register(self.collector)
        self._addr = addr
        self._port = port
        self._server: WSGIServer | None = None
        self._thread: Any = None

    def add(self, source: HasStats, *, labels: Mapping[str, str] | None = None) -> None:
        """Export one more producer or consumer."""
        self.collector.add(source, labels=labels)

    def start(self) -> PrometheusExporter:
        """Bind the port and serve; returns self."""
        if self._server is None:
            try:
                self._server, self._thread = _prometheus().start_http_server(
                    self._port, self._addr, self.registry
                )
            except OSError as exc:
                raise ConfigError(
                    f"cannot serve metrics on {self._addr}:{self._port}: {exc}"
                ) from exc
        return self

    @property
    def port(self) -> int:
        """The port it serves on (after [`start()`][logsdk.metrics.PrometheusExporter.start])."""
        if self._server is None:
            raise ConfigError("the exporter is not started; call start()")
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        """``http://addr:port/metrics``."""
        return f"http://{self._addr}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port; the registry keeps the collector."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(5.0)

    def __enter__(self) -> PrometheusExporter:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = [
    "CONSUMER_METRICS",
    "PRODUCER_METRICS",
    "MetricDoc",
    "PrometheusExporter",
    "StatsCollector",
]
