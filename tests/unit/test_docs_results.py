"""docs/results.md's tables are benchmarks/results.json's latest figures, as held."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.conftest import docs_hook

ROOT = Path(__file__).resolve().parents[2]


def hook() -> ModuleType:
    return docs_hook("results_page")


def test_each_figure_once_with_its_latest_value_as_held() -> None:
    """Every producer, consumer, handler, spark and peer figure has one row (a figure is
    its name and its record size), showing the last entry's value unrounded."""
    page = hook()
    results = json.loads((ROOT / "benchmarks" / "results.json").read_text())["results"]
    markdown = (ROOT / "docs" / "results.md").read_text()
    filled = page.on_page_markdown(markdown, page=None)
    assert "<!-- results:" not in filled
    for prefix in ("producer", "consumer", "handler", "spark", "peer"):
        latest: dict[tuple[str, object], dict[str, Any]] = {}
        for e in results:
            if e["name"].startswith(prefix + "."):
                latest[(e["name"], e["params"].get("value_bytes"))] = e
        table = page._table(results, prefix)
        rows = table.splitlines()[2:]
        assert len(rows) == len(latest), prefix
        for row, e in zip(rows, latest.values(), strict=True):
            assert row.startswith(f"| `{e['name']}`"), row
            value = e["value"]
            shown = f"{value:,}" if isinstance(value, int) else repr(value)
            assert re.search(rf"\| {re.escape(shown)} ", row), (shown, row)
