"""The consistent-hash ring (seed 004): the bounds asserted in issue 7, and incremental moves."""

from __future__ import annotations

import math

import pytest

from logsdk.errors import PlacementError
from logsdk.placement import (
    Broker,
    Cluster,
    HashRing,
    Topic,
    make_brokers,
    metrics,
    plan,
    ring_assignment,
)
from logsdk.placement._ring import fair_shares

RACKS = ["a", "b", "c"]
TWELVE = Cluster(make_brokers(range(12), RACKS), (Topic("logs", 600, 3),))
THIRTEEN = TWELVE.with_brokers((*TWELVE.brokers, Broker(12, rack="a")))


def test_ring_balance_twelve_brokers() -> None:
    """12 equal brokers, 3 racks, 600 x RF 3: max/mean replicas per broker <= 1.15."""
    m = metrics(plan(TWELVE, "ring"), TWELVE.brokers)
    assert m.total_replicas == 1800
    assert m.max_mean <= 1.15


def test_ring_rack_violations_zero() -> None:
    """With racks >= RF the ring places every partition on distinct racks."""
    assert metrics(plan(TWELVE, "ring"), TWELVE.brokers).rack_violations == 0


def test_adding_a_broker_moves_little_with_ring() -> None:
    """Adding a 13th broker moves at most 1.3/13 of the replicas with the ring."""
    before = plan(TWELVE, "ring")
    after = plan(THIRTEEN, "ring", current=before)
    m = metrics(after, THIRTEEN.brokers, previous=before)
    assert m.moved is not None
    assert m.moved_fraction is not None
    assert m.moved_fraction <= 1.3 / 13
    assert m.replicas[12] > 0
    assert m.rack_violations == 0


def test_adding_a_broker_moves_much_with_kafka() -> None:
    """Kafka's algorithm re-run on 13 brokers moves far more than 1.3/13 (for the report)."""
    before = plan(TWELVE, "kafka")
    after = plan(THIRTEEN, "kafka", current=before)
    moved = metrics(after, THIRTEEN.brokers, previous=before).moved_fraction
    assert moved is not None
    assert moved > 1.3 / 13


def test_new_broker_takes_its_fair_share() -> None:
    """The added broker ends within 15% of its fair share (600 rack-a replicas / 5 brokers)."""
    after = plan(THIRTEEN, "ring", current=plan(TWELVE, "ring"))
    assert metrics(after, THIRTEEN.brokers).replicas[12] == pytest.approx(120, rel=0.15)


def test_weight_two_gets_twice_the_replicas() -> None:
    """Without racks, a weight-2 broker gets 2x (+-15%) the mean of the weight-1 brokers."""
    brokers = (*make_brokers(range(11)), Broker(11, weight=2.0))
    cluster = Cluster(brokers, (Topic("logs", 600, 3),))
    counts = metrics(plan(cluster, "ring"), brokers).replicas
    others = sum(counts[i] for i in range(11)) / 11
    assert counts[11] / others == pytest.approx(2.0, rel=0.15)


def test_weight_two_with_racks_of_equal_weight() -> None:
    """With 3 racks each holding one weight-2 broker, those get 2x (+-15%) the others."""
    brokers = tuple(Broker(i, rack=RACKS[i % 3], weight=2.0 if i < 3 else 1.0) for i in range(12))
    cluster = Cluster(brokers, (Topic("logs", 600, 3),))
    counts = metrics(plan(cluster, "ring"), brokers).replicas
    heavy = sum(counts[i] for i in range(3)) / 3
    light = sum(counts[i] for i in range(3, 12)) / 9
    assert heavy / light == pytest.approx(2.0, rel=0.15)


def test_vnodes_follow_weight() -> None:
    """A broker of weight 2 owns twice the virtual nodes of a weight-1 broker."""
    ring = HashRing([Broker(0), Broker(1, weight=2.0)], vnodes_per_weight=10)
    assert len(ring) == 30


def test_rebalance_on_same_brokers_moves_nothing() -> None:
    """Planning again on the same brokers from the ring's own plan moves no replica."""
    before = plan(TWELVE, "ring")
    assert plan(TWELVE, "ring", current=before) == before


def test_removing_a_broker_moves_only_its_replicas() -> None:
    """Removing broker 5 moves exactly the replicas it held, nothing else."""
    before = plan(TWELVE, "ring")
    held = sum(5 in reps for reps in before["logs"].values())
    smaller = TWELVE.with_brokers(b for b in TWELVE.brokers if b.id != 5)
    after = plan(smaller, "ring", current=before)
    m = metrics(after, smaller.brokers, previous=before)
    assert m.moved == held
    assert m.rack_violations == 0


def test_plain_ring_is_the_seed_algorithm() -> None:
    """load_factor=None places each replica on the first fitting broker from its key."""
    ring = HashRing(TWELVE.brokers)
    out = plan(TWELVE, "ring", load_factor=None)
    assert out["logs"][7] == ring.place("logs", 7, 3)
    first = ring.walk("logs-7-0")[0].id
    assert out["logs"][7][0] == first


def test_ring_is_deterministic() -> None:
    """The same cluster always gives the same ring plan."""
    assert plan(TWELVE, "ring") == plan(TWELVE, "ring")


def _rack_blocks(sizes: tuple[int, ...]) -> tuple[Broker, ...]:
    """Brokers in contiguous racks a, b, c... of the given sizes (the benchmark's layout)."""
    out: list[Broker] = []
    for rack, size in zip("abcdef", sizes, strict=False):
        out += [Broker(len(out) + i, rack=rack) for i in range(size)]
    return tuple(out)


