"""``logsdk placement plan|diff|apply|describe``: the placement planners on the command line."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from logsdk.errors import PlacementError
from logsdk.placement._admin import apply_plan, read_cluster
from logsdk.placement._metrics import PlacementMetrics, metrics
from logsdk.placement._model import (
    Assignment,
    Broker,
    Cluster,
    Topic,
    broker_from_dict,
    cluster_from_dict,
    load_assignment,
    load_document,
    topic_from_dict,
)
from logsdk.placement._plan import STRATEGIES, Strategy, plan, pool_brokers_by_topic
from logsdk.placement._reassign import assignment_to_json, format_diff, reassignment_json
from logsdk.placement._ring import DEFAULT_LOAD_FACTOR, DEFAULT_VNODES

EPILOG = """examples:
  logsdk placement plan --brokers 12 --racks a,b,c --topics logs:600:3 --strategy ring
  logsdk placement plan --cluster cluster.json --current now.json --output plan.json
  logsdk placement describe --bootstrap localhost:9092
  logsdk placement diff --current now.json --proposed plan.json
  logsdk placement apply --bootstrap localhost:9092 --plan plan.json"""


def _brokers_spec(text: str) -> tuple[Broker, ...]:
    """``12`` (ids 0..11), ``ID[:RACK[:WEIGHT[:POOL]]],...`` or a JSON/YAML file."""
    text = text.strip()
    if text.isdigit():
        return tuple(Broker(i) for i in range(int(text)))
    if Path(text).is_file():
        return _brokers_from_doc(_load(text))
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        fields = item.split(":")
        if len(fields) > 4 or not fields[0].lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(
                f"bad broker {item!r}: use ID[:RACK[:WEIGHT[:POOL]]], e.g. 3:rack-a:2"
            )
        try:
            weight = float(fields[2]) if len(fields) > 2 and fields[2] else 1.0
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad weight in broker {item!r}") from None
        rack = fields[1] if len(fields) > 1 and fields[1] else None
        pool = fields[3] if len(fields) > 3 and fields[3] else None
        out.append(Broker(int(fields[0]), rack=rack, weight=weight, pool=pool))
    if not out:
        raise argparse.ArgumentTypeError("no brokers given")
    return tuple(out)


def _topics_spec(text: str) -> tuple[Topic, ...]:
    """``NAME:PARTITIONS:RF[:POOL],...`` or a JSON/YAML file."""
    if Path(text).is_file():
        doc = _load(text)
        items = doc.get("topics") if isinstance(doc, dict) else doc
        if not isinstance(items, list):
            raise argparse.ArgumentTypeError(f'{text}: needs a list of topics or a "topics" list')
        try:
            return tuple(topic_from_dict(t) for t in items)
        except PlacementError as exc:
            raise argparse.ArgumentTypeError(f"{text}: {exc}") from None
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        fields = item.split(":")
        if len(fields) not in (3, 4) or not (fields[1].isdigit() and fields[2].isdigit()):
            raise argparse.ArgumentTypeError(
                f"bad topic {item!r}: use NAME:PARTITIONS:RF[:POOL], e.g. logs:12:3"
            )
        pool = fields[3] if len(fields) == 4 and fields[3] else None
        out.append(Topic(fields[0], int(fields[1]), int(fields[2]), pool))
    if not out:
        raise argparse.ArgumentTypeError("no topics given")
    return tuple(out)


def _load_factor(text: str) -> float:
    """A finite float: >= 1 for the bound, 0 for the plain ring (checked by the planner)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"load factor must be a finite number, got {text!r}")
    return value


