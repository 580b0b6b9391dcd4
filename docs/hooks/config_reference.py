"""MkDocs hook: the configuration reference follows the code.

In ``configuration.md`` the tables of ``LogProducer``, ``KafkaHandler`` and ``LogConsumer``
settings keep their hand-written meanings, but their names and defaults come from the code
(``ProducerConfig``'s fields, the signatures of ``KafkaHandler.__init__`` and
``LogConsumer.__init__``): a default is written
from the code at every build, and a setting missing from a table, or a row naming no
setting, fails the build.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

from logsdk import LogConsumer
from logsdk.integrations.logging import KafkaHandler
from logsdk.producer._config import ProducerConfig

_ROW = re.compile(r"^\| `([a-z_]+)`((?:, `[a-z_]+`)*) \| ([^|]*) \|(.*)$")
_REQUIRED = object()


def _show(value: Any) -> str:
    if value is _REQUIRED:
        return "required"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20:
        if value % (1 << 30) == 0:
            return f"{value >> 30} GiB"
        if value % (1 << 20) == 0:
            return f"{value >> 20} MiB"
    if isinstance(value, dict) and not value:
        return "`{}`"
    return f"`{value!r}`"


def _producer_defaults() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ProducerConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = _REQUIRED
    return out


def _signature_defaults(init: Any) -> dict[str, Any]:
    """The named parameters of ``init`` and their defaults (``**kwargs`` left out)."""
    return {
        name: _REQUIRED if p.default is inspect.Parameter.empty else p.default
        for name, p in inspect.signature(init).parameters.items()
        if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
    }


def _consumer_defaults() -> dict[str, Any]:
    return _signature_defaults(LogConsumer.__init__)


def _fill(markdown: str, heading: str, defaults: dict[str, Any]) -> str:
    """Rewrite the default column of the table that follows ``heading``."""
    start = markdown.index(heading)
    lines = markdown[start:].split("\n")
    seen: set[str] = set()
    out = []
    in_table = False
    for i, line in enumerate(lines):
        if line.startswith("| setting"):
            in_table = True
        elif in_table and not line.startswith("|"):
            rest = "\n".join(lines[i:])
            break
        m = _ROW.match(line) if in_table else None
        if m:
            names = [m.group(1), *re.findall(r"`([a-z_]+)`", m.group(2))]
            unknown = [n for n in names if n not in defaults]
            if unknown:
                raise ValueError(f"configuration.md names settings the code lacks: {unknown}")
            seen.update(names)
            shown = _show(defaults[names[0]])
            line = f"| {', '.join(f'`{n}`' for n in names)} | {shown} |{m.group(4)}"
        out.append(line)
    else:
        rest = ""
    missing = sorted(set(defaults) - seen)
    if missing:
        raise ValueError(f"configuration.md: {heading!r} does not describe {missing}")
    return markdown[:start] + "\n".join(out) + "\n" + rest


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != "configuration.md":
        return markdown
    markdown = _fill(markdown, "`LogProducer(", _producer_defaults())
    markdown = _fill(markdown, "`KafkaHandler(", _signature_defaults(KafkaHandler.__init__))
    return _fill(markdown, "`LogConsumer(", _consumer_defaults())
