"""Kafka's own replica assignment (AdminUtils.assignReplicasToBrokers), rack-unaware and aware.

Ported from the algorithm described in seed 000 and Apache Kafka's ``AdminUtils``:
first replicas round-robin from a start index, followers at an increasing shift; the
rack-aware variant runs the same loop over a rack-alternated broker list and skips
brokers whose rack (until every rack has a replica) or self already holds one.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from logsdk.errors import PlacementError


def _check(broker_ids: Sequence[int], partitions: int, replication_factor: int) -> None:
    if not broker_ids:
        raise PlacementError("no brokers given")
    if partitions < 1:
        raise PlacementError(f"partitions must be >= 1, got {partitions}")
    if replication_factor < 1:
        raise PlacementError(f"replication factor must be >= 1, got {replication_factor}")
    if len(set(broker_ids)) != len(broker_ids):
        dup = sorted({b for b in broker_ids if list(broker_ids).count(b) > 1})
        raise PlacementError(f"duplicate broker id {dup[0]}")
    if replication_factor > len(broker_ids):
        raise PlacementError(
            f"replication factor {replication_factor} is larger than the "
            f"{len(broker_ids)} available brokers"
        )


def _replica_index(first: int, second_shift: int, replica: int, n: int) -> int:
    # Kafka: shift = 1 + (secondReplicaShift + replicaIndex) % (nBrokers - 1), so a
    # follower is never on the leader's broker; max(1, ...) keeps n == 1 defined (RF 1).
    shift = 1 + (second_shift + replica) % max(1, n - 1)
    return (first + shift) % n


def _start_and_shift(n: int, start_index: int | None, shift: int | None) -> tuple[int, int]:
    """Kafka's starting broker index and nextReplicaShift: given, or drawn in ``[0, n)``."""
    start = random.randrange(n) if start_index is None else start_index
    next_shift = random.randrange(n) if shift is None else shift
    if start < 0 or next_shift < 0:
        raise PlacementError("start_index and shift must be >= 0")
    return start, next_shift


def kafka_assignment(
    broker_ids: list[int],
    partitions: int,
    replication_factor: int,
    start_index: int | None = None,
    shift: int | None = None,
    start_partition: int = 0,
) -> dict[int, list[int]]:
    """Kafka's rack-unaware assignment: ``{partition: [broker ids]}``, leader first.

    ``start_index`` is the position in ``broker_ids`` of partition 0's first replica
    (partition p's is at ``(p + start_index) % n``, n brokers); ``shift`` is Kafka's
    initial ``nextReplicaShift``: partition p's replica j (j >= 1) sits
    ``1 + (shift + m + j - 1) % (n - 1)`` places after its first replica, m counting the
    multiples of n in ``[max(start_partition, 1), p]`` (``m = p // n`` when
    ``start_partition`` is 0). ``None`` draws either at random in ``[0, n)``, as Kafka
    does; Kafka's ``fixedStartIndex=k`` is ``start_index=k, shift=k``. The seed's
    "IncreasingShift initial value 1" is the offset of replica 2, i.e. ``shift=0``: with
    brokers 0..4, ``start_index=0, shift=0`` gives the seed's table (p0 -> [0, 1, 2],
    p5 -> [0, 2, 3]).
    ``start_partition`` numbers the partitions from there (adding partitions).
    """
    ids = list(broker_ids)
    _check(ids, partitions, replication_factor)
    n = len(ids)
    start, next_shift = _start_and_shift(n, start_index, shift)
    out: dict[int, list[int]] = {}
    current = max(0, start_partition)
    for _ in range(partitions):
        if current > 0 and current % n == 0:
            next_shift += 1
        first = (current + start) % n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            replicas.append(ids[_replica_index(first, next_shift, j, n)])
        out[current] = replicas
        current += 1
    return out


def rack_alternated_brokers(broker_racks: Mapping[int, str]) -> list[int]:
    """Brokers alternated by rack: racks sorted, ids sorted within a rack (Kafka's order).

    ``{0: "a", 1: "a", 2: "b", 3: "c"}`` gives ``[0, 2, 3, 1]``.
    """
    if not broker_racks:
        raise PlacementError("no brokers given")
    by_rack: dict[str, list[int]] = {}
    for bid, rack in broker_racks.items():
        by_rack.setdefault(rack, []).append(bid)
    racks = sorted(by_rack)
    queues = {r: sorted(ids) for r, ids in by_rack.items()}
    out: list[int] = []
    depth = max(len(q) for q in queues.values())
    for i in range(depth):
        out.extend(queues[r][i] for r in racks if i < len(queues[r]))
    return out


def kafka_rack_assignment(
    broker_racks: Mapping[int, str],
    partitions: int,
    replication_factor: int,
    start_index: int | None = None,
    shift: int | None = None,
    start_partition: int = 0,
) -> dict[int, list[int]]:
    """Kafka's rack-aware assignment over ``{broker id: rack}``; see `kafka_assignment()`.

    When the replication factor is at least the number of racks every rack gets a
    replica; otherwise every rack gets at most one. Kafka's own example: racks
    ``{0: r1, 1: r3, 2: r3, 3: r2, 4: r2, 5: r1}`` give the list ``[0, 3, 1, 5, 4, 2]``.
    """
    arranged = rack_alternated_brokers(broker_racks)
    _check(arranged, partitions, replication_factor)
    n = len(arranged)
    n_racks = len(set(broker_racks.values()))
    start, next_shift = _start_and_shift(n, start_index, shift)
    out: dict[int, list[int]] = {}
    current = max(0, start_partition)
    for _ in range(partitions):
        if current > 0 and current % n == 0:
            next_shift += 1
        first = (current + start) % n
        leader = arranged[first]
        replicas = [leader]
        racks_used = {broker_racks[leader]}
        brokers_used = {leader}
        k = 0
        for _ in range(replication_factor - 1):
            while True:
                broker = arranged[_replica_index(first, next_shift * n_racks, k, n)]
                rack = broker_racks[broker]
                k += 1
                # Skip a broker whose rack already holds a replica while some rack has
                # none, and a broker that already holds one while some broker has none.
                if (rack not in racks_used or len(racks_used) == n_racks) and (
                    broker not in brokers_used or len(brokers_used) == n
                ):
                    replicas.append(broker)
                    racks_used.add(rack)
                    brokers_used.add(broker)
                    break
        out[current] = replicas
        current += 1
    return out