def _load(path: str) -> Any:
    try:
        return load_document(path)
    except PlacementError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _brokers_from_doc(doc: Any) -> tuple[Broker, ...]:
    items = doc.get("brokers") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise argparse.ArgumentTypeError('needs a list of brokers or a "brokers" list')
    try:
        return tuple(broker_from_dict(b) for b in items)
    except PlacementError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cluster(args: argparse.Namespace) -> Cluster:
    """The cluster from --cluster or --bootstrap, with --brokers/--topics/--racks on top."""
    if args.cluster is not None:
        cluster = cluster_from_dict(load_document(args.cluster))
    elif args.bootstrap is not None:
        cluster = read_cluster(args.bootstrap, timeout=args.timeout)
    elif args.brokers is None:
        raise PlacementError("say which cluster: --cluster FILE, --bootstrap SERVERS or --brokers")
    else:
        cluster = Cluster(args.brokers)
    brokers = args.brokers if args.brokers is not None else cluster.brokers
    if args.racks is not None:
        racks = [r.strip() for r in args.racks.split(",") if r.strip()]
        if not racks:
            raise PlacementError(f"--racks {args.racks!r} names no rack: give R1,R2,...")
        brokers = tuple(
            b if b.rack is not None else Broker(b.id, racks[n % len(racks)], b.weight, b.pool)
            for n, b in enumerate(sorted(brokers, key=lambda b: b.id))
        )
    topics = args.topics if args.topics is not None else cluster.topics
    current: Assignment = cluster.current
    if getattr(args, "current", None) is not None:
        current = load_assignment(args.current)
    return Cluster(tuple(brokers), tuple(topics), current).validate()


def _plan(args: argparse.Namespace, cluster: Cluster) -> Assignment:
    strategy: Strategy = args.strategy
    previous: tuple[Broker, ...] | None = getattr(args, "previous", None)
    return plan(
        cluster,
        strategy,
        previous=previous,
        seed=args.seed,
        vnodes=args.vnodes,
        load_factor=None if args.load_factor == 0 else args.load_factor,
        strict_racks=args.strict_racks,
    )


def _metrics_lines(m: PlacementMetrics) -> list[str]:
    lines = [
        f"replicas per broker: min {m.replicas_min}  max {m.replicas_max}  "
        f"mean {m.replicas_mean:.1f}  stddev {m.replicas_stddev:.2f}  max/mean {m.max_mean:.3f}"
        f"  weighted max/mean {m.weighted_max_mean:.3f}",
        f"preferred leaders per broker: min {m.leaders_min}  max {m.leaders_max}",
        f"rack violations: {m.rack_violations}",
    ]
    if m.moved is not None and m.moved_fraction is not None:
        lines.append(
            f"moved: {m.moved} of {m.total_replicas} replicas ({100 * m.moved_fraction:.1f}%), "
            f"{m.leader_changes} preferred leaders change"
        )
    return lines


