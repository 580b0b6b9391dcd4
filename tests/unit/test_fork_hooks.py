"""logsdk._fork: the collector is paused across fork() and comes back as it was, in the
parent and in the child; a client logsdk made is kept alive in the child."""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Callable

import pytest

from logsdk import _fork

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)


def _in_child(check: Callable[[], bool]) -> int:
    """Fork; the child runs ``check`` and leaves with 0 when it returns True."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if check() else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_as_it_was_on_both_sides_of_a_fork(enabled: bool) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        assert _in_child(lambda: gc.isenabled() is enabled) == 0
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_a_client_alive_at_the_fork_is_kept_in_the_child_only() -> None:
    held = {"client": _fork.Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})}
    ref = weakref.ref(held["client"])

    def child() -> bool:
        held.clear()  # the child's last reference: the client must not be destroyed
        gc.collect()
        return ref() is not None

    try:
        assert _in_child(child) == 0
    finally:
        held.clear()  # let go even when the child failed: no client left connecting
    gc.collect()
    assert ref() is None  # in the parent, a client let go is freed as usual


def test_fork_waits_while_a_locked_descriptor_is_being_registered() -> None:
    """While another thread holds the fork guard (opening a spool's LOCK or a shm segment
    and registering it, so that a child can close its copy), fork() waits for it; the child
    finds the guard free."""
    import threading

    held, release = threading.Event(), threading.Event()
    order: list[str] = []

    def opener() -> None:
        with _fork.fork_guard:
            held.set()
            release.wait(10)
            order.append("registered")

    t = threading.Thread(target=opener)
    t.start()
    held.wait(10)
    threading.Timer(0.3, release.set).start()
    code = _in_child(lambda: _fork.fork_guard.acquire(blocking=False))
    order.append("forked")
    t.join(10)
    assert code == 0
    assert order == ["registered", "forked"]
    assert _fork.fork_guard.acquire(blocking=False)
    _fork.fork_guard.release()
