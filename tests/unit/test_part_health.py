"""The health thread's decisions alone: ``decide`` is a pure step from what the thread saw
(the time, the state, the outage, progress, a probe's outcome) and what it remembers, to
what it does next. No thread, no clock, no broker: each rule on its own inputs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from logsdk.producer._health import TICK_S, Action, Memory, Rules, Seen, decide
from logsdk.producer._pump import State

RULES = Rules(
    stall_timeout_s=10.0,
    probe_interval_s=1.0,
    probe_backoff_max_s=5.0,
    recovery_probes=3,
    backoff_start_s=0.1,
    scan_every_s=10.0,
)


def seen(**kw: Any) -> Seen:
    """What the thread saw: ONLINE at t=100, nothing in flight, not hurried, no client."""
    base = Seen(
        now=100.0,
        state=State.ONLINE,
        epoch=0,
        in_flight=False,
        progress=100.0,
        closing=False,
        urgent=False,
        client=False,
        jitter=0.5,
    )
    return dataclasses.replace(base, **kw)


def scanned(memory: Memory | None = None, now: float = 100.0) -> Memory:
    """The memory (a fresh one by default) once the first scan is done (at ``now``)."""
    return dataclasses.replace(memory or Memory(), next_scan=now + RULES.scan_every_s)


# -- the scan of free slots ---------------------------------------------------------------


def test_the_free_slots_are_looked_at_first_then_every_scan_interval() -> None:
    """The first round scans at once (the constructor started no drain); the next scan
    comes ``scan_every_s`` later; none while close() runs."""
    act = decide(RULES, Memory(), seen())
    assert act.scan
    assert not decide(RULES, act.memory, seen(now=109.9)).scan
    assert decide(RULES, act.memory, seen(now=110.0)).scan
    assert not decide(RULES, act.memory, seen(now=110.0, closing=True)).scan


# -- ONLINE and RECOVERING: the stall detector, the live client's probes ------------------


@pytest.mark.parametrize("state", [State.ONLINE, State.RECOVERING])
def test_records_in_flight_without_progress_for_the_stall_timeout_ask_for_a_degrade(
    state: State,
) -> None:
    """Records in flight and no acknowledgement (nor an idle moment) for more than
    ``stall_timeout_s``: a degrade, saying why; at the limit, or with nothing in flight,
    none."""
    m = scanned()
    act = decide(RULES, m, seen(state=state, in_flight=True, now=110.5, progress=100.0))
    assert act.degrade == "no acknowledgement for 10s with records in flight"
    assert act.probe is None
    assert decide(RULES, m, seen(state=state, in_flight=True, now=110.0)).degrade is None
    assert decide(RULES, m, seen(state=state, in_flight=False, now=500.0)).degrade is None


def test_online_probes_through_the_live_client_every_probe_interval() -> None:
    """ONLINE with a client: a probe through it, then the next one ``probe_interval_s``
    after it returned; a good one says Kafka answered. Without a client (nothing sent) no
    probe, and the interval starts again."""
    act = decide(RULES, scanned(), seen(client=True))
    assert act.probe == "client"
    done = decide(RULES, act.memory, seen(client=True, now=100.3, probe=True))
    assert done.answered
    assert done.degrade is None
    assert done.wait == TICK_S
    assert done.memory.next_probe == pytest.approx(101.3)
    assert decide(RULES, done.memory, seen(client=True, now=101.0)).probe is None
    assert decide(RULES, done.memory, seen(client=True, now=101.3)).probe == "client"
    idle = decide(RULES, scanned(), seen(client=False))
    assert idle.probe is None
    assert idle.memory.next_probe == 101.0


def test_two_failed_probes_of_the_live_client_in_a_row_ask_for_a_degrade() -> None:
    """One failed probe is tolerated; the second in a row asks for a degrade (and the
    count starts again); a good probe between them resets it."""
    m = scanned()
    first = decide(RULES, m, seen(client=True, probe=False))
    assert first.degrade is None
    assert not first.answered
    second = decide(RULES, first.memory, seen(client=True, now=101.0, probe=False))
    assert second.degrade == "health probe failed twice"
    assert second.memory.bad == 0
    good = decide(RULES, first.memory, seen(client=True, now=101.0, probe=True))
    again = decide(RULES, good.memory, seen(client=True, now=102.0, probe=False))
    assert again.degrade is None


def test_recovering_does_not_probe() -> None:
    """RECOVERING: the replay's acknowledgements are the progress; no probe."""
    act = decide(RULES, scanned(), seen(state=State.RECOVERING, client=True))
    assert act == Action(act.memory)


