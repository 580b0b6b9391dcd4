"""Shared helpers for the test suite (the fixtures come from logsdk.testing.pytest_plugin)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from logsdk.testing._settings import FAST_RECOVERY

#: Producer settings that make fault tests quick: probes and stalls on a short leash.
FAST: dict[str, Any] = FAST_RECOVERY


def wait_until(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> None:
    """Poll ``cond`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


class InterruptAfterProduce:
    """A producer client whose ``produce()`` hands the record to the real client, then
    raises KeyboardInterrupt: what a signal handler's exception does when it surfaces as
    the call returns. Every other attribute is the real client's."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def produce(self, *args: Any) -> None:
        self.client.produce(*args)
        raise KeyboardInterrupt

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


#: Tests of 15 s to 90 s each (`--durations`): collected first, so that the xdist workers
#: share them at the start and no worker is left alone with one at the end of a run.
_LONG_FIRST = (
    "tests/fault/test_chaos.py",
    "tests/packaging/",
    "tests/integration/test_benchmarks.py",
    "tests/spark/",
)


def pytest_collection_modifyitems(items: list[Any]) -> None:
    def rank(item: Any) -> int:
        for i, prefix in enumerate(_LONG_FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(_LONG_FIRST)

    items.sort(key=rank)  # stable: the order inside each group is kept
