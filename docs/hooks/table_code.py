"""MkDocs hook: long code in a table cell breaks where a reader expects it.

A test's path (``tests/fault/test_x.py::test_a_long_name``) in a table cell used to break
every few characters: the theme lets inline code break anywhere, so the browser makes the
column as narrow as one character of it. Here the code of a cell gets break opportunities
(``<wbr>``) after ``/``, ``::`` and ``_`` only, and extra.css lets it break nowhere else,
so the column is as wide as the longest piece between two of them.
"""

from __future__ import annotations

import re
from typing import Any

_CELL = re.compile(r"<td>.*?</td>", re.S)
_CODE = re.compile(r"<code>([^<]{24,})</code>")
_BREAK = re.compile(r"(::|/|_)")


def _code(m: re.Match[str]) -> str:
    return "<code>" + _BREAK.sub(r"\1<wbr>", m.group(1)) + "</code>"


def on_page_content(html: str, **_: Any) -> str:
    return _CELL.sub(lambda cell: _CODE.sub(_code, cell.group(0)), html)
