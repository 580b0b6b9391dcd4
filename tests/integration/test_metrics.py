"""The Prometheus exporter, scraped over HTTP while a producer and a consumer work."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from logsdk import LogConsumer, LogProducer, Record
from logsdk.errors import ConfigError
from logsdk.metrics import CONSUMER_METRICS, PRODUCER_METRICS, PrometheusExporter
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import wait_until

pytestmark = pytest.mark.integration


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``url`` as {(name, labels): value}."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """The one sample called ``name`` whose labels include ``labels``."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_producer_metrics_change_after_sends(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A scrape reads stats() at that moment: sent/acked go from 0 to 25, state ONLINE is 1,
    and every stats() key of the producer is a documented metric."""
    topic = fresh_topic(1)
    with (
        LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p,
        PrometheusExporter(p, port=0, labels={"service": "web"}) as exporter,
    ):
        assert set(p.stats()) == set(PRODUCER_METRICS)
        pid = p.producer_id
        before = scrape(exporter.url)
        assert value(before, "logsdk_producer_sent_total", producer_id=pid, service="web") == 0
        for i in range(25):
            p.send({"level": "INFO", "message": f"m{i}"})
        assert p.flush(10) == 0
        after = scrape(exporter.url)
        assert value(after, "logsdk_producer_sent_total", producer_id=pid) == 25
        assert value(after, "logsdk_producer_acked_total", producer_id=pid) == 25
        assert value(after, "logsdk_producer_buffered", producer_id=pid) == 0
        assert value(after, "logsdk_producer_state", state="ONLINE") == 1
        assert value(after, "logsdk_producer_state", state="DEGRADED") == 0
        assert value(after, "logsdk_producer_alarm", producer_id=pid) == 0


def test_consumer_metrics_follow_processing(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """processed/fetched counters and lag gauges of a running consumer, scraped until they
    show all 30 records; every stats() key of the consumer is a documented metric."""
    topic = fresh_topic(2)
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p:
        for i in range(30):
            p.send(f"r{i}", key=str(i))
        assert p.flush(10) == 0
    seen: list[Record] = []
    conf = dict(kafka_broker.client_config("consumer"))
    consumer = LogConsumer(
        group_id=f"metrics-{topic}", topics=[topic], handler=seen.append, kafka_config=conf
    )
    with PrometheusExporter(consumer, labels={"group": "metrics"}) as exporter:
        before = scrape(exporter.url)
        assert value(before, "logsdk_consumer_processed_total", group="metrics") == 0
        assert value(before, "logsdk_consumer_state", state="new") == 1
        with consumer:

            def processed() -> bool:
                return value(scrape(exporter.url), "logsdk_consumer_processed_total") == 30

            wait_until(processed, 30, "30 records processed, as scraped")
            after = scrape(exporter.url)
            assert value(after, "logsdk_consumer_fetched_total") == 30
            assert value(after, "logsdk_consumer_assigned") == 2
            assert value(after, "logsdk_consumer_state", state="running") == 1
            assert set(consumer.stats()) <= set(CONSUMER_METRICS)
    assert len(seen) == 30


def test_exporter_rejects_what_it_cannot_label_apart(kafka_broker: KafkaTarget) -> None:
    """Two consumers with the same labels would collide: ConfigError, saying what to pass."""
    conf = dict(kafka_broker.client_config("consumer"))
    a = LogConsumer(group_id="a", topics=["t"], handler=print, kafka_config=conf)
    b = LogConsumer(group_id="b", topics=["t"], handler=print, kafka_config=conf)
    with pytest.raises(ConfigError, match="distinct labels"):
        PrometheusExporter(a, b)
    exporter = PrometheusExporter(a, labels={"group": "a"})
    exporter.add(b, labels={"group": "b"})
    with pytest.raises(ConfigError, match="not started"):
        _ = exporter.port


DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "logsdk-grafana.json"


def test_the_grafana_dashboard_queries_only_what_the_exporter_emits(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    tmp_path: Path,
    make_consumer: Callable[..., LogConsumer],
) -> None:
    """Every metric a query of dashboards/logsdk-grafana.json names, and every label it
    groups by, is in a scrape of a working producer and consumer; and every panel has a
    query."""
    import json
    import re

    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dash["panels"] for t in panel["targets"]]
    assert all(panel["targets"] for panel in dash["panels"])
    topic = fresh_topic(2)
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p:
        for i in range(10):
            p.send(f"r{i}", key=str(i))
        assert p.flush(10) == 0
        consumer = make_consumer(
            group_id=f"dash-{topic}", topics=[topic], handler=lambda r: None,
            kafka_config=dict(kafka_broker.client_config("consumer")),
        )  # fmt: skip
        with PrometheusExporter(p, consumer) as exporter, consumer:
            wait_until(
                lambda: value(scrape(exporter.url), "logsdk_consumer_processed_total") == 10,
                30,
                "10 records processed",
            )
            with urllib.request.urlopen(exporter.url, timeout=5) as resp:
                text = resp.read().decode()
    names: set[str] = set()
    labels: set[str] = set()
    for fam in text_string_to_metric_families(text):
        names.add(fam.name + ("_total" if fam.type == "counter" else ""))
        for s in fam.samples:
            labels |= set(s.labels)
    # A family with no sample yet (errors by kind while none happened) is still declared.
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(
                name + ("_total" if kind == "counter" and not name.endswith("_total") else "")
            )
    labels.add("kind")  # the label of errors' series, each named by its kind
    used = {m for e in exprs for m in re.findall(r"\blogsdk_[a-z_]+", e)}
    grouped = {
        label.strip()
        for e in exprs
        for group in re.findall(r"\bby \(([^)]*)\)", e)
        for label in group.split(",")
    }
    assert used - names == set(), f"queries name metrics the exporter does not emit: {used - names}"
    assert grouped - labels == set(), f"queries group by labels no series has: {grouped - labels}"
    assert len(used) >= 20
