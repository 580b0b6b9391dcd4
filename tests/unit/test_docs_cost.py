"""docs/cost.md's table ("what a log call costs") is benchmarks/results.json's figures,
and no other user page states a log call's cost of its own."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType

from tests.conftest import docs_hook

ROOT = Path(__file__).resolve().parents[2]


def hook() -> ModuleType:
    return docs_hook("cost_table")


def test_cost_table_prints_results_json_figures_as_held() -> None:
    """Each cell of the table is the results.json entry it names, printed unrounded; the
    page carries the table's marker."""
    cost = hook()
    entries = {
        e["name"]: e
        for e in json.loads((ROOT / "benchmarks" / "results.json").read_text())["results"]
        if e["name"].startswith("peer.")
    }
    rows = cost.table().splitlines()[2:]
    assert len(rows) == len(cost._ROWS)
    for row, (_, _, cells) in zip(rows, cost._ROWS, strict=True):
        shown = [c.strip() for c in row.strip("|").split("|")][1:]
        for text, cell in zip(shown, cells, strict=True):
            if cell is None:
                assert text == "not measured"
                continue
            value = entries[cell[0]][cell[1]]
            figure = f"{value:,}" if isinstance(value, int) else repr(value)
            assert text.split(" ")[0] == figure, (cell, text)
    page = (ROOT / "docs" / "cost.md").read_text()
    assert "<!-- cost-table: full -->" in page


def test_no_other_user_page_states_a_log_calls_cost() -> None:
    """README and the user guide point to docs/cost.md instead of giving per-call figures
    of their own (figures from other runs contradicted each other)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    per_call = re.compile(r"\bcalls?\b[^.\n]{0,60}?\d[\d.]* ?µs|\d[\d.]* ?µs[^.\n]{0,60}?\bcall")
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)}"
        for p in pages
        if p.name != "cost.md"
        for m in per_call.finditer(p.read_text(encoding="utf-8"))
    ]
    assert found == [], found
