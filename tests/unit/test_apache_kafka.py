"""What the Apache Kafka fixture is made of, checked without starting it: the pom's Kafka
version, and the Docker Compose cluster a user starts (the same version and settings)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from logsdk.errors import ConfigError
from logsdk.testing import KAFKA_VERSION, ApacheKafka
from logsdk.testing._apache import POM, cluster_properties, rack_of

ROOT = Path(__file__).resolve().parents[2]
MAVEN = "{http://maven.apache.org/POM/4.0.0}"


def test_the_pom_fetches_the_kafka_version_the_fixture_names() -> None:
    """apache_kafka/pom.xml and KAFKA_VERSION name the same Apache Kafka release."""
    props = ET.parse(POM).getroot().find(f"{MAVEN}properties")
    assert props is not None
    version = props.find(f"{MAVEN}kafka.version")
    assert version is not None
    assert version.text == KAFKA_VERSION


def test_docker_compose_runs_the_tested_three_node_cluster() -> None:
    """docker/docker-compose.yml: Apache Kafka at KAFKA_VERSION, three combined nodes, one
    rack each, and every setting of the three-node cluster the fault tests ran on."""
    compose = yaml.safe_load((ROOT / "docker" / "docker-compose.yml").read_text())
    services = compose["services"]
    assert sorted(services) == ["kafka-1", "kafka-2", "kafka-3"]
    for node in (1, 2, 3):
        svc = services[f"kafka-{node}"]
        assert svc["image"] == f"apache/kafka:{KAFKA_VERSION}"
        env = {k: str(v) for k, v in svc["environment"].items()}
        assert env["KAFKA_NODE_ID"] == str(node)
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert env["KAFKA_BROKER_RACK"] == rack_of(node)
        # The apache/kafka image maps KAFKA_FOO_BAR to the server property foo.bar.
        for key, value in cluster_properties(3).items():
            var = "KAFKA_" + key.upper().replace(".", "_")
            assert env.get(var) == value, (node, key)


def test_bad_arguments_are_config_errors() -> None:
    """nodes < 1, a bad port or start timeout: ConfigError naming the argument, nothing
    started."""
    with pytest.raises(ConfigError, match="nodes"):
        ApacheKafka(0)
    with pytest.raises(ConfigError, match="port"):
        ApacheKafka(port=70000)
    with pytest.raises(ConfigError, match="start_timeout"):
        ApacheKafka(start_timeout=0)


def test_three_nodes_hold_each_record_on_every_node_and_need_two_in_sync() -> None:
    """Three nodes: replication factor 3 and min.insync.replicas=2 for every topic and the
    internal ones; one node: 1 and 1 (a single node cannot hold more)."""
    three, one = cluster_properties(3), cluster_properties(1)
    assert three["default.replication.factor"] == three["offsets.topic.replication.factor"] == "3"
    assert three["min.insync.replicas"] == three["transaction.state.log.min.isr"] == "2"
    assert one["default.replication.factor"] == one["min.insync.replicas"] == "1"