@pytest.mark.parametrize(("sizes", "source"), [((4, 4, 4), "kafka-rack"), ((5, 4, 3), "kafka")])
def test_new_broker_leads_at_most_its_bound_from_kafka_current(
    sizes: tuple[int, ...], source: str
) -> None:
    """Adding a broker to a Kafka-planned cluster: no broker leads more than 1.05x its share."""
    before_brokers = _rack_blocks(sizes)
    topic = Topic("logs", 600, 3)
    before = plan(Cluster(before_brokers, (topic,)), source)  # type: ignore[arg-type]
    brokers = (*before_brokers, Broker(12, rack="c"))
    after = plan(Cluster(brokers, (topic,)), "ring", current=before, previous=before_brokers)
    m = metrics(after, brokers, previous=before)
    bound = math.ceil(1.05 * 600 / 13)  # 49
    assert m.leaders[12] <= bound
    assert m.leaders_max <= bound
    assert m.rack_violations == 0


def test_weight_change_brings_every_broker_within_its_bound() -> None:
    """Broker 0's weight 1 -> 3 with --current only (no previous ring): brokers end in bound.

    Racks a, b, c dealt round-robin over 6 brokers, so rack a (brokers 0 and 3) holds one
    replica of each of the 600 partitions: shares 450 / 150, bounds 473 / 158; others 315.
    """
    old = make_brokers(range(6), RACKS)
    new = (Broker(0, rack="a", weight=3.0), *old[1:])
    topic = (Topic("logs", 600, 3),)
    before = plan(Cluster(old, topic), "ring")
    after = plan(Cluster(new, topic), "ring", current=before)
    m = metrics(after, new, previous=before)
    bound = {0: 473, 1: 315, 2: 315, 3: 158, 4: 315, 5: 315}
    assert {b: n for b, n in m.replicas.items() if n > bound[b]} == {}
    assert m.moved == m.replicas[0] - metrics(before, old).replicas[0] > 0
    assert m.rack_violations == 0


def test_fair_shares_sum_to_every_replica() -> None:
    """RF 3 over 2 racks: rack a (one broker, weight 3) holds one replica per partition.

    A broker holds at most one replica of a partition, so rack b's three brokers hold
    the other 200: the shares add up to all 300 replicas (they summed to 250).
    """
    brokers = (Broker(0, "a", 3.0), Broker(1, "b"), Broker(2, "b"), Broker(3, "b"))
    shares = fair_shares(brokers, 100, 3)
    assert shares[0] == pytest.approx(100)
    assert [shares[i] for i in (1, 2, 3)] == pytest.approx([200 / 3] * 3)
    assert sum(shares.values()) == pytest.approx(300)


@pytest.mark.parametrize(
    ("sizes", "partitions", "bound"),
    [((6, 6, 4, 4), 600, 95), ((3, 6, 3, 6), 300, 53)],
)
def test_no_broker_above_its_bound_with_uneven_racks(
    sizes: tuple[int, ...], partitions: int, bound: int
) -> None:
    """RF 3 over 4 racks of uneven size: every broker's share is equal, and none exceeds 1.05x.

    [6, 6, 4, 4] x 600: share 90, bound ceil(94.5); [3, 6, 3, 6] x 300: share 50, bound 53.
    """
    brokers = _rack_blocks(sizes)
    out = plan(Cluster(brokers, (Topic("logs", partitions, 3),)), "ring")
    m = metrics(out, brokers)
    assert m.replicas_max <= bound
    assert m.rack_violations == 0


@pytest.mark.parametrize("load_factor", [float("nan"), float("inf"), 0.5])
def test_bad_load_factor_raises_placement_error(load_factor: float) -> None:
    """A NaN, infinite or below-1 load factor is a PlacementError, not ValueError/OverflowError."""
    with pytest.raises(PlacementError, match="load factor"):
        ring_assignment(make_brokers(range(3)), "t", 6, 2, load_factor=load_factor)


def test_oversized_ring_is_refused() -> None:
    """A ring of more than MAX_RING_NODES virtual nodes raises before hashing any."""
    with pytest.raises(PlacementError, match=r"300000000 virtual nodes"):
        HashRing(make_brokers(range(3)), vnodes_per_weight=100_000_000)


def test_ring_refuses_a_broker_without_rack_among_racked_ones() -> None:
    """One rackless broker among racks a and b would be a third "rack" of its own.

    With RF 3 it then held a replica of every partition (600 of 1800 over 11 brokers,
    max/mean 3.667) and nothing was flagged; kafka-rack, like Kafka, refuses the input.
    """
    brokers = (*(Broker(i, rack="ab"[i % 2]) for i in range(10)), Broker(10))
    cluster = Cluster(brokers, (Topic("logs", 600, 3),))
    with pytest.raises(PlacementError, match=r"brokers \[10\] have no rack"):
        plan(cluster, "ring")
    with pytest.raises(PlacementError, match=r"brokers \[10\] have no rack"):
        HashRing(brokers)


def test_adding_a_rack_moves_one_replica_per_partition() -> None:
    """6 brokers in racks a/b, RF 3; a broker in a new rack c: each partition moves one replica.

    Each partition must now span 3 racks, so at least 600 replicas move; evicting a
    same-rack replica while the new broker also took another one moved two in 39 of them
    (639).
    """
    old = tuple(Broker(i, rack="ab"[i % 2]) for i in range(6))
    new = (*old, Broker(6, rack="c"))
    topic = (Topic("logs", 600, 3),)
    before = plan(Cluster(old, topic), "ring")
    after = plan(Cluster(new, topic), "ring", current=before, previous=old)
    m = metrics(after, new, previous=before)
    assert m.moved == 600
    assert m.rack_violations == 0
