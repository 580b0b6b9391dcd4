"""Shared helpers for the test suite (the fixtures come from logsdk.testing.pytest_plugin)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Producer settings that make fault tests quick: probes and stalls on a short leash.
FAST: dict[str, Any] = {
    "stall_timeout_s": 3.0,
    "probe_interval_s": 0.2,
    "probe_timeout_s": 1.0,
    "probe_backoff_max_s": 0.5,
    "kafka_config": {"reconnect.backoff.max.ms": 200},
}


def wait_until(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> None:
    """Poll ``cond`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)
