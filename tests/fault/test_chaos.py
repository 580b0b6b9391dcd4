"""The short chaos run (60 s, fixed seed): nothing lost, nothing repeated."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]


def test_chaos_60s_seed_1_loses_nothing() -> None:
    """Producers, a consumer group and a nemesis for 60 s: missing 0, duplicates 0."""
    out = subprocess.run(
        [sys.executable, "-m", "logsdk.testing.chaos", "--duration", "60", "--seed", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, out.stdout + out.stderr
    verdict = json.loads(lines[-1])
    assert verdict["accepted"] > 10_000
    assert verdict["events"], "the nemesis did nothing"
    assert verdict["missing"] == 0, verdict
    assert verdict["duplicates"] == 0, verdict
    assert verdict["order_violations"] == 0, verdict
    assert verdict["verdict"] == "ok"
    assert out.returncode == 0
