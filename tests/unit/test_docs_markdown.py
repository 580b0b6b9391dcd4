"""Markdown in docs/ that renders as written: a list after a blank line, table rows with
their header's cells."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md"))
ITEM = re.compile(r"^(?:[-*]|\d+\.) ")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def test_a_list_follows_a_blank_line() -> None:
    """A list right under a paragraph's line renders as that paragraph's text
    (" - item - item"): Python-Markdown needs a blank line before it."""
    found = []
    for path in PAGES:
        prev = ""
        for n, line in prose_lines(path):
            after_text = prev.strip() and not prev.startswith((" ", "|", "!!!", ">"))
            if ITEM.match(line) and after_text and not ITEM.match(prev):
                found.append(f"{path.relative_to(ROOT)}:{n}")
            prev = line
    assert found == [], found


def cells(row: str) -> int:
    # A pipe inside inline code or escaped does not separate cells.
    row = re.sub(r"`[^`]*`", "``", row.replace("\\|", ""))
    return row.strip().strip("|").count("|") + 1


def test_table_rows_have_their_headers_cells() -> None:
    """Every row of a table has as many cells as its header (a row of three cells
    under a header of four put its test's path in the "what to do" column)."""
    found = []
    for path in PAGES:
        header = 0
        for n, line in prose_lines(path):
            if not line.startswith("|"):
                header = 0
            elif header == 0:
                header = cells(line)
            elif cells(line) != header:
                found.append(f"{path.relative_to(ROOT)}:{n}: {cells(line)} cells, header {header}")
    assert found == [], "\n".join(found)
