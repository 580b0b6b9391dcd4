"""Kafka's own assignment (seed 000) and its rack-aware variant (Apache Kafka's AdminUtils)."""

from __future__ import annotations

import pytest

from logsdk.errors import PlacementError
from logsdk.placement import kafka_assignment, kafka_rack_assignment, rack_alternated_brokers

# Seed 000's table: a row per replica rank, a column per broker, cells are partitions.
SEED_TABLE = """
p0 p1 p2 p3 p4
p5 p6 p7 p8 p9
p4 p0 p1 p2 p3
p8 p9 p5 p6 p7
p3 p4 p0 p1 p2
p7 p8 p9 p5 p6
"""

# Kafka's AdminUtils doc example: brokers by rack and the assignment with fixed index 0.
KAFKA_RACKS = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}


def _table_to_assignment(table: str) -> dict[int, list[int]]:
    rows = [line.split() for line in table.strip().splitlines()]
    out: dict[int, list[int]] = {}
    for rank_rows in (rows[0:2], rows[2:4], rows[4:6]):
        for row in rank_rows:
            for broker, cell in enumerate(row):
                out.setdefault(int(cell[1:]), []).append(broker)
    return out


def test_reproduces_seed_table() -> None:
    """5 brokers, 10 partitions, RF 3, start index 0, shift 0 give seed 000's table exactly."""
    expected = _table_to_assignment(SEED_TABLE)
    assert expected[0] == [0, 1, 2]
    assert expected[5] == [0, 2, 3]
    assert kafka_assignment([0, 1, 2, 3, 4], 10, 3, start_index=0, shift=0) == expected


def test_shift_is_kafkas_next_replica_shift() -> None:
    """shift=1 puts p0's second replica two brokers after its first (seed's IncreasingShift 2)."""
    assert kafka_assignment([0, 1, 2, 3, 4], 1, 3, start_index=0, shift=1)[0] == [0, 2, 3]


def test_start_index_rotates_first_replicas() -> None:
    """start_index k puts partition 0's leader on the k-th broker of the list."""
    out = kafka_assignment([10, 11, 12, 13], 4, 2, start_index=2, shift=0)
    assert [reps[0] for reps in out.values()] == [12, 13, 10, 11]


def test_start_partition_continues_numbering() -> None:
    """start_partition=5 numbers new partitions from 5 and applies the shift bump at 5."""
    whole = kafka_assignment([0, 1, 2, 3, 4], 10, 3, start_index=0, shift=0)
    tail = kafka_assignment([0, 1, 2, 3, 4], 5, 3, start_index=0, shift=0, start_partition=5)
    assert tail == {p: whole[p] for p in range(5, 10)}


def test_random_when_none() -> None:
    """With start_index and shift None every partition still gets RF distinct brokers."""
    out = kafka_assignment([1, 2, 3, 4], 20, 3)
    assert all(len(set(r)) == 3 and set(r) <= {1, 2, 3, 4} for r in out.values())


def test_rack_alternated_list_matches_kafka() -> None:
    """Kafka's example racks alternate to 0, 3, 1, 5, 4, 2."""
    assert rack_alternated_brokers(KAFKA_RACKS) == [0, 3, 1, 5, 4, 2]


def test_rack_aware_matches_kafka_example() -> None:
    """Kafka's doc example: 0 -> 0,3,1 ... 5 -> 2,0,3, then 6 -> 0,4,2 (shifted followers)."""
    out = kafka_rack_assignment(KAFKA_RACKS, 7, 3, start_index=0, shift=0)
    assert out == {
        0: [0, 3, 1],
        1: [3, 1, 5],
        2: [1, 5, 4],
        3: [5, 4, 2],
        4: [4, 2, 0],
        5: [2, 0, 3],
        6: [0, 4, 2],
    }


def test_rack_aware_uneven_racks_stay_rack_distinct() -> None:
    """With racks of 4, 2 and 1 brokers and RF 3, every partition spans the 3 racks."""
    racks = {0: "a", 1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "c"}
    out = kafka_rack_assignment(racks, 30, 3, start_index=1, shift=2)
    assert all(len({racks[b] for b in reps}) == 3 for reps in out.values())


def test_rf_above_brokers_is_an_error() -> None:
    """RF 4 on 3 brokers raises PlacementError naming both numbers."""
    with pytest.raises(PlacementError, match=r"replication factor 4 .* 3 available brokers"):
        kafka_assignment([0, 1, 2], 3, 4, 0, 0)


def test_duplicate_broker_ids_are_an_error() -> None:
    """A repeated broker id raises PlacementError naming it."""
    with pytest.raises(PlacementError, match="duplicate broker id 2"):
        kafka_assignment([0, 2, 2], 3, 2, 0, 0)


@pytest.mark.parametrize("start_partition", [0, 3, 5, 10, 11])
def test_docstring_formula_holds_from_any_start_partition(start_partition: int) -> None:
    """kafka_assignment's documented offsets hold when partitions are added (start_partition).

    The docstring said ``p // n`` shift steps, which is wrong once start_partition > 0: the
    steps count multiples of n from max(start_partition, 1) to p.
    """
    n, start, shift = 5, 2, 3
    out = kafka_assignment(list(range(n)), 12, 3, start, shift, start_partition)
    for p, reps in out.items():
        m = sum(1 for c in range(max(start_partition, 1), p + 1) if c % n == 0)
        first = (p + start) % n
        assert reps == [first] + [(first + 1 + (shift + m + j - 1) % (n - 1)) % n for j in (1, 2)]
