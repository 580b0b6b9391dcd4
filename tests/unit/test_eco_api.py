"""The public names of logsdk.metrics and the logging adapters are pinned."""

from __future__ import annotations

import logsdk.integrations.loguru
import logsdk.integrations.structlog
import logsdk.metrics


def test_metrics_exports() -> None:
    """logsdk.metrics exports exactly these names."""
    assert sorted(logsdk.metrics.__all__) == [
        "CONSUMER_METRICS",
        "MetricDoc",
        "PRODUCER_METRICS",
        "PrometheusExporter",
        "StatsCollector",
    ]


def test_adapter_exports() -> None:
    """The structlog and loguru adapters export exactly these names."""
    assert sorted(logsdk.integrations.structlog.__all__) == ["KafkaProcessor", "KafkaRenderer"]
    assert sorted(logsdk.integrations.loguru.__all__) == ["KafkaSink", "record_to_dict"]
