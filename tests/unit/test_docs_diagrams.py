"""The producer's state diagrams in the docs draw the pump's own table of transitions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from logsdk.producer._pump import TRANSITIONS, Pump, State

ROOT = Path(__file__).resolve().parents[2]
DIAGRAMS = (ROOT / "docs" / "producer.md", ROOT / "docs" / "engineering" / "design.md")
EDGE = re.compile(r"^\s*(\[\*\]|[A-Z]+)\s*-->\s*([A-Z]+)\b", re.M)


def state_diagram(path: Path) -> str:
    blocks = re.findall(r"```mermaid\n(stateDiagram-v2\n.*?)```", path.read_text(), re.S)
    assert len(blocks) == 1, f"{path}: {len(blocks)} state diagrams"
    return str(blocks[0])


def first_states() -> set[str]:
    """The states Pump.begin() can choose, read from its code."""
    source = (ROOT / "logsdk" / "producer" / "_pump.py").read_text()
    begin = next(
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == Pump.begin.__name__
    )
    return {
        node.value.attr
        for node in ast.walk(begin)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Attribute)
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "State"
    }


def test_state_diagrams_match_the_pumps_transitions() -> None:
    """Every move between ONLINE, DEGRADED and RECOVERING drawn is in the pump's
    TRANSITIONS and every one there is drawn; a producer starts where begin() can put
    it (ONLINE, or DEGRADED: a restart on a spool with records is not RECOVERING); CLOSED
    only by close()."""
    table = {(old.value, new.value) for (old, _), new in TRANSITIONS.items()}
    starts = first_states()
    assert starts == {State.ONLINE.value, State.DEGRADED.value}
    for path in DIAGRAMS:
        edges = set(EDGE.findall(state_diagram(path)))
        moves = {(a, b) for a, b in edges if a != "[*]" and b != "CLOSED"}
        assert moves == table, f"{path.relative_to(ROOT)}: {moves ^ table}"
        assert {b for a, b in edges if a == "[*]"} == starts, path
        assert all(a in table_states(table) for a, b in edges if b == "CLOSED"), path


def table_states(table: set[tuple[str, str]]) -> set[str]:
    return {s for move in table for s in move}


DASHBOARD = ROOT / "dashboards" / "logsdk-grafana.json"
DASHBOARD_PNG = ROOT / "docs" / "img" / "grafana-dashboard.png"


def test_the_dashboard_picture_is_of_this_dashboard() -> None:
    """docs/img/grafana-dashboard.png was drawn (benchmarks/dashboard_picture.py) from the
    dashboard as it is now, every panel with data, and operations.md shows it: a changed
    dashboard needs the picture drawn again."""
    import hashlib
    import json

    drawn = json.loads(DASHBOARD_PNG.with_suffix(".json").read_text())
    assert drawn["dashboard_sha256"] == hashlib.sha256(DASHBOARD.read_bytes()).hexdigest(), (
        "dashboards/logsdk-grafana.json changed since the picture: "
        "python benchmarks/dashboard_picture.py"
    )
    panels = [p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert drawn["panels"] == panels
    assert DASHBOARD_PNG.stat().st_size > 10_000
    assert "img/grafana-dashboard.png" in (ROOT / "docs" / "operations.md").read_text()
