"""The cluster model, bad input, pools, metrics and the reassignment JSON / diff."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import logsdk.placement as placement
from logsdk.errors import ConfigError, PlacementError
from logsdk.placement import (
    Broker,
    Cluster,
    Topic,
    check_plan,
    cluster_from_dict,
    format_diff,
    load_assignment,
    load_cluster,
    make_brokers,
    metrics,
    plan,
    reassignment_json,
    reconcile,
)
from logsdk.placement._model import assignment_from_obj


def test_public_names_are_pinned() -> None:
    """The package exports exactly these names."""
    assert sorted(placement.__all__) == sorted(
        [
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
    )


def test_placement_error_is_a_config_error() -> None:
    """PlacementError is a ConfigError (and so a ValueError)."""
    assert issubclass(PlacementError, ConfigError)
    assert issubclass(PlacementError, ValueError)


@pytest.mark.parametrize("strategy", ["kafka", "kafka-rack", "ring"])
def test_rf_above_pool_brokers_names_topic(strategy: str) -> None:
    """RF 4 on a 3-broker cluster names the topic, whatever the strategy."""
    cluster = Cluster(make_brokers(range(3)), (Topic("logs", 3, 4),))
    with pytest.raises(PlacementError, match="topic 'logs': replication factor 4"):
        plan(cluster, strategy)  # type: ignore[arg-type]


def test_strict_racks_rf_above_racks() -> None:
    """With strict racks, RF 3 over 2 racks names the topic and the racks."""
    cluster = Cluster(make_brokers(range(6), ["a", "b"]), (Topic("logs", 3, 3),))
    with pytest.raises(PlacementError, match=r"3 is larger than the 2 racks .*\(a, b\)"):
        plan(cluster, strict_racks=True)


def test_unknown_pool_is_named() -> None:
    """A topic of an unknown pool names the pool and the known ones."""
    brokers = (Broker(0, pool="gold"), Broker(1, pool="gold"))
    cluster = Cluster(brokers, (Topic("logs", 3, 1, pool="silver"),))
    with pytest.raises(PlacementError, match=r"unknown pool 'silver' .*gold"):
        plan(cluster)


def test_duplicate_broker_ids_are_named() -> None:
    """Two brokers with id 3 name the id."""
    with pytest.raises(PlacementError, match="duplicate broker id 3"):
        Cluster((Broker(3), Broker(3))).validate()


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan")])
def test_bad_weights_are_named(weight: float) -> None:
    """A zero, negative or NaN weight names the broker."""
    with pytest.raises(PlacementError, match="broker 7: weight must be > 0"):
        Cluster((Broker(7, weight=weight),)).validate()


def test_kafka_rack_needs_racks_everywhere() -> None:
    """kafka-rack with racks on some brokers only names the brokers without one."""
    cluster = Cluster((Broker(0, "a"), Broker(1), Broker(2, "b")), (Topic("t", 2, 2),))
    with pytest.raises(PlacementError, match=r"brokers \[1\] have no rack"):
        plan(cluster, "kafka-rack")


@pytest.mark.parametrize("strategy", ["kafka", "kafka-rack", "ring"])
def test_pools_are_respected(strategy: str) -> None:
    """Each topic lands only on its pool's brokers."""
    brokers = tuple(Broker(i, rack="abc"[i % 3], pool="p1" if i < 6 else "p2") for i in range(9))
    topics = (Topic("t1", 12, 2, pool="p1"), Topic("t2", 12, 3, pool="p2"), Topic("t3", 5, 2))
    out = plan(Cluster(brokers, topics), strategy)  # type: ignore[arg-type]
    assert {b for reps in out["t1"].values() for b in reps} <= set(range(6))
    assert {b for reps in out["t2"].values() for b in reps} <= {6, 7, 8}


