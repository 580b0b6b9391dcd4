"""Replica placement: Kafka's own algorithm, its rack-aware variant, and a consistent-hash ring.

Every planner returns ``{topic: {partition: [broker ids]}}`` with the preferred leader
first; `metrics()` measures balance, leaders, rack violations and movement;
`reassignment_json()` writes what ``kafka-reassign-partitions.sh`` reads:

    from logsdk.placement import Cluster, make_brokers, Topic, plan, metrics

    cluster = Cluster(make_brokers(range(12), racks=["a", "b", "c"]), (Topic("logs", 600, 3),))
    assignment = plan(cluster, "ring")
    print(metrics(assignment, cluster.brokers).max_mean)
"""

from logsdk.placement._admin import apply_plan, check_plan, read_cluster
from logsdk.placement._kafka import kafka_assignment, kafka_rack_assignment, rack_alternated_brokers
from logsdk.placement._metrics import PlacementMetrics, metrics, moved_replicas, rack_violations
from logsdk.placement._model import (
    Assignment,
    Broker,
    Cluster,
    Topic,
    cluster_from_dict,
    load_assignment,
    load_cluster,
    make_brokers,
)
from logsdk.placement._plan import STRATEGIES, Strategy, plan, pool_brokers_by_topic, reconcile
from logsdk.placement._reassign import format_diff, reassignment_json
from logsdk.placement._ring import DEFAULT_LOAD_FACTOR, DEFAULT_VNODES, HashRing, ring_assignment

__all__ = [
    "DEFAULT_LOAD_FACTOR",
    "DEFAULT_VNODES",
    "STRATEGIES",
    "Assignment",
    "Broker",
    "Cluster",
    "HashRing",
    "PlacementMetrics",
    "Strategy",
    "Topic",
    "apply_plan",
    "check_plan",
    "cluster_from_dict",
    "format_diff",
    "kafka_assignment",
    "kafka_rack_assignment",
    "load_assignment",
    "load_cluster",
    "make_brokers",
    "metrics",
    "moved_replicas",
    "plan",
    "pool_brokers_by_topic",
    "rack_alternated_brokers",
    "rack_violations",
    "read_cluster",
    "reassignment_json",
    "reconcile",
    "ring_assignment",
]
