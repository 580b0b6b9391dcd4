"""The benchmark figures with a goal, as a picture: each ratio against raw
confluent-kafka (or raw SQLite) and its goal, from benchmarks/results.json.

    python benchmarks/plot_results.py [--results benchmarks/results.json]
        [--png docs/img/benchmark-ratios.png]

One bar per figure that has a ratio and a goal (the last entry of a name wins, as the
results file is appended run after run); a bar that meets its goal is green (a rate at
or above it, a cost per record or call at or below it), else red; the goal is drawn as
a tick. matplotlib (``make plots``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figures(path: Path) -> list[dict]:
    rows = json.loads(path.read_text())["results"]
    latest = {r["name"]: r for r in rows if r.get("ratio") is not None and r.get("goal")}
    return sorted(latest.values(), key=lambda r: r["name"])


def plot(rows: list[dict], png: Path, when: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.38 * len(rows) + 1.2))
    names = [r["name"] for r in rows]
    ratios = [r["ratio"] for r in rows]
    # A goal is a floor (ratio >= goal) for a rate; a ceiling for a cost (time per unit).
    ceiling = [str(r["unit"]).startswith(("µs", "s/", "ms")) for r in rows]
    met = [
        (x <= r["goal"]) if c else (x >= r["goal"])
        for x, r, c in zip(ratios, rows, ceiling, strict=True)
    ]
    ax.barh(names, ratios, color=["tab:green" if m else "tab:red" for m in met])
    ax.scatter([r["goal"] for r in rows], names, marker="|", s=300, color="black", label="goal")
    for i, x in enumerate(ratios):
        ax.text(x, i, f" {x:.2f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio against the raw library doing the same work, in the same run")
    ax.legend(loc="lower right")
    ax.set_title(f"logsdk benchmark ratios ({when})", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results.json")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "benchmark-ratios.png")
    args = ap.parse_args(argv)
    rows = figures(args.results)
    when = str(json.loads(args.results.read_text()).get("date", "results.json"))
    plot(rows, args.png, when)
    print(f"{len(rows)} figures -> {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
