"""logsdk.placement against a live broker: read the cluster, describe it, and apply's error."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from logsdk.errors import PlacementApplyError, PlacementError
from logsdk.placement import apply_plan, plan, read_cluster
from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = pytest.mark.integration


def test_read_cluster_sees_brokers_and_topic(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """read_cluster returns the brokers and the new topic's current assignment."""
    topic = fresh_topic(3)
    cluster = read_cluster(kafka_broker.bootstrap_servers, topics=[topic])
    ids = {b.id for b in cluster.brokers}
    assert ids
    assert [t.name for t in cluster.topics] == [topic]
    assert sorted(cluster.current[topic]) == [0, 1, 2]
    assert all(set(reps) <= ids for reps in cluster.current[topic].values())


def test_ring_plan_of_live_cluster_is_valid(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """A ring plan made from the live cluster uses only its brokers."""
    topic = fresh_topic(4)
    cluster = read_cluster(kafka_broker.bootstrap_servers, topics=[topic])
    proposed = plan(cluster, "ring")
    ids = {b.id for b in cluster.brokers}
    assert all(set(r) <= ids for r in proposed[topic].values())


def test_apply_gives_the_use_the_json_error(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """apply cannot reassign through confluent-kafka: a PlacementApplyError names Kafka's tool."""
    topic = fresh_topic(2)
    cluster = read_cluster(kafka_broker.bootstrap_servers, topics=[topic])
    with pytest.raises(PlacementApplyError, match=r"kafka-reassign-partitions\.sh"):
        apply_plan(kafka_broker.bootstrap_servers, plan(cluster, "ring"))


def test_apply_names_unknown_broker(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """A plan naming a broker the cluster lacks is refused, naming the broker."""
    topic = fresh_topic(1)
    with pytest.raises(PlacementError, match=r"brokers \[987654\] are not in the cluster"):
        apply_plan(kafka_broker.bootstrap_servers, {topic: {0: [987654]}})


def test_cli_describe_and_apply(kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]) -> None:
    """describe --bootstrap lists the topic; apply exits 1 with the use-the-JSON message."""
    topic = fresh_topic(2)
    cli = [sys.executable, "-m", "logsdk.cli", "placement"]
    boot = ["--bootstrap", kafka_broker.bootstrap_servers]
    out = subprocess.run([*cli, "describe", *boot], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"topic {topic}: 2 partitions" in out.stdout
    out = subprocess.run(
        [*cli, "apply", *boot, "--topics", f"{topic}:2:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "kafka-reassign-partitions.sh" in out.stderr
    assert "Traceback" not in out.stderr
