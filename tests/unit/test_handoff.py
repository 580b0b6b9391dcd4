"""logsdk.integrations._handoff: items worked in put order on one thread, memory bounded,
drain() meaning "everything put before it was worked", close() counting what it left,
a forked child starting empty, the queue's reader checked as its owner."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from logsdk import _owner
from logsdk.errors import OwnershipError
from logsdk.integrations._handoff import _STOP, Handoff

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)


def test_items_are_worked_in_put_order_per_thread_and_none_is_lost() -> None:
    got: list[tuple[int, int]] = []
    h = Handoff(got.append, bound=100, max_block_s=5.0, name="t-order")

    def sender(t: int) -> None:
        for i in range(5_000):
            assert h.put((t, i))

    threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert h.drain(10.0)
    assert len(got) == 20_000  # drain() returned: every earlier item was worked
    for t in range(4):
        assert [i for tt, i in got if tt == t] == list(range(5_000))
    assert h.close(5.0) == 0
    assert h._thread is None or not h._thread.is_alive()


def _gated() -> tuple[threading.Event, list[Any], Callable[[Any], None]]:
    """A work function that waits at a gate (until the test opens it), then notes its item."""
    gate = threading.Event()
    got: list[Any] = []

    def work(item: Any) -> None:
        gate.wait(10.0)
        got.append(item)

    return gate, got, work


def _until_pending(h: Handoff, n: int) -> None:
    """Poll until ``n`` items wait (the thread took the one before them)."""
    deadline = time.monotonic() + 5
    while h.pending != n:
        assert time.monotonic() < deadline, f"{h.pending} pending, not {n}"
        time.sleep(0.005)


def test_a_full_queue_makes_put_wait_then_refuse_and_frees_as_the_thread_works() -> None:
    gate, got, work = _gated()
    h = Handoff(work, bound=3, max_block_s=0.2, name="t-bound")
    assert h.put(0)  # taken by the thread, which then waits at the gate
    _until_pending(h, 0)
    for i in (1, 2, 3):
        assert h.put(i)
    t0 = time.monotonic()
    assert not h.put(4)  # full: waited about max_block_s, then refused
    assert time.monotonic() - t0 >= 0.19
    waiter_result: list[bool] = []
    waiter = threading.Thread(target=lambda: waiter_result.append(h.put(5)))
    h._max_block_s = 5.0
    waiter.start()
    gate.set()  # the thread works again: the waiting put gets room
    waiter.join(10.0)
    assert waiter_result == [True]
    assert h.drain(5.0)
    assert got == [0, 1, 2, 3, 5]
    assert h.close(5.0) == 0


def test_drain_times_out_while_an_item_is_stuck_and_close_counts_what_it_left() -> None:
    gate, got, work = _gated()
    h = Handoff(work, bound=100, max_block_s=1.0, name="t-close")
    for i in range(10):
        assert h.put(i)
    _until_pending(h, 9)  # item 0 is in work(), at the gate
    assert not h.drain(0.1)
    assert h.close(0.1) == 9  # item 0 is in work(); the nine behind it were never worked
    assert not h.put(99)  # closed: refused
    gate.set()
    time.sleep(0.05)
    assert got in ([], [0])  # the item being worked may finish; nothing else runs
    assert h.drain(0.1) is False  # closed with items left: never reported as drained


def test_drain_of_a_handoff_never_used_is_immediate() -> None:
    h = Handoff(lambda _: None, bound=1, max_block_s=0.0, name="t-idle")
    assert h.drain(0.0)
    assert h.close(0.0) == 0


def test_an_item_that_makes_work_raise_is_counted_and_the_rest_go_on() -> None:
    got: list[int] = []

    def work(i: int) -> None:
        if i == 3:
            raise ValueError("bad item")
        got.append(i)

    h = Handoff(work, bound=100, max_block_s=1.0, name="t-raise")
    for i in range(6):
        h.put(i)
    assert h.drain(5.0)
    assert got == [0, 1, 2, 4, 5]
    assert h.failed == 1
    h.close(1.0)


def test_a_forked_child_starts_empty_with_a_thread_of_its_own() -> None:
    gate, got, work = _gated()
    h = Handoff(work, bound=100, max_block_s=1.0, name="t-fork")
    h.put("parent-0")
    h.put("parent-1")  # queued behind the stuck one at the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            gate.set()  # the child's copy of the event: no thread of the parent's here
            ok = h.pending == 0 and h.put("child") and h.drain(5.0)
            os.write(w, repr(got).encode())
            code = 0 if ok else 3
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    seen = os.read(r, 1000).decode()
    os.close(r)
    assert os.waitstatus_to_exitcode(status) == 0
    assert seen == "['child']"  # the parent's items were not worked in the child
    gate.set()
    assert h.drain(5.0)
    assert got == ["parent-0", "parent-1"]
    h.close(1.0)


def test_only_the_handoff_thread_works_the_queue() -> None:
    h = Handoff(lambda _: None, bound=10, max_block_s=1.0, name="t-owner")
    h.put(1)
    assert h.drain(5.0)
    was = _owner.checking()
    _owner.enable(True)
    try:
        with pytest.raises(OwnershipError, match="work the hand-over queue"):
            h._run()
    finally:
        _owner.enable(was)
        _owner.violations(clear=True)
        h.close(1.0)


def test_an_item_that_lands_behind_the_stop_is_counted_as_left() -> None:
    """A put that saw the hand-over open just before close() can land behind the stop:
    never worked, and counted by close(), not lost silently."""

    class LateSender(queue.SimpleQueue):  # type: ignore[type-arg]
        def put(self, item: object, block: bool = True, timeout: float | None = None) -> None:
            super().put(item)
            if item is _STOP:
                super().put(2)  # the late sender's item, after the stop

    got: list[int] = []
    h = Handoff(got.append, bound=100, max_block_s=1.0, name="t-late")
    h._q = LateSender()
    h.put(1)
    assert h.close(5.0) == 1
    assert got == [1]
    assert h.drain(0.1) is False
