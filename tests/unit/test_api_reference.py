"""The API reference's coverage and the docstrings' markup, checked from the sources."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.api_names import ROOT, origins, public_names

# A Sphinx role (:class:`X`, :meth:`~a.B.c`, ...) shows raw in the mkdocstrings site: the
# docstrings write Markdown: `code`, or [`Name`][logsdk.Name] to link to the reference.
ROLE = re.compile(r":(?:py:)?(?:meth|class|func|attr|exc|mod|data|obj|const|ref):`")
# reST's "text::" before a literal block shows its "::" in Markdown.
LITERAL = re.compile(r"\S::$|^\s*::$", re.M)


def directives() -> set[str]:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    return set(re.findall(r"^::: ([\w.]+)$", text, re.M))


def test_api_reference_names_every_public_name() -> None:
    """Every public name of the public modules has its own entry in docs/api.md, or the
    module it is defined in is rendered whole there (``logsdk.LogSDKError``: errors)."""
    shown = directives()
    missing = []
    for name in public_names():
        module, short = name.rsplit(".", 1)
        home = origins(module).get(short)
        if not {name, module} & shown and not (home and {f"{home}.{short}", home} & shown):
            missing.append(name)
    assert missing == [], f"docs/api.md lacks {missing}"


def docstrings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    return out


def test_no_sphinx_markup_in_docstrings() -> None:
    """No docstring of logsdk or spark_sink uses a Sphinx role or reST's "::": the API
    reference renders docstrings as Markdown, where both show raw."""
    found = []
    for package in ("logsdk", "spark_sink"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, doc in docstrings(path):
                for m in (*ROLE.finditer(doc), *LITERAL.finditer(doc)):
                    found.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0).strip()}")
    assert found == [], "\n".join(found)
