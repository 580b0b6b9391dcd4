"""Every example runs: `make demo` end to end, counted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_demo_loses_nothing() -> None:
    """examples/demo.py (make demo): broker and consumer killed, lost 0, duplicates 0."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: nothing lost, nothing repeated" in out.stdout
    lines = {ln.split()[0]: ln.split() for ln in out.stdout.splitlines() if ln.startswith("  ")}
    assert lines["lost"][-1] == "0"
    assert lines["duplicates"][-1] == "0"
    assert int(lines["spooled"][-1]) > 0  # the outage really happened mid-stream
