"""MkDocs hook: the benchmark results page written from benchmarks/results.json.

A line ``<!-- results: PREFIX -->`` of a page becomes the table of every figure whose name
starts with ``PREFIX.``: the last entry of each figure (a figure is its name and its record
size; the file is appended run after run), its value, what it was measured against and
that baseline's value, the ratio and its goal, and the run it comes from (its date, else
its commit, as the entry records them). ``<!-- results: chaos -->`` gives one row per
chaos run (seed). Numbers are printed as the file holds them, never rounded again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results.json"
_MARKER = re.compile(r"^<!-- results: ([a-z_]+) -->$", re.M)


def _number(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else repr(value)


def _size(entry: dict[str, Any]) -> str:
    size = entry.get("params", {}).get("value_bytes")
    if size is None:
        return ""
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def _run(entry: dict[str, Any]) -> str:
    params = entry.get("params", {})
    if params.get("date"):
        return str(params["date"]) + (f", {params['commit']}" if params.get("commit") else "")
    return f"commit {params['commit']}" if params.get("commit") else "not dated"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _latest(results: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in results:
        if entry["name"].startswith(prefix + "."):
            latest[(entry["name"], _size(entry))] = entry
    return list(latest.values())


def _table(results: list[dict[str, Any]], prefix: str) -> str:
    rows = _latest(results, prefix)
    if not rows:
        raise ValueError(f"benchmarks/results.json has no {prefix}.* figure")
    lines = [
        "| figure | value | against | its value | ratio (goal) | run |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for e in rows:
        unit = e.get("unit") or ""
        name, size = f"`{e['name']}`", _size(e)
        # The size is in most names already ("producer.memory.1024b"); say it where not.
        if size and not any(t in name.lower() for t in ("1024b", "200b", "kib")):
            name += f" ({size})"
        ratio = _number(e.get("ratio"))
        if e.get("goal") is not None:
            # A goal without a ratio is set on the value itself (send_p99_us <= 50 µs).
            goal = _number(e["goal"])
            ratio = f"{ratio} ({goal})" if ratio else f"goal on the value: {goal}"
        lines.append(
            f"| {name} | {_number(e['value'])} {_cell(unit)} "
            f"| {_cell(e.get('baseline') or '')} | {_number(e.get('baseline_value'))} "
            f"| {ratio} | {_run(e)} |"
        )
    return "\n".join(lines)


def _chaos(results: list[dict[str, Any]]) -> str:
    runs: dict[tuple[Any, ...], dict[str, Any]] = {}
    for e in results:
        if e["name"].startswith("chaos."):
            p = e.get("params", {})
            key = (p.get("seed"), p.get("duration_s"), p.get("commit"), p.get("shm"))
            run = runs.setdefault(key, {"params": p})
            run[e["name"].split(".", 1)[1]] = e["value"]
    if not runs:
        raise ValueError("benchmarks/results.json has no chaos.* figure")
    cols = ("accepted", "dropped", "missing", "duplicates", "max_latency_s", "degraded_s")
    lines = [
        "| seed | seconds | shm | " + " | ".join(cols) + " | verdict | commit |",
        "|" + " --- |" * (len(cols) + 5),
    ]
    for run in runs.values():
        p = run["params"]
        values = " | ".join(_number(run.get(c)) for c in cols)
        lines.append(
            f"| {p.get('seed')} | {_number(p.get('duration_s'))} | {p.get('shm')} | {values} "
            f"| {p.get('verdict', '')} | {p.get('commit', '')} |"
        )
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if "<!-- results: " not in markdown:
        return markdown
    results = json.loads(_RESULTS.read_text(encoding="utf-8"))["results"]

    def fill(m: re.Match[str]) -> str:
        prefix = m.group(1)
        return _chaos(results) if prefix == "chaos" else _table(results, prefix)

    return _MARKER.sub(fill, markdown)