def _cmd_plan(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    proposed = _plan(args, cluster)
    current = cluster.current or None
    doc = reassignment_json(proposed, current)
    # kafka-reassign-partitions.sh rejects an empty list ("Partition reassignment list
    # cannot be empty"): never write one.
    nothing = not doc["partitions"]
    if args.output is not None and not nothing:
        Path(args.output).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    m = metrics(proposed, cluster.brokers, current, pool_brokers_by_topic(cluster))
    if args.json:
        print(json.dumps(doc))
        if nothing:
            print("logsdk: nothing to reassign", file=sys.stderr)
        return 0
    if current:
        print(format_diff(current, proposed))
    else:
        for topic, parts in proposed.items():
            for p, reps in parts.items():
                print(f"{topic}-{p}: {reps}")
    print(f"strategy {args.strategy}:")
    print("\n".join("  " + line for line in _metrics_lines(m)))
    if nothing:
        where = f" ({args.output} not written)" if args.output is not None else ""
        print(f"nothing to reassign: the plan equals the current assignment{where}")
    elif args.output is not None:
        print(f"wrote {len(doc['partitions'])} partitions to {args.output}")
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    current = load_assignment(args.current)
    if args.proposed is not None:
        proposed = load_assignment(args.proposed)
    else:
        cluster = _cluster(args)
        proposed = _plan(args, cluster)
    if args.json:
        changes = reassignment_json(proposed, current)["partitions"]
        for c in changes:
            c["current"] = current.get(c["topic"], {}).get(c["partition"], [])
        print(json.dumps({"changes": changes}))
    else:
        print(format_diff(current, proposed))
    return 0


def _cmd_apply(args: argparse.Namespace) -> int:
    if args.bootstrap is None:
        raise PlacementError("apply needs the live cluster: --bootstrap SERVERS")
    proposed = load_assignment(args.plan) if args.plan is not None else _plan(args, _cluster(args))
    apply_plan(args.bootstrap, proposed, timeout=args.timeout)


def _cmd_describe(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    if not cluster.current and cluster.topics:
        raise PlacementError("no current assignment to describe: give --current or --bootstrap")
    m = metrics(cluster.current, cluster.brokers, None, pool_brokers_by_topic(cluster))
    if args.json:
        print(
            json.dumps(
                {
                    "cluster": cluster.to_dict(),
                    "assignment": assignment_to_json(cluster.current),
                    "metrics": m.to_dict(),
                }
            )
        )
        return 0
    for b in sorted(cluster.brokers, key=lambda b: b.id):
        extra = "".join(
            f"  {k} {v}"
            for k, v in (("rack", b.rack), ("pool", b.pool), ("host", b.host))
            if v is not None
        )
        print(
            f"broker {b.id}: weight {b.weight:g}{extra}  replicas {m.replicas.get(b.id, 0)}  "
            f"leaders {m.leaders.get(b.id, 0)}"
        )
    for t in cluster.topics:
        pool = f"  pool {t.pool}" if t.pool else ""
        print(f"topic {t.name}: {t.partitions} partitions  RF {t.replication_factor}{pool}")
    print("\n".join(_metrics_lines(m)))
    return 0


def _source_options(p: argparse.ArgumentParser, planning: bool = True) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", metavar="FILE", help="cluster model (JSON, or YAML with PyYAML)")
    g.add_argument("--bootstrap", metavar="SERVERS", help="read brokers and topics from Kafka")
    g.add_argument(
        "--brokers",
        type=_brokers_spec,
        metavar="SPEC",
        help="N (ids 0..N-1), ID[:RACK[:WEIGHT[:POOL]]],... or a file; replaces the cluster's",
    )
    g.add_argument("--racks", metavar="R1,R2", help="deal these racks to brokers without one")
    g.add_argument(
        "--topics",
        type=_topics_spec,
        metavar="SPEC",
        help="NAME:PARTITIONS:RF[:POOL],... or a file; replaces the cluster's",
    )
    g.add_argument("--timeout", type=float, default=15.0, help="seconds for cluster requests")
    if planning:
        s = p.add_argument_group("planner")
        s.add_argument("--strategy", choices=STRATEGIES, default="ring", help="(default: ring)")
        s.add_argument("--seed", default="0", help="seed of kafka's random start index/shift")
        s.add_argument(
            "--vnodes", type=int, default=DEFAULT_VNODES, help="ring virtual nodes per weight unit"
        )
        s.add_argument(
            "--load-factor",
            type=_load_factor,
            default=DEFAULT_LOAD_FACTOR,
            help="ring: most replicas per broker as a multiple of its share; 0 = plain ring",
        )
        s.add_argument(
            "--strict-racks", action="store_true", help="fail when RF is above the racks"
        )


def register(subparsers: Any) -> None:
    """Add the ``placement`` command group to the ``logsdk`` parser's subparsers."""
    top = subparsers.add_parser(
        "placement",
        help="plan, compare and apply replica placements",
        description="Replica placement: Kafka's algorithm, its rack-aware variant, or a "
        "consistent-hash ring with weights, racks and pools.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = top.add_subparsers(dest="placement_command", required=True)

    p = sub.add_parser("plan", help="plan an assignment; with --current, only what must move")
    _source_options(p)
    p.add_argument("--current", metavar="FILE", help="current assignment (reassignment JSON)")
    p.add_argument(
        "--previous",
        type=_brokers_spec,
        metavar="SPEC",
        help="ring: the brokers --current was planned on (same forms as --brokers), so "
        "changed weights move what the ring says (default: the brokers holding replicas)",
    )
    p.add_argument("--json", action="store_true", help="print the reassignment JSON only")
    p.add_argument("--output", metavar="FILE", help="write the reassignment JSON to FILE")
    p.set_defaults(func=_cmd_plan)

    d = sub.add_parser("diff", help="show what changes between two assignments")
    _source_options(d)
    d.add_argument("--current", metavar="FILE", required=True, help="current assignment")
    d.add_argument("--proposed", metavar="FILE", help="proposed assignment (default: plan one)")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=_cmd_diff)

    a = sub.add_parser("apply", help="apply a plan to a live cluster (where the client can)")
    _source_options(a)
    a.add_argument("--plan", metavar="FILE", help="reassignment JSON (default: plan one)")
    a.set_defaults(func=_cmd_apply)

    s = sub.add_parser("describe", help="brokers, topics and metrics of the current assignment")
    _source_options(s, planning=False)
    s.add_argument("--current", metavar="FILE", help="current assignment (reassignment JSON)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_cmd_describe)
