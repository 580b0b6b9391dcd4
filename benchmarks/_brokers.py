"""The broker a benchmark measures on: the embedded one (Tansu) or Apache Kafka itself.

Every figure is a ratio against raw confluent-kafka doing the same work on the same
broker in the same run; ``--broker apache`` takes both sides to one Apache Kafka KRaft
node (Java 17+; the jars from Maven, cached), and names the figures ``NAME.apache`` so
that both broker kinds stand side by side in results.json.
"""

from __future__ import annotations

from typing import Any

from logsdk.testing import ApacheKafka, EmbeddedBroker

#: A broker either kind: both have ``bootstrap_servers`` and ``client_config(role)``.
Broker = EmbeddedBroker | ApacheKafka
KINDS = ("embedded", "apache")


def start_broker(kind: str) -> Broker:
    """A broker of ``kind``, not started (use it as a context manager)."""
    return ApacheKafka() if kind == "apache" else EmbeddedBroker()


def on_broker(results: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """``results`` renamed ``NAME.apache`` (and ``params.broker`` set) when measured on
    Apache Kafka."""
    if kind == "apache":
        for r in results:
            r["name"] += ".apache"
            r["params"]["broker"] = "apache"
    return results