def test_cluster_json_round_trip(tmp_path: Path) -> None:
    """A cluster written with to_dict() loads back equal, current assignment included."""
    cluster = Cluster(
        (Broker(0, "a", 2.0, "p"), Broker(1, "b", pool="p")),
        (Topic("t", 2, 2, "p"),),
        {"t": {0: [0, 1], 1: [1, 0]}},
    )
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cluster.to_dict()))
    loaded = load_cluster(path)
    assert loaded == cluster
    assert loaded.current == cluster.current


def test_cluster_yaml(tmp_path: Path) -> None:
    """A YAML cluster file loads when PyYAML is installed."""
    pytest.importorskip("yaml")
    path = tmp_path / "c.yaml"
    path.write_text(
        "brokers:\n  - {id: 1, rack: a}\n"
        "topics:\n  - {name: t, partitions: 1, replication_factor: 1}\n"
    )
    assert load_cluster(path).brokers == (Broker(1, "a"),)


def test_bad_field_type_is_named() -> None:
    """A weight given as text names the broker and the field."""
    with pytest.raises(PlacementError, match="broker 4: 'weight' must be float"):
        cluster_from_dict({"brokers": [{"id": 4, "weight": "heavy"}]})


def test_reassignment_json_lists_changes_only() -> None:
    """With a current assignment only changed partitions are listed, in Kafka's format."""
    current = {"t": {0: [1, 2], 1: [2, 3]}}
    proposed = {"t": {0: [1, 2], 1: [3, 4]}}
    assert reassignment_json(proposed, current) == {
        "version": 1,
        "partitions": [{"topic": "t", "partition": 1, "replicas": [3, 4]}],
    }


def test_reassignment_json_loads_back(tmp_path: Path) -> None:
    """load_assignment reads the reassignment JSON it writes."""
    proposed = {"t": {0: [1, 2], 1: [3, 4]}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(reassignment_json(proposed)))
    assert load_assignment(path) == proposed


def test_diff_names_moves_and_leaders() -> None:
    """The diff shows added/removed brokers, leader changes and a summary."""
    text = format_diff({"t": {0: [1, 2, 3], 1: [4, 5, 6]}}, {"t": {0: [1, 2, 7], 1: [5, 4, 6]}})
    assert "t-0: [1, 2, 3] -> [1, 2, 7]  +7 -3" in text
    assert "t-1: [4, 5, 6] -> [5, 4, 6]  leader 4 -> 5" in text
    assert text.splitlines()[-1].startswith("2 partitions change; 1 of 6 replicas move")


def test_reconcile_keeps_staying_brokers_in_place() -> None:
    """Brokers kept by the target keep their slot, so the leader does not change needlessly."""
    assert reconcile([1, 2, 3], [4, 1, 5]) == [1, 4, 5]
    assert reconcile([1, 2, 3], [3, 1]) == [1, 3]


def test_metrics_count_replicas_leaders_and_racks() -> None:
    """Metrics count replicas and leaders per broker and a same-rack partition as a violation."""
    brokers = (Broker(0, "a"), Broker(1, "a"), Broker(2, "b"))
    m = metrics({"t": {0: [0, 1], 1: [2, 0]}}, brokers)
    assert m.replicas == {0: 2, 1: 1, 2: 1}
    assert m.leaders == {0: 1, 1: 0, 2: 1}
    assert m.rack_violations == 1


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"t": {"0": "01"}}, r"t-0: replicas must be a list of broker ids, got '01'"),
        ({"t": {"1": [1.7, 0]}}, r"t-1: replica 1\.7 is not a broker id"),
        ({"t": {"0": [True, 0]}}, r"t-0: replica True is not a broker id"),
        ({"t": {"0": []}}, r"t-0: no replicas"),
        ({"t": {"x": [0]}}, r"topic 't': partition 'x' is not a partition number"),
        ({"t": {"0": [0], "00": [1]}}, r"t-0 is listed twice"),
        ({"t": {"0": [2, 2]}}, r"t-0: broker 2 holds two replicas"),
        (
            {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [0, 1]}] * 2},
            r"t-0 is listed twice",
        ),
        (
            {"version": 1, "partitions": [{"topic": "t", "partition": "x", "replicas": [0]}]},
            r"topic 't': partition 'x' is not a partition number",
        ),
        (
            {"version": 1, "partitions": [{"topic": "t", "partition": 1, "replicas": []}]},
            r"t-1: no replicas",
        ),
        (
            {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": "01"}]},
            r"t-0: replicas must be a list",
        ),
    ],
)
def test_bad_assignment_json_is_refused(doc: object, message: str) -> None:
    """Replicas as text or floats, empty lists, bad or repeated partitions name the entry."""
    with pytest.raises(PlacementError, match=message):
        assignment_from_obj(doc)


