"""Who may use a part: its owning thread only (checked in every test run). The parts are
built on the test's thread; a call from any other thread raises OwnershipError and
changes nothing; once handed to the pump's thread, the builder may not use them either.
The violations provoked here on purpose are cleared by each test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from logsdk import _owner
from logsdk.errors import OwnershipError, SpoolError
from logsdk.producer._pump import Event, State
from tests.unit.producer_parts import Parts, StandInClient, parts_factory, queue, queued, seqs_of


@pytest.fixture
def make_parts(tmp_path: Path) -> Iterator[Callable[..., Parts]]:
    with parts_factory(tmp_path) as make:
        yield make


def stand_in() -> Any:
    """A stand-in client, where the parts expect confluent_kafka's Producer."""
    return StandInClient()


def on_thread(fn: Callable[[], object], name: str = "intruder") -> BaseException | None:
    """Run ``fn`` on a new thread; what it raised, or None."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed back to the test
            raised.append(exc)

    t = threading.Thread(target=run, name=name)
    t.start()
    t.join(30)
    return raised[0] if raised else None


#: Calls only the owner of the part may make, and what the refusal names.
OWNED: dict[str, tuple[Callable[[Parts], object], str]] = {
    "Pump.transition": (lambda p: p.pump.transition(Event.FAILURE, "x"), "move the state"),
    "Pump.step": (lambda p: p.pump.step(), "run a pump step"),
    "Custody.spool_pending": (lambda p: p.custody.spool_pending(0), "commit records"),
    "Replayer.replay_some": (lambda p: p.replay.replay_some(stand_in()), "replay the spool"),
    "Replayer.settle": (lambda p: p.replay.settle(True, True), "settle the spool"),
    "DiskAlarm.failed": (lambda p: p.alarm.failed(SpoolError("x"), "write"), "disk alarm"),
    "SeqReserver.reserve_ahead": (lambda p: p.seqs.reserve_ahead(p.intake), "reserve seqs"),
    "InFlight.polled": (lambda p: p.flight.polled(), "serve delivery reports"),
    "InFlight.retire": (lambda p: p.flight.retire(), "retire the client"),
    "Spool": (lambda p: p.spool.read_after(0, 1), "SQLite connection"),
}


@pytest.mark.parametrize("call", list(OWNED))
def test_a_thread_that_does_not_own_a_part_is_refused(
    make_parts: Callable[..., Parts], call: str
) -> None:
    """Each owned operation, called from a thread other than the owner: OwnershipError
    naming what it tried and both threads, kept in the violations; nothing changed."""
    p = make_parts()
    p.pump.begin(State.ONLINE)
    queue_seqs = [1, 2]
    queue(p, queue_seqs)
    p.seqs.reserve_ahead(p.intake)  # the owner may
    fn, what = OWNED[call]
    exc = on_thread(lambda: fn(p))
    assert isinstance(exc, OwnershipError)
    assert what in str(exc)
    assert "'intruder'" in str(exc)
    assert f"'{threading.current_thread().name}'" in str(exc)
    assert p.pump.state is State.ONLINE
    assert p.pump.transitions == 0
    assert queued(p) == queue_seqs
    assert p.spool.count == 0
    assert p.alarm.reason is None
    assert len(_owner.violations(clear=True)) == 1


def test_parts_handed_to_the_pump_thread_are_its_own_until_taken_back(
    make_parts: Callable[..., Parts],
) -> None:
    """Handed on as Pump.start() hands them: the pump's thread runs a step (its records go
    to the spool); meanwhile the builder's thread is refused the custody's commits and
    the replay; once the pump's thread has ended, take_back() makes them the builder's
    again."""
    p = make_parts()
    p.pump.begin(State.DEGRADED)
    queue(p, [1, 2, 3])
    stepped, go = threading.Event(), threading.Event()

    def pump() -> None:
        p.pump.step()
        stepped.set()
        go.wait(30)

    t = threading.Thread(target=pump, name="pump-stand-in")
    for owner in (p.pump.owner, p.spool.owner, p.seqs.owner, p.flight.owner):
        owner.hand_to(t)
    t.start()
    try:
        assert stepped.wait(30)
        with pytest.raises(OwnershipError, match="'pump-stand-in'"):
            p.custody.spool_pending(0)
        with pytest.raises(OwnershipError, match="'pump-stand-in'"):
            p.replay.replay_some(stand_in())
    finally:
        go.set()
        t.join(30)
    assert len(_owner.violations(clear=True)) == 2
    p.pump.take_back()
    assert seqs_of(p.spool) == [1, 2, 3]  # the pump's step spooled them (DEGRADED)
    queue(p, [4])
    assert not p.custody.spool_pending(0)  # the builder's again
    assert seqs_of(p.spool) == [1, 2, 3, 4]
    assert _owner.violations() == []
