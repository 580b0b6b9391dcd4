"""Metrics of an assignment: balance, leaders, rack violations, movement."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from logsdk.errors import PlacementError
from logsdk.placement._model import Broker

AssignmentLike = Mapping[str, Mapping[int, Sequence[int]]]


@dataclass(frozen=True)
class PlacementMetrics:
    """Figures of one assignment over a broker set (and against a previous one)."""

    total_replicas: int
    replicas: dict[int, int]
    leaders: dict[int, int]
    replicas_min: int
    replicas_max: int
    replicas_mean: float
    replicas_stddev: float
    #: max / mean of replicas per broker
    max_mean: float
    #: max / mean of replicas per unit of weight: 1.0 is perfectly weight-proportional
    weighted_max_mean: float
    leaders_min: int
    leaders_max: int
    #: partitions whose replicas span fewer racks than min(RF, racks available)
    rack_violations: int
    #: replicas on a broker that did not hold them before (None without a previous one)
    moved: int | None = None
    moved_fraction: float | None = None
    #: partitions whose preferred leader changed
    leader_changes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (broker ids as string keys)."""
        d = asdict(self)
        d["replicas"] = {str(k): v for k, v in sorted(self.replicas.items())}
        d["leaders"] = {str(k): v for k, v in sorted(self.leaders.items())}
        return d


def rack_violations(
    assignment: AssignmentLike,
    brokers: Sequence[Broker],
    pools: Mapping[str, Sequence[Broker]] | None = None,
) -> int:
    """Partitions spanning fewer racks than they could (a broker without a rack is its own)."""
    domain = {b.id: b.domain for b in brokers}
    all_domains = len(set(domain.values()))
    bad = 0
    for topic, parts in assignment.items():
        avail = all_domains
        if pools is not None and topic in pools:
            avail = len({b.domain for b in pools[topic]})
        for reps in parts.values():
            used = {domain.get(b, f"broker-{b}") for b in reps}
            if len(used) < min(len(reps), avail):
                bad += 1
    return bad


def moved_replicas(before: AssignmentLike, after: AssignmentLike) -> tuple[int, int]:
    """(replicas placed on a broker that did not hold them, partitions whose leader changed)."""
    moved = leaders = 0
    for topic, parts in after.items():
        old_parts = before.get(topic, {})
        for p, reps in parts.items():
            old = old_parts.get(p)
            if old is None:
                continue
            moved += len(set(reps) - set(old))
            if reps and old and reps[0] != old[0]:
                leaders += 1
    return moved, leaders


def metrics(
    assignment: AssignmentLike,
    brokers: Sequence[Broker],
    previous: AssignmentLike | None = None,
    pools: Mapping[str, Sequence[Broker]] | None = None,
) -> PlacementMetrics:
    """Balance, leaders and rack violations of ``assignment`` over ``brokers``.

    ``pools`` maps a topic to the brokers it may use, for rack violations in pools.
    With ``previous``, also the replicas moved and the leader changes.
    """
    for b in brokers:
        if not (math.isfinite(b.weight) and b.weight > 0):
            raise PlacementError(f"broker {b.id}: weight must be > 0, got {b.weight}")
    reps = Counter({b.id: 0 for b in brokers})
    leads = Counter({b.id: 0 for b in brokers})
    total = 0
    for parts in assignment.values():
        for r in parts.values():
            reps.update(r)
            total += len(r)
            if r:
                leads[r[0]] += 1
    counts = [reps[b.id] for b in brokers]
    mean = statistics.fmean(counts) if counts else 0.0
    weight = {b.id: b.weight for b in brokers}
    w_total = sum(weight.values())
    per_weight = [reps[b.id] / weight[b.id] for b in brokers]
    w_mean = total / w_total if w_total else 0.0
    moved = leader_changes = None
    fraction = None
    if previous is not None:
        moved, leader_changes = moved_replicas(previous, assignment)
        fraction = moved / total if total else 0.0
    lead_counts = [leads[b.id] for b in brokers]
    return PlacementMetrics(
        total_replicas=total,
        replicas=dict(reps),
        leaders=dict(leads),
        replicas_min=min(counts, default=0),
        replicas_max=max(counts, default=0),
        replicas_mean=mean,
        replicas_stddev=statistics.pstdev(counts) if counts else 0.0,
        max_mean=max(counts) / mean if mean else 0.0,
        weighted_max_mean=max(per_weight) / w_mean if w_mean else 0.0,
        leaders_min=min(lead_counts, default=0),
        leaders_max=max(lead_counts, default=0),
        rack_violations=rack_violations(assignment, brokers, pools),
        moved=moved,
        moved_fraction=fraction,
        leader_changes=leader_changes,
    )
