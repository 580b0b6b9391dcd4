"""The pump's state machine (``Pump.transition`` against ``TRANSITIONS``) and ``Requests``,
tested alone: real parts on a temporary spool, the pump's thread never started."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsdk.producer._pump import TRANSITIONS, Event, Requests, State
from tests.unit.producer_parts import (
    FakeClock,
    Parts,
    StandInClient,
    fake_clock,
    parts_factory,
    queue,
    queued,
    rec,
)

PAIRS = list(itertools.product(State, Event))


@pytest.fixture
def make_parts(tmp_path: Path) -> Iterator[Callable[..., Parts]]:
    with parts_factory(tmp_path) as make:
        yield make


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return fake_clock(monkeypatch)


def test_the_table_names_only_states_and_events_of_the_machine() -> None:
    """The table has the four moves of the module docstring, and CLOSED is in none of them."""
    assert set(TRANSITIONS) == {
        (State.ONLINE, Event.FAILURE),
        (State.RECOVERING, Event.FAILURE),
        (State.DEGRADED, Event.RECOVER),
        (State.RECOVERING, Event.DRAINED),
    }
    assert State.CLOSED not in {s for s, _ in TRANSITIONS} | set(TRANSITIONS.values())


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=[f"{s.value}-{e.value}" for s, e in PAIRS])
def test_transition_moves_the_pairs_of_the_table_and_refuses_every_other(
    make_parts: Callable[..., Parts],
    caplog: pytest.LogCaptureFixture,
    state: State,
    event: Event,
) -> None:
    """Every (state, event): a pair of TRANSITIONS moves to its state and is counted; any
    other raises RuntimeError and leaves the state, the count and the log as they were."""
    pump = make_parts().pump
    pump.begin(state)
    caplog.set_level(logging.INFO, logger="logsdk.producer")
    if (state, event) in TRANSITIONS:
        pump.transition(event, "a test")
        assert pump.state is TRANSITIONS[(state, event)]
        assert pump.transitions == 1
        pump.flush_logs()
        assert len(caplog.records) == 1
    else:
        with pytest.raises(
            RuntimeError, match=f"no transition from {state.value} on {event.value}"
        ):
            pump.transition(event, "a test")
        assert pump.state is state
        assert pump.transitions == 0
        pump.flush_logs()
        assert not caplog.records  # nothing logged for a move that did not happen


def test_a_walk_through_the_machine_counts_each_move(make_parts: Callable[..., Parts]) -> None:
    """A walk ONLINE -> DEGRADED -> RECOVERING -> DEGRADED -> RECOVERING -> ONLINE counts
    five transitions; a refused move in the middle counts none."""
    pump = make_parts().pump
    pump.begin(State.ONLINE)
    walk = [Event.FAILURE, Event.RECOVER, Event.FAILURE, Event.RECOVER, Event.DRAINED]
    for n, event in enumerate(walk, 1):
        pump.transition(event, "step")
        assert pump.transitions == n
        if n == 2:
            with pytest.raises(RuntimeError):
                pump.transition(Event.RECOVER, "twice")
    assert pump.state is State.ONLINE
    assert pump.transitions == len(walk)


def test_degraded_time_grows_only_while_degraded(
    clock: FakeClock, make_parts: Callable[..., Parts]
) -> None:
    """degraded_s() adds the time spent DEGRADED and nothing else: not while ONLINE or
    RECOVERING, and it never goes back."""
    pump = make_parts().pump
    pump.begin(State.ONLINE)  # as a producer with an empty spool starts
    clock.advance(5)
    assert pump.degraded_s() == 0.0
    pump.transition(Event.FAILURE, "down")
    clock.advance(3)
    assert pump.degraded_s() == 3.0
    clock.advance(2)
    pump.transition(Event.RECOVER, "probes")
    assert pump.degraded_s() == 5.0
    clock.advance(7)  # recovering: not degraded
    assert pump.degraded_s() == 5.0
    pump.transition(Event.FAILURE, "again")
    clock.advance(1.5)
    assert pump.degraded_s() == 6.5
    pump.transition(Event.RECOVER, "probes")
    pump.transition(Event.DRAINED, "drained")
    clock.advance(100)
    assert pump.degraded_s() == 6.5


def test_degraded_time_is_kept_when_the_producer_closes_degraded(
    clock: FakeClock, make_parts: Callable[..., Parts]
) -> None:
    """A producer closed while DEGRADED keeps the time of that last outage in degraded_s()
    (it went back to the time of the earlier outages: CLOSED bypasses the table)."""
    pump = make_parts().pump
    pump.begin(State.ONLINE)
    pump.transition(Event.FAILURE, "down")
    clock.advance(4)
    before = pump.degraded_s()
    pump.mark_closed()
    clock.advance(10)
    assert pump.state is State.CLOSED
    assert pump.degraded_s() == before == 4.0


def test_the_log_line_of_a_move_is_deferred_until_flush_logs(
    make_parts: Callable[..., Parts], caplog: pytest.LogCaptureFixture
) -> None:
    """A move made under the send lock writes nothing then; flush_logs() writes its one
    line (a warning for DEGRADED, info otherwise), once."""
    p = make_parts()
    pump = p.pump
    pump.begin(State.ONLINE)
    caplog.set_level(logging.INFO, logger="logsdk.producer")
    with p.intake.lock:
        pump.transition(Event.FAILURE, "broker gone")
    pump.transition(Event.RECOVER, "3 good probes")
    assert not caplog.records
    pump.flush_logs()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "logsdk producer ONLINE -> DEGRADED: broker gone"),
        (logging.INFO, "logsdk producer DEGRADED -> RECOVERING: 3 good probes"),
    ]
    pump.flush_logs()
    assert len(caplog.records) == 2


# -- Requests --------------------------------------------------------------------------


def test_the_first_degrade_reason_wins_until_taken() -> None:
    """Asks for a degrade keep the first reason until the pump takes it; then the next
    ask's reason is the one taken. Every ask wakes the pump."""
    req = Requests()
    assert req.take_degrade() is None
    req.degrade("delivery failed")
    req.degrade("stall")
    assert req.wake.is_set()
    assert req.take_degrade() == "delivery failed"
    assert req.take_degrade() is None
    req.degrade("poll failed")
    assert req.take_degrade() == "poll failed"


