"""The live-cluster side: read brokers, racks and the current assignment; apply a plan.

The only module of `logsdk.placement` that touches confluent-kafka; its errors
are translated here into [`PlacementError`][logsdk.errors.PlacementError].
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Mapping
from typing import Any, NoReturn

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

from logsdk._fork import AdminClient
from logsdk._types import ClientConfig
from logsdk.errors import PlacementApplyError, PlacementError
from logsdk.placement._metrics import AssignmentLike
from logsdk.placement._model import Assignment, Broker, Cluster, Topic
from logsdk.placement._reassign import changed_partitions

#: librdkafka's own log lines, as the producer's (logsdk.producer._client): through
#: Python logging, never on stderr.
rdlog = logging.getLogger("logsdk.librdkafka")


def _admin(config: str | Mapping[str, Any]) -> AdminClient:
    conf: ClientConfig = {"bootstrap.servers": config} if isinstance(config, str) else dict(config)
    return AdminClient({**conf, "logger": rdlog})


def _bootstrap(config: str | Mapping[str, Any]) -> str:
    return config if isinstance(config, str) else str(config.get("bootstrap.servers", ""))


def _racks_from_configs(admin: AdminClient, ids: list[int], timeout: float) -> dict[int, str]:
    """``broker.rack`` of each broker through DescribeConfigs (when metadata lacks racks)."""
    out: dict[int, str] = {}
    resources = [ConfigResource(ResourceType.BROKER, str(i)) for i in ids]
    try:
        futures = admin.describe_configs(resources, request_timeout=timeout)
        for res, fut in futures.items():
            entry = fut.result(timeout).get("broker.rack")
            if entry is not None and entry.value:
                out[int(res.name)] = str(entry.value)
    except KafkaException:
        return {}  # an old broker or no permission: the racks stay unknown
    except concurrent.futures.TimeoutError as exc:
        # Unlike a refusal, silence may hide racks: planning without them would
        # place replicas rack-blind, so say so instead.
        raise PlacementError(
            f"cannot read the brokers' racks (broker.rack): no answer within {timeout:g} s"
        ) from exc
    return out


def read_cluster(
    config: str | Mapping[str, Any],
    *,
    timeout: float = 15.0,
    include_internal: bool = False,
    topics: list[str] | None = None,
) -> Cluster:
    """Brokers (with racks), topics and the current assignment of a live cluster.

    ``config`` is a bootstrap string or librdkafka settings. Racks come from the
    DescribeCluster metadata, else from each broker's ``broker.rack`` config.
    Topics starting with ``__`` are left out unless ``include_internal``.
    """
    admin = _admin(config)
    where = _bootstrap(config)
    try:
        described = admin.describe_cluster(request_timeout=timeout).result(timeout)
        nodes = [(n.id, n.host, n.rack) for n in described.nodes]
        md = admin.list_topics(timeout=timeout)
    except (KafkaException, concurrent.futures.TimeoutError) as exc:
        # The wait on the future runs out first, or librdkafka's own request timeout
        # does (_TIMED_OUT): the same silence either way.
        if isinstance(exc, KafkaException):
            err = exc.args[0] if exc.args else exc
            if not (isinstance(err, KafkaError) and err.code() == KafkaError._TIMED_OUT):
                raise PlacementError(f"cannot read the cluster at {where}: {err}") from exc
        raise PlacementError(
            f"cannot read the cluster at {where}: no answer within {timeout:g} s "
            "(is the bootstrap address right and the cluster up? raise --timeout if slow)"
        ) from exc
    racks = {i: r for i, _, r in nodes if r}
    if not racks:
        racks = _racks_from_configs(admin, [i for i, _, _ in nodes], timeout)
    brokers = tuple(Broker(i, rack=racks.get(i), host=h) for i, h, _ in sorted(nodes))
    found: list[Topic] = []
    current: Assignment = {}
    for name in sorted(md.topics):
        tmd = md.topics[name]
        if topics is not None and name not in topics:
            continue
        if (name.startswith("__") and not include_internal) or tmd.error is not None:
            continue
        parts = {p: list(pm.replicas) for p, pm in tmd.partitions.items()}
        if not parts:
            continue
        rf = max(len(r) for r in parts.values())
        found.append(Topic(name, len(parts), rf))
        current[name] = dict(sorted(parts.items()))
    missing = sorted(set(topics or []) - {t.name for t in found})
    if missing:
        raise PlacementError(f"topics not found in the cluster: {', '.join(missing)}")
    return Cluster(brokers, tuple(found), current).validate()


def check_plan(cluster: Cluster, proposed: AssignmentLike) -> None:
    """Raise `PlacementError` naming a topic, partition or broker the cluster lacks."""
    known = {b.id for b in cluster.brokers}
    for topic, parts in proposed.items():
        if topic not in cluster.current:
            raise PlacementError(f"topic {topic!r} is not in the cluster")
        for p, reps in parts.items():
            if p not in cluster.current[topic]:
                raise PlacementError(f"partition {topic}-{p} is not in the cluster")
            if not reps:
                raise PlacementError(f"{topic}-{p}: no replicas")
            unknown = sorted(set(reps) - known)
            if unknown:
                raise PlacementError(f"{topic}-{p}: brokers {unknown} are not in the cluster")
            if len(set(reps)) != len(reps):
                raise PlacementError(f"{topic}-{p}: a broker holds two replicas: {list(reps)}")


def apply_plan(
    config: str | Mapping[str, Any], proposed: AssignmentLike, *, timeout: float = 15.0
) -> NoReturn:
    """Check ``proposed`` against the live cluster, then fail saying how to apply it.

    confluent-kafka's AdminClient has no partition reassignment call
    (AlterPartitionReassignments, KIP-455), so after checking the plan against the
    cluster (unknown topics, partitions or brokers raise `PlacementError`)
    this raises `PlacementApplyError` naming Kafka's own tool and the JSON.
    """
    cluster = read_cluster(config, timeout=timeout)
    check_plan(cluster, proposed)
    changes = changed_partitions(cluster.current, proposed)
    bootstrap = _bootstrap(config)
    raise PlacementApplyError(
        f"cannot apply the plan ({len(changes)} partitions would change): this client has "
        f"no partition reassignment API (AlterPartitionReassignments) in confluent-kafka "
        f"{confluent_kafka.__version__} / librdkafka {confluent_kafka.libversion()[0]}. "
        "Use the JSON instead: `logsdk placement plan ... --output plan.json`, then "
        f"`kafka-reassign-partitions.sh --bootstrap-server {bootstrap} "
        "--reassignment-json-file plan.json --execute`"
    )
