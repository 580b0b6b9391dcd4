"""`make bench`: run every benchmark script, merge their figures into results.json, print a table.

Each ``benchmarks/<name>.py`` is run as ``python benchmarks/<name>.py --json``; the last
line it prints is ``{"results": [...]}`` (see shared BENCHMARKS.md for the schema).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ["producer", "consumer", "handler", "spark", "placement"]


def scripts() -> list[Path]:
    found = {p.stem: p for p in HERE.glob("*.py") if p.stem not in ("run_all", "_common")}
    ordered = [found.pop(n) for n in ORDER if n in found]
    return ordered + sorted(found.values())


def main(argv: list[str]) -> int:
    results: list[dict[str, object]] = []
    failed = []
    for script in scripts():
        print(f"== {script.name}", flush=True)
        proc = subprocess.run(
            [sys.executable, str(script), "--json", *argv],
            stdout=subprocess.PIPE,
            text=True,
            cwd=HERE.parent,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        if proc.returncode != 0 or not lines:
            failed.append(script.name)
            continue
        results.extend(json.loads(lines[-1])["results"])
    # Figures other commands write here (`make chaos`: chaos.*; peer_rsyslog.py --results:
    # peer.*, when this run has none of its own: rsyslogd not installed) are kept.
    previous: list[dict[str, object]] = []
    with contextlib.suppress(OSError, ValueError):
        previous = json.loads((HERE / "results.json").read_text()).get("results", [])
    mine = {str(r["name"]) for r in results}
    kept = [
        r
        for r in previous
        if str(r["name"]).startswith(("chaos.", "peer.")) and r["name"] not in mine
    ]
    out = {
        "results": results + kept,
        "python": platform.python_version(),
        "date": dt.date.today().isoformat(),
    }
    (HERE / "results.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'name':32} {'value':>14} {'unit':12} {'ratio':>7} {'goal':>6}")
    for r in results:
        ratio, goal = r.get("ratio"), r.get("goal")
        print(
            f"{r['name']:32} {r['value']:>14,.1f} {r['unit']:12} "
            f"{'' if ratio is None else f'{ratio:.3f}':>7} {'' if goal is None else goal!s:>6}"
        )
    if not results:
        print("(no benchmarks yet)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
