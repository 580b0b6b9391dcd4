"""The public names the API reference (docs/api.md) must show, module by module."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Every module of the public API. A module without ``__all__`` counts the classes,
# functions and constants it defines at its top level whose names do not start with "_".
MODULES = (
    "logsdk",
    "logsdk.errors",
    "logsdk.integrations.logging",
    "logsdk.integrations.structlog",
    "logsdk.integrations.loguru",
    "logsdk.integrations.otel",
    "logsdk.sinks",
    "logsdk.metrics",
    "logsdk.testing",
    "spark_sink",
)


def _source(module: str) -> Path:
    path = ROOT / Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _defined(module: str) -> list[str]:
    tree = ast.parse(_source(module).read_text(encoding="utf-8"))
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign) and not _is_logger(node.value):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not n.startswith("_")]


def _is_logger(value: ast.expr) -> bool:
    """``log = logging.getLogger(__name__)``: a module's logger, not an API."""
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "getLogger"
    )


def origins(module: str) -> dict[str, str]:
    """The names ``module`` imports from elsewhere: name -> the module it comes from."""
    tree = ast.parse(_source(module).read_text(encoding="utf-8"))
    return {
        (alias.asname or alias.name): node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def _all(module: str) -> list[str] | None:
    """``module.__all__`` read from its source, without importing its optional extras."""
    tree = ast.parse(_source(module).read_text(encoding="utf-8"))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            return [ast.literal_eval(e) for e in node.value.elts]
    return None


def public_names() -> list[str]:
    """Every public name, fully qualified as the reference documents it (``module.name``)."""
    out = []
    for module in MODULES:
        names = _all(module)
        if names is None:
            names = _defined(module)
        out += [f"{module}.{n}" for n in names]
    return out


def importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
