"""Replica placement: balance, and movement when one broker is added, per strategy.

Clusters of 6, 12 and 48 brokers in 3 racks of unequal size (and, for reference, 12
brokers in 3 equal racks, the case the tests bound); one topic of ``--partitions``
partitions x RF 3. For each of kafka, kafka-rack, ring (bounded loads, the default)
and ring-plain (the seed's ring, no load bound) it reports max/mean and stddev of
replicas per broker, and the share of replicas moved when a broker joins the smallest
rack (the ring rebalances incrementally; Kafka's strategies re-plan, as
``kafka-reassign-partitions.sh --generate`` does). ``ideal`` is the added broker's fair
share: the fewest replicas any plan must move. The figures are deterministic (no
timing), so one round suffices; ring figures carry kafka's as their baseline.

    python benchmarks/placement.py [--partitions 600] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from logsdk.placement import Broker, Cluster, Strategy, Topic, metrics, plan
from logsdk.placement._ring import DEFAULT_LOAD_FACTOR, fair_shares

RACK_SIZES = {6: (3, 2, 1), 12: (5, 4, 3), 48: (20, 16, 12)}
VARIANTS: dict[str, Strategy] = {
    "kafka": "kafka",
    "kafka-rack": "kafka-rack",
    "ring": "ring",
    "ring-plain": "ring",
}


def cluster(sizes: tuple[int, ...], partitions: int) -> Cluster:
    brokers = []
    for rack, size in zip("abc", sizes, strict=True):
        brokers += [Broker(len(brokers) + i, rack=rack) for i in range(size)]
    return Cluster(tuple(brokers), (Topic("logs", partitions, 3),))


def measure(label: str, sizes: tuple[int, ...], partitions: int) -> list[dict[str, Any]]:
    before_cluster = cluster(sizes, partitions)
    n = len(before_cluster.brokers)
    added = Broker(n, rack="c")  # joins the smallest rack
    after_cluster = before_cluster.with_brokers((*before_cluster.brokers, added))
    ideal = fair_shares(after_cluster.brokers, partitions, 3)[n] / (partitions * 3)
    rows: list[dict[str, Any]] = []
    for variant, strategy in VARIANTS.items():
        lf = None if variant == "ring-plain" else DEFAULT_LOAD_FACTOR
        before = plan(before_cluster, strategy, load_factor=lf)
        after = plan(
            after_cluster,
            strategy,
            current=before,
            previous=before_cluster.brokers,
            load_factor=lf,
        )
        m = metrics(before, before_cluster.brokers)
        moved = metrics(after, after_cluster.brokers, previous=before)
        rows.append(
            {
                "variant": variant,
                "label": label,
                "max_mean": m.max_mean,
                "stddev": m.replicas_stddev,
                "leaders_max_mean": m.leaders_max / (partitions / n),
                "rack_violations": m.rack_violations,
                "moved_fraction": moved.moved_fraction,
                "ideal": ideal,
                "rack_sizes": "/".join(map(str, sizes)),
            }
        )
    return rows


def to_results(rows: list[dict[str, Any]], partitions: int) -> list[dict[str, Any]]:
    base = {(r["label"], k): r[k] for r in rows if r["variant"] == "kafka" for k in r}
    out = []
    for r in rows:
        for key, unit in (
            ("max_mean", "ratio"),
            ("stddev", "replicas"),
            ("leaders_max_mean", "ratio"),
            ("moved_fraction", "fraction"),
        ):
            b = None if r["variant"] == "kafka" else base[(r["label"], key)]
            out.append(
                {
                    "name": f"placement.{r['variant']}.{r['label']}.{key}",
                    "unit": unit,
                    "value": round(r[key], 4),
                    "baseline": None if b is None else "kafka, same cluster",
                    "baseline_value": None if b is None else round(b, 4),
                    "ratio": None if not b else round(r[key] / b, 4),
                    "goal": None,
                    "params": {
                        "partitions": partitions,
                        "replication_factor": 3,
                        "rack_sizes": r["rack_sizes"],
                        "ideal_moved_fraction": round(r["ideal"], 4),
                        "rack_violations": r["rack_violations"],
                    },
                }
            )
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=600)
    parser.add_argument("--records", type=int, default=None, help="ignored (common flag)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for n, sizes in RACK_SIZES.items():
        rows += measure(f"{n}", sizes, args.partitions)
    rows += measure("12eq", (4, 4, 4), args.partitions)
    print(
        f"{'brokers (racks)':18} {'strategy':11} {'max/mean':>8} {'stddev':>7} "
        f"{'leaders max/mean':>16} {'moved +1':>8} {'ideal':>6} {'rack viol.':>10}"
    )
    for r in rows:
        where = f"{r['label']} ({r['rack_sizes']})"
        print(
            f"{where:18} {r['variant']:11} {r['max_mean']:8.3f} "
            f"{r['stddev']:7.1f} {r['leaders_max_mean']:16.3f} "
            f"{100 * r['moved_fraction']:7.1f}% {100 * r['ideal']:5.1f}% {r['rack_violations']:10d}"
        )
    if args.json:
        print(json.dumps({"results": to_results(rows, args.partitions)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
