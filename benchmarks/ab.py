"""Before/after: one benchmark script on two commits, alternating, in the same run.

    python benchmarks/ab.py --before 94317f9 [--after WORKTREE] [--runs 2] [-- script args]

Checks ``--before`` out in a temporary git worktree, then runs ``benchmarks/<script>.py
--json`` (the current tree's script, so both sides do the same work) ``--runs`` times per
side, alternating before/after, with ``PYTHONPATH`` pointing at the side's ``logsdk``.
Prints, per figure (and per ratio to its raw baseline, measured in the same round), each
side's values and the ratio of their medians (after / before); ``--json`` writes
them as the last line. A refactor that must not slow the hot path is checked with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_side(tree: Path, script: Path, args: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = f"import logsdk, sys; assert logsdk.__file__.startswith({str(tree)!r}), logsdk.__file__"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    out = subprocess.run(
        [sys.executable, str(script), "--json", *args],
        env=env,
        cwd=tree,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    last = [ln for ln in out.stdout.splitlines() if ln.strip()][-1]
    figures = {}
    for r in json.loads(last)["results"]:
        figures[r["name"]] = float(r["value"])
        if r.get("ratio") is not None:  # against the raw baseline of the same round
            figures[r["name"] + " (ratio)"] = float(r["ratio"])
    return figures


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="a git revision")
    ap.add_argument("--after", default=str(ROOT), help="a tree (default: this checkout)")
    ap.add_argument("--script", default="producer", help="benchmarks/<script>.py")
    ap.add_argument("--runs", type=int, default=2, help="runs per side")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("args", nargs="*", help="passed to the script (after --)")
    a = ap.parse_args(argv)
    script = ROOT / "benchmarks" / f"{a.script}.py"
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(before), a.before],
            check=True,
        )
        try:
            sides: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for i in range(a.runs):
                for side, tree in (("before", before), ("after", Path(a.after))):
                    print(f"run {i + 1}/{a.runs}: {side}", file=sys.stderr, flush=True)
                    sides[side].append(run_side(tree, script, a.args))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)],
                check=False,
            )
    rows = []
    for name in sides["after"][0]:
        b = [r[name] for r in sides["before"] if name in r]
        f = [r[name] for r in sides["after"] if name in r]
        ratio = statistics.median(f) / statistics.median(b) if b and statistics.median(b) else None
        rows.append({"name": name, "before": b, "after": f, "after_over_before": ratio})
        shown = "" if ratio is None else f"{ratio:.3f}"
        print(f"{name:36} before {b!s:40} after {f!s:40} {shown}")
    if a.json:
        print(json.dumps({"ab": rows, "before": a.before}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
