"""Planners: place every topic of a cluster with a strategy, on its pool's brokers."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Literal, get_args

from logsdk.errors import PlacementError
from logsdk.placement._kafka import kafka_assignment, kafka_rack_assignment
from logsdk.placement._model import Assignment, Broker, Cluster, Topic
from logsdk.placement._ring import DEFAULT_LOAD_FACTOR, DEFAULT_VNODES, HashRing, check_racks

Strategy = Literal["kafka", "kafka-rack", "ring"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


def _check_topic(topic: Topic, brokers: Sequence[Broker], strict_racks: bool) -> None:
    where = f"pool {topic.pool!r}" if topic.pool is not None else "the cluster"
    if topic.replication_factor > len(brokers):
        raise PlacementError(
            f"topic {topic.name!r}: replication factor {topic.replication_factor} is larger "
            f"than the {len(brokers)} brokers of {where}"
        )
    if strict_racks:
        missing = [b.id for b in brokers if b.rack is None]
        if missing:
            raise PlacementError(
                f"topic {topic.name!r}: strict racks, but brokers {missing} of {where} have no rack"
            )
        racks = sorted({b.rack for b in brokers if b.rack is not None})
        if topic.replication_factor > len(racks):
            raise PlacementError(
                f"topic {topic.name!r}: replication factor {topic.replication_factor} is larger "
                f"than the {len(racks)} racks of {where} ({', '.join(racks)})"
            )


def _kafka_indices(seed: int | str, topic: str, n: int) -> tuple[int, int]:
    # Kafka draws a random start index and shift per topic; a seeded draw per topic keeps
    # plans reproducible and independent of which other topics are planned.
    rng = random.Random(f"{seed}/{topic}")
    return rng.randrange(n), rng.randrange(n)


def _kafka_topic(
    topic: Topic, brokers: Sequence[Broker], rack: bool, seed: int | str
) -> dict[int, list[int]]:
    ids = [b.id for b in brokers]
    if rack:
        with_rack = [b for b in brokers if b.rack is not None]
        if with_rack:
            start, shift = _kafka_indices(seed, topic.name, len(ids))
            return kafka_rack_assignment(
                {b.id: b.rack for b in with_rack if b.rack is not None},
                topic.partitions,
                topic.replication_factor,
                start,
                shift,
            )
    start, shift = _kafka_indices(seed, topic.name, len(ids))
    return kafka_assignment(ids, topic.partitions, topic.replication_factor, start, shift)


def reconcile(current: Sequence[int], target: Sequence[int]) -> list[int]:
    """``target``'s broker set, keeping each broker of ``current`` that stays in its slot."""
    keep = set(current) & set(target)
    incoming = [b for b in target if b not in keep]
    out: list[int] = []
    for b in current:
        if b in keep and b not in out:
            out.append(b)
        elif incoming:
            out.append(incoming.pop(0))
    out.extend(incoming)
    return out


def plan(
    cluster: Cluster,
    strategy: Strategy = "ring",
    *,
    current: Assignment | None = None,
    previous: Sequence[Broker] | None = None,
    seed: int | str = 0,
    vnodes: int = DEFAULT_VNODES,
    load_factor: float | None = DEFAULT_LOAD_FACTOR,
    strict_racks: bool = False,
) -> Assignment:
    """``{topic: {partition: [broker ids]}}`` for every topic of ``cluster``, leader first.

    Each topic is placed on its pool's brokers. A topic of ``current`` must hold
    exactly partitions ``0..partitions-1`` (a reassignment cannot add or drop any).
    With ``current`` (default: the
    cluster's own current assignment), ``ring`` moves only what the ring says must
    move (see `HashRing.rebalance()`); ``previous`` is the broker set ``current``
    was planned on (default: the brokers holding a replica in ``current``). The
    ``kafka`` strategies plan afresh, as ``kafka-reassign-partitions.sh --generate``
    does, then keep every replica already on a broker of the new plan in its slot.
    """
    if strategy not in STRATEGIES:
        raise PlacementError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    cluster.validate()
    current = cluster.current if current is None else current
    if previous is None and current:
        held = {b for parts in current.values() for reps in parts.values() for b in reps}
        previous = [b for b in cluster.brokers if b.id in held]
    out: Assignment = {}
    for topic in cluster.topics:
        brokers = cluster.pool_brokers(topic.pool)
        _check_topic(topic, brokers, strict_racks)
        if strategy != "kafka":
            try:
                check_racks(brokers, strategy)
            except PlacementError as exc:
                raise PlacementError(f"topic {topic.name!r}: {exc}") from None
        now = current.get(topic.name) if current else None
        if now and sorted(now) != list(range(topic.partitions)):
            raise PlacementError(
                f"topic {topic.name!r}: the current assignment has {len(now)} partitions "
                f"({_ranges(sorted(now))}) but the topic declares {topic.partitions}; a "
                "reassignment can neither create nor drop partitions: give the topic its "
                "real partition count, or the full current assignment"
            )
        if strategy == "ring":
            ring = HashRing(brokers, vnodes)
            if now and load_factor is not None:
                pool_ids = {b.id for b in brokers}
                before = [b for b in previous or () if b.id in pool_ids]
                old_ring = HashRing(before, vnodes) if before else None
                out[topic.name] = ring.rebalance(
                    topic.name,
                    topic.partitions,
                    topic.replication_factor,
                    now,
                    old_ring,
                    load_factor,
                )
                continue
            target = ring.assign(
                topic.name, topic.partitions, topic.replication_factor, load_factor
            )
        else:
            target = _kafka_topic(topic, brokers, strategy == "kafka-rack", seed)
        if now:
            target = {p: reconcile(now.get(p, []), reps) for p, reps in target.items()}
        out[topic.name] = target
    return out


def _ranges(ids: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    out: list[str] = []
    for i in ids:
        if out and i == int(out[-1].rsplit("-", 1)[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def validate_assignment(
    cluster: Cluster, assignment: Mapping[str, Mapping[int, Sequence[int]]]
) -> None:
    """Raise `PlacementError` if a replica is on an unknown broker or repeats one."""
    known = {b.id for b in cluster.brokers}
    for topic, parts in assignment.items():
        for p, reps in parts.items():
            if len(set(reps)) != len(reps):
                raise PlacementError(f"{topic}-{p}: a broker holds two replicas: {list(reps)}")
            unknown = [b for b in reps if b not in known]
            if unknown:
                raise PlacementError(f"{topic}-{p}: unknown brokers {unknown}")


def pool_brokers_by_topic(cluster: Cluster) -> dict[str, list[Broker]]:
    """The brokers each topic may use (its pool's, or all)."""
    return {t.name: cluster.pool_brokers(t.pool) for t in cluster.topics}