def test_digit_string_partitions_are_accepted() -> None:
    """JSON object keys are strings: {"t": {"3": [1, 2]}} is partition 3."""
    assert assignment_from_obj({"t": {"3": [1, 2]}}) == {"t": {3: [1, 2]}}


def test_check_plan_refuses_an_empty_replica_list() -> None:
    """apply's check names a partition with no replicas (Kafka would refuse it)."""
    cluster = Cluster((Broker(0), Broker(1)), (Topic("t", 1, 1),), {"t": {0: [0]}})
    with pytest.raises(PlacementError, match=r"t-0: no replicas"):
        check_plan(cluster, {"t": {0: []}})


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"brokers": 5}, r'"brokers" must be a list of broker objects, got 5'),
        ({"brokers": None}, r'"brokers" must be a list of broker objects, got None'),
        ([1, 2], r'a cluster file needs a "brokers" list'),
        ({"brokers": [{"id": 0}], "topics": 5}, r'"topics" must be a list of topic objects'),
        ({"brokers": [{"id": 0}], "topics": {"t": 1}}, r'"topics" must be a list'),
        ({"brokers": [{"id": 0}], "assignment": 5}, r"an assignment must be an object"),
        (
            {"brokers": [{"id": 0}], "assignment": {"t": {"x": [0]}}},
            r"partition 'x' is not a partition number",
        ),
    ],
)
def test_malformed_cluster_file_is_refused(doc: object, message: str) -> None:
    """Wrong types in a cluster document raise PlacementError naming the field."""
    with pytest.raises(PlacementError, match=message):
        cluster_from_dict(doc)  # type: ignore[arg-type]


def test_cli_malformed_cluster_file_exits_1(tmp_path: Path) -> None:
    """placement plan --cluster with "brokers": 5 exits 1 with one error line, no traceback."""
    path = tmp_path / "c.json"
    path.write_text('{"brokers": 5}')
    out = subprocess.run(
        [sys.executable, "-m", "logsdk.cli", "placement", "plan", "--cluster", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert '"brokers" must be a list' in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: placement.kafka_rack_assignment({}, 1, 1, 0, 0), "no brokers"),
        (lambda: placement.kafka_assignment([], 1, 1, 0, 0), "no brokers"),
        (lambda: placement.rack_alternated_brokers({}), "no brokers"),
        (lambda: placement.ring_assignment([Broker(0)], "t", 2, 0), "replication factor"),
        (lambda: placement.ring_assignment([Broker(0)], "t", 0, 1), "partitions"),
        (lambda: placement.HashRing([Broker(0)]).place("t", 0, 0), "replication factor"),
        (
            lambda: placement.metrics({"t": {0: [0]}}, [Broker(0, weight=0.0)]),
            "broker 0: weight must be > 0",
        ),
        (
            lambda: placement.metrics({"t": {0: [0]}}, [Broker(0, weight=float("nan"))]),
            "broker 0: weight must be > 0",
        ),
    ],
)
def test_public_calls_raise_placement_error_on_edge_inputs(
    call: Callable[[], object], message: str
) -> None:
    """Empty broker sets, RF or partitions of 0, and zero weights raise PlacementError."""
    with pytest.raises(PlacementError, match=message):
        call()
