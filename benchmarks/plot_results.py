"""The benchmark figures with a goal, as a picture: each ratio against raw
confluent-kafka (or raw SQLite) and its goal, from benchmarks/results.json.

    python benchmarks/plot_results.py [--results benchmarks/results.json]
        [--png docs/img/benchmark-ratios.png]

One bar per figure that has a ratio and a goal (the last entry of a figure wins, as the
results file is appended run after run; a figure is its name and its record size, since
some names were written once per size); a bar that meets its goal is green (a rate at
or above it, a cost per record or call at or below it), else red; the goal is drawn as
a tick. Each bar's label says which way is better and the run it comes from (its date,
else its commit, as the entry records them). matplotlib (``make plots``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _size(row: dict) -> str:
    size = row.get("params", {}).get("value_bytes")
    if size is None:
        return ""
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def figures(path: Path) -> list[dict]:
    rows = json.loads(path.read_text())["results"]
    latest = {
        (r["name"], _size(r)): r for r in rows if r.get("ratio") is not None and r.get("goal")
    }
    return [latest[k] for k in sorted(latest)]


def lower_is_better(row: dict) -> bool:
    """A goal is a floor (ratio >= goal) for a rate; a ceiling for a cost (time per unit)."""
    if row.get("params", {}).get("lower_is_better"):
        return True
    return str(row["unit"]).startswith(("µs", "us/", "s/", "ms"))


def label(row: dict) -> str:
    name = row["name"]
    size = _size(row)
    # The size is in most names already ("producer.memory.1024b"); say it where it is not.
    if size and not any(t in name.lower() for t in ("1024b", "200b", "kib")):
        name += f" ({size})"
    params = row.get("params", {})
    run = params.get("date") or (f"commit {params['commit']}" if params.get("commit") else "")
    way = "lower is better" if lower_is_better(row) else "higher is better"
    return f"{name}  [{way}; {run or 'run not dated'}]"


def plot(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 0.38 * len(rows) + 1.4))
    names = [label(r) for r in rows]
    ratios = [r["ratio"] for r in rows]
    met = [
        (x <= r["goal"]) if lower_is_better(r) else (x >= r["goal"])
        for x, r in zip(ratios, rows, strict=True)
    ]
    ax.barh(names, ratios, color=["tab:green" if m else "tab:red" for m in met])
    ax.scatter([r["goal"] for r in rows], names, marker="|", s=300, color="black", label="goal")
    for i, x in enumerate(ratios):
        ax.text(x, i, f" {x:.2f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel(
        "ratio against the raw library (or the peer pipeline)\ndoing the same work, in the same run"
    )
    ax.legend(loc="lower right")
    dates = sorted({r["params"]["date"] for r in rows if r.get("params", {}).get("date")})
    span = "undated runs"
    if dates:
        span = f"runs of {' to '.join(sorted({dates[0], dates[-1]}))}, and undated ones"
    ax.set_title(
        f"logsdk benchmark ratios from benchmarks/results.json\n({span}; green: the goal met)",
        fontsize=10,
    )
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
    plot(rows, args.png)
    print(f"{len(rows)} figures -> {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
