"""Before/after: one benchmark script on two commits, alternating, in the same run.

    python benchmarks/ab.py --before 94317f9 [--after WORKTREE] [--runs 2] [-- script args]

Checks ``--before`` out in a temporary git worktree, then runs ``benchmarks/<script>.py
--json`` (the current tree's script, so both sides do the same work) ``--runs`` times per
side, alternating which side goes first, importing each side's ``logsdk``.
Prints, per figure (and per ratio to its raw baseline, measured in the same round), each
side's values and the ratio of their medians (after / before); ``--json`` writes
them as the last line. A refactor that must not slow the hot path is checked with it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: Runs a script with ``logsdk`` imported from the tree given first: the editable install's
#: finder (on sys.meta_path) would otherwise win over PYTHONPATH and sys.path.
_BOOT = """
import runpy, sys
tree, script = sys.argv[1], sys.argv[2]
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("__editable__")]
sys.path.insert(0, tree)
sys.path.insert(1, script.rsplit("/", 1)[0])  # the script's own helpers (benchmarks/_brokers.py)
import logsdk
assert logsdk.__file__.startswith(tree), logsdk.__file__
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


def run_side(tree: Path, script: Path, args: list[str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _BOOT, str(tree), str(script), "--json", *args],
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
                pair = [("before", before), ("after", Path(a.after))]
                for side, tree in pair if i % 2 == 0 else pair[::-1]:  # drift favours neither
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
