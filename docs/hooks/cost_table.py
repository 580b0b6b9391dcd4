"""MkDocs hook: "what a log call costs" written from benchmarks/results.json.

A page holding the line ``<!-- cost-table: full -->`` (or ``short``) gets, in its place,
the table of the ``peer.*`` figures that ``benchmarks/peer_rsyslog.py`` wrote in
benchmarks/results.json (one run: every pipeline side by side on the same machine and
broker). Each figure is printed as the file holds it, never rounded again; a figure the
file lacks fails the build, so the table cannot drift from the measurement.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results.json"

# (row label, where its figures are: (entry name, "value" or "baseline_value"), per
# column: app wall, app thread CPU, whole pipeline CPU, lines lost, seconds to catch up,
# the slowest call after the outage)
_Cell = tuple[str, str] | None
_ROWS: list[tuple[str, bool, list[_Cell]]] = [
    (
        "`SysLogHandler` (plain line) -> rsyslogd -> Kafka",
        True,
        [
            ("peer.app_wall_us_per_call", "baseline_value"),
            ("peer.app_thread_cpu_us_per_call", "baseline_value"),
            ("peer.pipeline_cpu_us_per_record", "baseline_value"),
            ("peer.shipper_sigkill_lost", "baseline_value"),
            ("peer.outage_caught_up_s", "baseline_value"),
            ("peer.outage_max_call_ms", "baseline_value"),
        ],
    ),
    (
        "`SysLogHandler` + python-json-logger -> rsyslogd -> Kafka",
        False,
        [
            ("peer.app_wall_us_per_call.json_in_app", "baseline_value"),
            ("peer.app_thread_cpu_us_per_call.json_in_app", "baseline_value"),
            ("peer.pipeline_cpu_us_per_record.json_in_app", "baseline_value"),
            None,
            None,
            None,
        ],
    ),
    (
        "logsdk `KafkaHandler`",
        True,
        [
            ("peer.app_wall_us_per_call", "value"),
            ("peer.app_thread_cpu_us_per_call", "value"),
            ("peer.pipeline_cpu_us_per_record", "value"),
            ("peer.shipper_sigkill_lost", "value"),
            ("peer.outage_caught_up_s", "value"),
            ("peer.outage_max_call_ms", "value"),
        ],
    ),
    (
        "logsdk `KafkaHandler(background=True)`",
        True,
        [
            ("peer.app_wall_us_per_call.background", "value"),
            ("peer.app_thread_cpu_us_per_call.background", "value"),
            ("peer.pipeline_cpu_us_per_record.background", "value"),
            ("peer.shipper_sigkill_lost.background", "value"),
            ("peer.outage_caught_up_s.background", "value"),
            ("peer.outage_max_call_ms.background", "value"),
        ],
    ),
    (
        'logsdk `KafkaHandler(delivery="agent")` -> `logsdk agent` -> Kafka',
        True,
        [
            ("peer.app_wall_us_per_call.agent", "value"),
            ("peer.app_thread_cpu_us_per_call.agent", "value"),
            ("peer.pipeline_cpu_us_per_record.agent", "value"),
            ("peer.shipper_sigkill_lost.agent", "value"),
            ("peer.outage_caught_up_s.agent", "value"),
            ("peer.outage_max_call_ms.agent", "value"),
        ],
    ),
    (
        "structlog `JSONRenderer` -> logging -> `SysLogHandler` -> rsyslogd",
        False,
        [
            ("peer.structlog.app_wall_us_per_call", "baseline_value"),
            ("peer.structlog.app_thread_cpu_us_per_call", "baseline_value"),
            ("peer.structlog.pipeline_cpu_us_per_record", "baseline_value"),
            None,
            None,
            None,
        ],
    ),
    (
        "structlog, logsdk `KafkaRenderer(output=False)`",
        False,
        [
            ("peer.structlog.app_wall_us_per_call", "value"),
            ("peer.structlog.app_thread_cpu_us_per_call", "value"),
            ("peer.structlog.pipeline_cpu_us_per_record", "value"),
            None,
            None,
            None,
        ],
    ),
    (
        "loguru, `SysLogHandler` as its sink -> rsyslogd",
        False,
        [
            ("peer.loguru.app_wall_us_per_call", "baseline_value"),
            ("peer.loguru.app_thread_cpu_us_per_call", "baseline_value"),
            ("peer.loguru.pipeline_cpu_us_per_record", "baseline_value"),
            None,
            None,
            None,
        ],
    ),
    (
        "loguru, logsdk `KafkaSink`",
        False,
        [
            ("peer.loguru.app_wall_us_per_call", "value"),
            ("peer.loguru.app_thread_cpu_us_per_call", "value"),
            ("peer.loguru.pipeline_cpu_us_per_record", "value"),
            None,
            None,
            None,
        ],
    ),
]
_TITLES = [
    "pipeline",
    "application's wall time per log call",
    "application thread's CPU per call",
    "whole pipeline's CPU per record (application + rsyslogd)",
    "lines lost when the shipper is SIGKILLed, of 2,000",
    "10 s outage: every line in Kafka, after the broker's return",
    "10 s outage: slowest call after the broker's return",
]
# The home page's table: thread CPU, pipeline CPU, lines lost, catch-up.
_SHORT = (1, 2, 3, 4)
_UNITS = ("µs", "µs", "µs", "", "s", "ms")


def _entries() -> dict[str, dict[str, Any]]:
    results = json.loads(_RESULTS.read_text(encoding="utf-8"))["results"]
    found: dict[str, dict[str, Any]] = {}
    for entry in results:
        if entry["name"].startswith("peer."):
            if entry["name"] in found:
                raise ValueError(f"benchmarks/results.json: {entry['name']} twice")
            found[entry["name"]] = entry
    return found


def _show(value: Any, unit: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        text = f"{value:,}"
    elif isinstance(value, float):
        text = repr(value)
    else:
        raise ValueError(f"benchmarks/results.json: a figure that is not a number: {value!r}")
    return f"{text} {unit}".strip()


def table(short: bool = False) -> str:
    """The comparison as a Markdown table; ``short``: the stdlib pipelines only, in the
    columns of ``_SHORT`` (the home page's width)."""
    entries = _entries()
    columns = _SHORT if short else range(len(_UNITS))
    titles = _TITLES if not short else [_TITLES[0], *(_TITLES[1 + c] for c in columns)]
    lines = ["| " + " | ".join(titles) + " |", "|" + " --- |" * len(titles)]
    for label, in_short, cells in _ROWS:
        if short and not in_short:
            continue
        shown = []
        for c in columns:
            cell, unit = cells[c], _UNITS[c]
            if cell is None:
                shown.append("not measured")
                continue
            name, field = cell
            if name not in entries:
                raise ValueError(f"benchmarks/results.json has no {name}")
            shown.append(_show(entries[name][field], unit))
        lines.append(f"| {label} | {' | '.join(shown)} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    for kind in ("full", "short"):
        marker = f"<!-- cost-table: {kind} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, table(short=kind == "short"))
    return markdown
