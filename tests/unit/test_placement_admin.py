"""The live-cluster side without a broker: an unreachable bootstrap is a clear PlacementError."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from logsdk.errors import PlacementError
from logsdk.placement import apply_plan, read_cluster
from logsdk.testing import free_port


def test_unreachable_bootstrap_names_the_address_and_the_wait() -> None:
    """read_cluster on a closed port raises PlacementError within about its timeout."""
    bootstrap = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(PlacementError, match=rf"cannot read the cluster at {bootstrap}: no answer"):
        read_cluster(bootstrap, timeout=0.5)
    assert time.monotonic() - started < 10


def test_apply_on_unreachable_bootstrap_is_a_placement_error() -> None:
    """apply_plan reads the cluster first: the same error, not concurrent.futures.TimeoutError."""
    with pytest.raises(PlacementError, match=r"no answer within 0\.5 s"):
        apply_plan(f"127.0.0.1:{free_port()}", {"t": {0: [0]}}, timeout=0.5)


def test_cli_describe_unreachable_prints_the_reason() -> None:
    """describe --bootstrap on a closed port exits 1 with a message (it printed an empty one)."""
    out = subprocess.run(
        [
            *(sys.executable, "-m", "logsdk.cli", "placement", "describe"),
            *("--bootstrap", f"127.0.0.1:{free_port()}", "--timeout", "0.5"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "logsdk: error: cannot read the cluster at 127.0.0.1:" in out.stderr
