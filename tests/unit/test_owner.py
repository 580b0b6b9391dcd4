"""logsdk._owner: one owning thread per piece of state, checked while tests run."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsdk import _owner
from logsdk.errors import LogSDKError, OwnershipError
from logsdk.spool import Spool
from tests.conftest import exit_codes, wait_until

#: Children forked while the parent's threads read the violations, and how long they all
#: have to raise theirs and leave.
FORKS = 20
CHILDREN_TIMEOUT_S = 20.0


@pytest.fixture(autouse=True)
def _no_leftover_violations() -> Iterator[None]:
    """The violations these tests provoke on purpose are not the plugin's to report."""
    yield
    _owner.violations(clear=True)


def _on_thread(fn: Callable[[], object], name: str = "other") -> BaseException | None:
    """Run ``fn`` on a new thread; what it raised, or None."""
    out: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed back to the test
            out.append(exc)

    t = threading.Thread(target=run, name=name)
    t.start()
    t.join(10)
    return out[0] if out else None


def test_checks_are_on_in_the_test_session() -> None:
    """The pytest plugin turns the checks on, for this process and the ones it starts."""
    assert _owner.checking()


def test_another_thread_is_refused_with_both_threads_named() -> None:
    """A call from a thread that does not own the state raises OwnershipError at once,
    naming the state, what was tried, both threads and where; the violation is kept."""
    owner = _owner.Owner("the thing")
    exc = _on_thread(lambda: owner.check("poke it"), name="intruder")
    assert isinstance(exc, OwnershipError)
    assert isinstance(exc, LogSDKError)
    text = str(exc)
    assert "the thing" in text
    assert "poke it" in text
    assert "'intruder'" in text
    assert f"'{threading.current_thread().name}'" in text
    assert "test_owner.py" in text  # where the call came from
    assert _owner.violations() == [text]
    owner.check("poke it")  # the owner itself may


def test_the_owner_hands_it_on_and_only_the_owner_may() -> None:
    """hand_to() moves ownership; a thread that does not own the state may not take it
    while its owner lives, and may once the owner has ended (as close() takes the spool
    from the pump it joined)."""
    owner = _owner.Owner("the thing")
    ready, release = threading.Event(), threading.Event()

    def hold() -> None:
        ready.set()
        release.wait(10)

    holder = threading.Thread(target=hold, name="holder")
    owner.hand_to(holder)  # by its owner: fine
    assert owner.thread is holder
    holder.start()
    ready.wait(10)
    with pytest.raises(OwnershipError, match="holder"):
        owner.take()  # the holder lives: not ours to take
    with pytest.raises(OwnershipError, match="holder"):
        owner.check("use it")
    assert len(_owner.violations(clear=True)) == 2
    release.set()
    holder.join(10)
    owner.take()  # the holder ended
    assert owner.thread is threading.current_thread()
    owner.check("use it")
    assert _owner.violations() == []


def test_off_means_no_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the switch off (production), nothing is checked and nothing raised."""
    owner = _owner.Owner("the thing")
    monkeypatch.setattr(_owner, "_checking", False)
    assert _on_thread(lambda: owner.check("poke it")) is None
    assert _owner.violations() == []


def test_the_spool_is_its_owners_alone(tmp_path: Path) -> None:
    """A spool used from a thread that does not own it raises (its connection is one
    thread's); handed to that thread, it works there, and back once that thread ended."""
    sp = Spool(tmp_path).open()
    row = ("t", None, b"v", None, 1, 0)
    exc = _on_thread(lambda: sp.append([row]), name="not-the-pump")
    assert isinstance(exc, OwnershipError)
    assert "spool" in str(exc)
    assert "not-the-pump" in str(exc)
    assert sp.count == 0
    _owner.violations(clear=True)

    worker = threading.Thread(target=lambda: sp.append([row]), name="pump")
    sp.owner.hand_to(worker)
    worker.start()
    worker.join(10)
    assert sp.count == 1
    sp.owner.take()
    sp.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_while_threads_read_the_violations_raises_its_own() -> None:
    """Two threads read the violations while the main thread forks: each child's own
    violation raises OwnershipError (the list's lock, held by a parent thread at the fork,
    is never the child's), within a bounded wait."""
    owner = _owner.Owner("state of a thread that is not the child's")
    owner.hand_to(threading.Thread(name="elsewhere"))  # the child's only thread is not it
    stop = threading.Event()
    reads = [0]

    def read() -> None:
        while not stop.is_set():
            _owner.violations()
            reads[0] += 1

    def reads_go_on() -> None:
        n = reads[0]
        wait_until(lambda: reads[0] > n + 20, 10, "the threads' reads", 0.001)

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    pids: list[int] = []
    try:
        for _ in range(FORKS):
            reads_go_on()  # each fork falls while the threads read
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    owner.check("touch it in a forked child")
                except OwnershipError:
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        codes = exit_codes(pids, CHILDREN_TIMEOUT_S)
    assert codes == [0] * FORKS, f"{codes.count(None)} of {FORKS} children hung: {codes}"