def test_a_recover_for_an_older_epoch_is_dropped() -> None:
    """A recovery asked for an outage that is over (an older epoch) is taken and dropped;
    one for the current epoch is taken once."""
    req = Requests()
    assert not req.take_recover(0)
    req.recover(1)
    assert not req.take_recover(2)  # asked during outage 1; outage 2 began since
    assert not req.take_recover(1)  # dropped, not kept for later
    req.recover(2)
    assert req.wake.is_set()
    assert req.take_recover(2)
    assert not req.take_recover(2)


def _asked_from_many_threads(ask: Callable[[int, int], None], take: Callable[[], object]) -> None:
    """8 threads ask 1000 times each while this thread takes in a loop, once more after
    they all ended. Each ask is stamped before it starts, each take after it returned: a
    take that returned after the last ask began must have seen something (that ask's, or
    one still pending when it was made), whatever the interleaving."""
    stamps = itertools.count()  # next() is atomic under the GIL
    ask_began = [-1] * 8
    start = threading.Barrier(9)

    def asker(i: int) -> None:
        start.wait()
        for k in range(1000):
            ask_began[i] = next(stamps)
            ask(i, k)

    threads = [threading.Thread(target=asker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    start.wait()
    seen_at = -1  # when the last take that saw something returned
    while True:
        done = not any(t.is_alive() for t in threads)
        if take():
            seen_at = next(stamps)
        if done:
            break
    for t in threads:
        t.join()
    assert seen_at > max(ask_began)


def test_degrades_asked_from_many_threads_lose_nothing_the_pump_must_see() -> None:
    """8 threads ask for degrades while the pump takes in a loop: a take after the last ask
    sees one; no reason is taken twice, and one thread's reasons are taken in its order
    (first reason wins: an older one cannot be pending behind a newer one)."""
    req = Requests()
    taken: list[str] = []

    def take() -> bool:
        reason = req.take_degrade()
        if reason is not None:
            taken.append(reason)
        return reason is not None

    _asked_from_many_threads(lambda i, k: req.degrade(f"{i}:{k}"), take)
    assert len(taken) == len(set(taken))
    for i in range(8):
        ks = [int(r.split(":")[1]) for r in taken if r.startswith(f"{i}:")]
        assert ks == sorted(ks)


def test_recoveries_asked_from_many_threads_lose_nothing_the_pump_must_see() -> None:
    """8 threads ask for a recovery of the current outage while the pump takes in a loop:
    a take after the last ask sees it."""
    req = Requests()
    _asked_from_many_threads(lambda i, k: req.recover(3), lambda: req.take_recover(3))


def test_an_online_backlog_is_fed_in_order_and_one_past_the_buffer_asks_for_a_degrade(
    make_parts: Callable[..., Parts],
) -> None:
    """ONLINE with direct sends off (librdkafka was full), the pump feeds the backlog to the
    client in send order, chunk by chunk, then turns direct sends on again. A backlog past
    ``buffer_max_records`` (librdkafka is taking nothing) is left as it is, and a degrade
    is asked for: the spool takes it."""
    parts = make_parts(buffer_max_records=600)
    pump, intake = parts.pump, parts.intake
    pump.begin(State.ONLINE)
    client = StandInClient()
    parts.flight.install(client)  # type: ignore[arg-type]
    intake.close_direct()
    queue(parts, range(500))
    while pump.drain_backlog_to_client():
        pass
    assert [c.value for c in client.calls] == [rec(s)[2] for s in range(500)]
    assert [c.headers[-1] for c in client.calls] == [("logsdk.seq", b"%d" % s) for s in range(500)]
    assert queued(parts) == []
    assert pump.drain_backlog_to_client() is False  # empty: direct sends are on again
    assert intake.direct
    assert parts.requests.take_degrade() is None

    intake.close_direct()
    queue(parts, range(500, 1101))  # 601: past the buffer
    assert pump.drain_backlog_to_client() is True
    assert parts.requests.take_degrade() == "local queue full beyond buffer_max_records"
    assert len(queued(parts)) == 601  # nothing fed
    assert len(client.calls) == 500
    with intake.lock:
        assert intake.held() == 601