# -- DEGRADED: fresh probes, the recovery, the backoff --------------------------------------


def test_degraded_probes_with_a_fresh_client_and_recovers_after_enough_good_probes() -> None:
    """DEGRADED: each round probes with a fresh client; ``recovery_probes`` good probes in
    a row in the same outage ask for a recovery of that outage, once."""
    m = scanned()
    for i in range(RULES.recovery_probes):
        act = decide(RULES, m, seen(state=State.DEGRADED, epoch=4))
        assert act.probe == "fresh"
        act = decide(RULES, act.memory, seen(state=State.DEGRADED, epoch=4, probe=True))
        assert act.answered
        assert act.wait == TICK_S
        m = act.memory
        last = i == RULES.recovery_probes - 1
        assert act.recover == (4 if last else None)
    assert m.good == 0


def test_good_probes_of_an_earlier_outage_do_not_count() -> None:
    """Two good probes, then a new outage (the pump degraded again: a new epoch): the count
    starts from zero, so two more good probes ask for nothing."""
    m = scanned()
    for _ in range(2):
        act = decide(RULES, m, seen(state=State.DEGRADED, epoch=1))
        m = decide(RULES, act.memory, seen(state=State.DEGRADED, epoch=1, probe=True)).memory
    for _ in range(2):
        act = decide(RULES, m, seen(state=State.DEGRADED, epoch=2))
        act = decide(RULES, act.memory, seen(state=State.DEGRADED, epoch=2, probe=True))
        assert act.recover is None
        m = act.memory
    assert m.good == 2


def test_a_failed_probe_waits_a_jittered_doubling_backoff_up_to_its_cap() -> None:
    """After a failed probe: a wait of backoff x (0.5 + jitter) that flush() or close() can
    cut short, the backoff doubling up to ``probe_backoff_max_s``; a good probe resets it;
    the good probes counted so far start again."""
    m = dataclasses.replace(scanned(), good=2, epoch=0)
    waits = []
    for _ in range(8):
        act = decide(RULES, m, seen(state=State.DEGRADED, probe=False, jitter=0.5))
        assert act.wakeable
        assert act.recover is None
        waits.append(act.wait)
        m = act.memory
    assert m.good == 0
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    low = decide(RULES, m, seen(state=State.DEGRADED, probe=False, jitter=0.0))
    assert low.wait == pytest.approx(2.5)
    good = decide(RULES, m, seen(state=State.DEGRADED, probe=True))
    assert good.memory.backoff == RULES.backoff_start_s


def test_flush_or_close_waiting_cut_the_backoff_to_a_tick() -> None:
    """flush() or close() wait for Kafka: a failed probe is followed by another within a
    tick, whatever the backoff (a probe of an unreachable cluster lasts its timeout)."""
    m = dataclasses.replace(scanned(), backoff=4.0)
    act = decide(RULES, m, seen(state=State.DEGRADED, probe=False, urgent=True))
    assert act.wait == TICK_S
    assert act.memory.backoff == 5.0


def test_closed_does_nothing_but_wait() -> None:
    """CLOSED: no probe, no request."""
    act = decide(RULES, scanned(), seen(state=State.CLOSED, in_flight=True, now=105.0))
    assert act == Action(act.memory)


def test_the_rules_come_from_the_config_and_the_module_settings() -> None:
    """A producer's rules: its config's timeouts and counts, and the backoff's start and
    the scan interval as the module has them when the health thread is made."""
    from logsdk.producer._config import ProducerConfig

    cfg = ProducerConfig(
        bootstrap_servers="127.0.0.1:1",
        topic="t",
        spool_dir="/tmp/x",
        stall_timeout_s=3.0,
        probe_interval_s=0.5,
        probe_backoff_max_s=2.0,
        recovery_probes=5,
    )
    rules = Rules.of(cfg)
    assert (rules.stall_timeout_s, rules.probe_interval_s) == (3.0, 0.5)
    assert (rules.probe_backoff_max_s, rules.recovery_probes) == (2.0, 5)
    assert (rules.backoff_start_s, rules.scan_every_s) == (0.1, 10.0)
