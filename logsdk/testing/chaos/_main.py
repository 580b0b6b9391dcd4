"""``python -m logsdk.testing.chaos``: the command line, the summary it prints, and the
``chaos.*`` figures it merges into a results.json.

The same command runs the children: ``_producer`` and ``_consumer`` (arguments given by
`logsdk.testing.chaos._workload.start()`) run one producer or consumer child of a run.
Output: one summary line per figure, ``verdict ok`` or ``verdict FAIL``, and with
``--json`` a last line that is the whole verdict as one JSON object. Exit status 1 on any
unexplained loss, duplicate, order violation, ownership violation or spool problem.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from logsdk.testing.chaos import _workload
from logsdk.testing.chaos._run import chaos
from logsdk.testing.chaos._workload import SEQ_BLOCK


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("logsdk.librdkafka").setLevel(logging.CRITICAL)
    if args.role == "_producer":
        return _workload.producer_child(args)
    if args.role == "_consumer":
        return _workload.consumer_child(args)
    if args.duration < 20:
        ap.error("--duration must be at least 20 seconds")
    verdict = chaos(
        args.seed,
        args.duration,
        args.producers,
        args.consumers,
        (1 if args.broker == "embedded" else 0)
        if args.max_in_flight is None
        else args.max_in_flight,
        args.seq_block,
        args.broker,
    )
    _print_summary(verdict)
    if args.results:
        merge_results(Path(args.results), verdict)
    if args.json:
        print(json.dumps(verdict))
    return 0 if verdict["verdict"] == "ok" else 1


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m logsdk.testing.chaos",
        description="Producers, a consumer group and a nemesis; then count every record.",
        epilog="example: python -m logsdk.testing.chaos --duration 300 --seed 7 --json",
    )
    sub = ap.add_subparsers(dest="role")
    pp = sub.add_parser("_producer")
    for a in ("bootstrap", "spool", "report", "stop"):
        pp.add_argument(a)
    pp.add_argument("--buffer", default="memory")
    pp.add_argument("--spool-max-bytes", type=int, default=0)
    pp.add_argument("--max-in-flight", type=int, default=0)
    cp = sub.add_parser("_consumer")
    for a in ("bootstrap", "db", "latency"):
        cp.add_argument(a)
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help=(
            "producers' max.in.flight.requests.per.connection (default 1 on the embedded "
            "broker: it does not enforce idempotent sequences across its restarts; 0, "
            "librdkafka's default of 5, on Apache Kafka)"
        ),
    )
    ap.add_argument(
        "--seq-block",
        type=int,
        default=SEQ_BLOCK,
        help=f"seqs the producers reserve at a time (default {SEQ_BLOCK}; 2^20 in production)",
    )
    ap.add_argument(
        "--broker",
        choices=("embedded", "apache"),
        default="embedded",
        help=(
            "embedded: Tansu, durable; apache: Apache Kafka, three nodes (leader kills and "
            "node pauses instead of broker kills and pauses)"
        ),
    )
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    ap.add_argument("--results", help="merge chaos.* figures into this results.json")
    return ap


def _print_summary(verdict: dict[str, Any]) -> None:
    for k in ("accepted", "in_sink", "missing", "duplicates", "dropped", "max_latency_s"):
        print(f"{k:16} {verdict[k]}")
    print(f"{'degraded_s':16} {verdict['degraded_s']}")
    print(f"{'offset_gaps':16} {len(verdict['offset_gaps'])} {verdict['offset_gaps'][:10]}")
    print(
        f"{'order':16} {verdict['order_violations']} violations, "
        f"{verdict['order_violations_after_unconfirmed']} of them records resent after "
        f"{verdict['unconfirmed_reports']} unconfirmed delivery reports"
    )
    if verdict["missing_reports"]:
        print(f"{'missing_reports':16} {verdict['missing_reports']}")
    print(f"{'events':16} {len(verdict['events'])}: {', '.join(verdict['events'])}")
    print(f"{'spool check':16} {len(verdict['spool_problems'])} problem(s)")
    for line in verdict["spool_problems"][:10]:
        print(f"{'':16} {line}")
    print(f"{'ownership':16} {len(verdict['ownership_violations'])} violation(s)")
    for line in verdict["ownership_violations"][:10]:
        print(f"{'':16} {line}")
    print(f"verdict          {verdict['verdict']}")


def merge_results(path: Path, v: dict[str, Any]) -> None:
    """Write chaos.* figures for this seed into a results.json (other figures kept)."""
    data: dict[str, Any] = {"results": []}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
    params = {
        "seed": v["seed"],
        "duration_s": v["duration_s"],
        "shm": v["shm"],
        "max_in_flight": v.get("max_in_flight"),
        "broker": v.get("broker", "embedded"),
        "verdict": v["verdict"],
    }
    mine = [
        {
            "name": f"chaos.{k}",
            "unit": u,
            "value": v[k],
            "baseline": None,
            "baseline_value": None,
            "ratio": None,
            "goal": g,
            "params": params,
        }
        for k, u, g in (
            ("missing", "records", 0),
            ("duplicates", "records", 0),
            ("accepted", "records", None),
            ("dropped", "records", None),
            ("max_latency_s", "s", None),
            ("degraded_s", "s", None),
        )
    ]
    keep = [
        r
        for r in data.get("results", [])
        if not (
            r["name"].startswith("chaos.")
            and r.get("params", {}).get("seed") == v["seed"]
            and r.get("params", {}).get("broker", "embedded") == params["broker"]
        )
    ]
    data["results"] = keep + mine
    path.write_text(json.dumps(data, indent=2) + "\n")
