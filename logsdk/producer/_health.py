"""The health thread: probes of the cluster, with backoff, and the stall detector.

Invariants owned here:
- while DEGRADED, the cluster is probed with a fresh client; ``recovery_probes`` good
  probes in a row within one outage (the pump's ``epoch``) ask the pump for a recovery; a
  failed probe waits a jittered, doubling backoff (from ``_BACKOFF_START_S`` up to
  ``probe_backoff_max_s``), except while flush() or close() wait for Kafka (``hurry``):
  then it probes again within 0.1 s;
- a probe gives up within 0.1 s of close()'s stop, and never outlives close()'s deadline
  by more than 0.2 s (``_probe_timeout``);
- while ONLINE or RECOVERING, records in flight with no acknowledgement for
  ``stall_timeout_s`` ask for a degrade, and so do two failed probes in a row of the
  live client;
- at its start and every ``_SLOT_SCAN_S`` it looks for slots of ``spool_dir`` that
  other processes left with records (`logsdk.producer._drains`: drained only
  while Kafka answers).

What to do next is decided by `decide()`, a pure step: from what the thread saw this
round (`Seen`: the time, the state, the outage, progress, a probe's outcome) and
what it remembers (`Memory`: good and bad probes, the backoff, when to probe and
scan next), it returns the next memory and what to do (`Action`). The thread only
observes, carries the action out, and waits.

Owner: the health thread, for its memory; `Health.hurry()` and `Health.close_by()`
are for flush()/close() (any thread), under ``_lock``.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from logsdk.producer import _client
from logsdk.producer._config import ProducerConfig
from logsdk.producer._counters import Counters
from logsdk.producer._inflight import InFlight
from logsdk.producer._pump import Pump, State
from logsdk.producer._replay import Replayer

log = logging.getLogger("logsdk.producer")

# The backoff's jitter comes from os.urandom: the health thread must not draw from the
# application's global `random` state behind its back, and forked workers must not share
# one sequence (a private random.Random would be copied by fork: a herd again).
_JITTER = random.SystemRandom()
_SLOT_SCAN_S = 10.0  # how often free slots of spool_dir are looked at for leftovers
_BACKOFF_START_S = 0.1  # the health thread's first pause after a failed probe (doubles)
#: The pause between rounds while nothing asks for another (and after a good probe).
TICK_S = 0.1


@dataclass(frozen=True)
class Rules:
    """What the decisions depend on, fixed when the health thread is made."""

    stall_timeout_s: float
    probe_interval_s: float
    probe_backoff_max_s: float
    recovery_probes: int
    backoff_start_s: float = _BACKOFF_START_S
    scan_every_s: float = _SLOT_SCAN_S

    @classmethod
    def of(cls, config: ProducerConfig) -> Rules:
        """The rules of a producer with ``config`` (and the module's constants as they are
        now)."""
        return cls(
            stall_timeout_s=config.stall_timeout_s,
            probe_interval_s=config.probe_interval_s,
            probe_backoff_max_s=config.probe_backoff_max_s,
            recovery_probes=config.recovery_probes,
            backoff_start_s=_BACKOFF_START_S,
            scan_every_s=_SLOT_SCAN_S,
        )


@dataclass(frozen=True)
class Seen:
    """What the health thread observed this round."""

    now: float
    state: State
    #: The pump's outage count (each degrade starts a new one).
    epoch: int
    #: Records in flight (fresh or replayed).
    in_flight: bool
    #: When Kafka last acknowledged something, or nothing was in flight (the later).
    progress: float
    #: close() began: no more slot scans.
    closing: bool
    #: flush() or close() wait for Kafka: no backoff after a failed probe.
    urgent: bool
    #: A live client to probe through (ONLINE; none before the first send()).
    client: bool
    #: A draw in [0, 1) for the backoff's jitter.
    jitter: float
    #: The probe this round asked for, once made: True if Kafka answered. None before.
    probe: bool | None = None


@dataclass(frozen=True)
class Memory:
    """What the health thread remembers between rounds."""

    good: int = 0  # good probes in a row in the current outage
    bad: int = 0  # failed probes in a row of the live client
    backoff: float = _BACKOFF_START_S
    next_probe: float = float("-inf")
    epoch: int = -1  # the outage whose probes ``good`` counts
    next_scan: float = float("-inf")  # at once: the constructor starts no drain


@dataclass(frozen=True)
class Action:
    """What to do this round, in this order: scan the free slots, probe, ask the pump for
    a degrade or a recovery, note that Kafka answered, then wait."""

    memory: Memory
    scan: bool = False
    #: Probe through the live client, or with a fresh one (then decide again with the
    #: outcome in ``Seen.probe``).
    probe: Literal["client", "fresh"] | None = None
    degrade: str | None = None
    recover: int | None = None  # the outage to recover from
    answered: bool = False
    wait: float = TICK_S
    #: The wait ends early when flush() or close() hurry the thread.
    wakeable: bool = False


def decide(rules: Rules, memory: Memory, seen: Seen) -> Action:
    """The health thread's next step (pure: see the module docstring)."""
    if seen.probe is not None:
        return _probed(rules, memory, seen, seen.probe)
    m = memory
    scan = seen.now >= m.next_scan and not seen.closing
    if scan:
        m = dataclasses.replace(m, next_scan=seen.now + rules.scan_every_s)
    if seen.state in (State.ONLINE, State.RECOVERING):
        m = dataclasses.replace(m, backoff=rules.backoff_start_s, good=0)
        if seen.in_flight and seen.now - seen.progress > rules.stall_timeout_s:
            why = f"no acknowledgement for {rules.stall_timeout_s:g}s with records in flight"
            return Action(m, scan, degrade=why)
        if seen.state is State.ONLINE and seen.now >= m.next_probe:
            if seen.client:
                return Action(m, scan, probe="client")
            # No client yet (nothing sent): nothing to probe through, nothing failed.
            m = dataclasses.replace(m, bad=0, next_probe=seen.now + rules.probe_interval_s)
        return Action(m, scan)
    if seen.state is State.DEGRADED:
        if seen.epoch != m.epoch:  # a new outage: earlier probes do not count
            m = dataclasses.replace(
                m, epoch=seen.epoch, good=0, bad=0, backoff=rules.backoff_start_s
            )
        return Action(m, scan, probe="fresh")
    return Action(m, scan)


def _probed(rules: Rules, m: Memory, seen: Seen, ok: bool) -> Action:
    """The outcome of the probe `decide()` asked for in the state ``seen.state``."""
    if seen.state is State.DEGRADED:  # a fresh client's probe
        if ok:
            good = m.good + 1
            if good >= rules.recovery_probes:
                m = dataclasses.replace(m, good=0, backoff=rules.backoff_start_s)
                return Action(m, answered=True, recover=m.epoch)
            return Action(
                dataclasses.replace(m, good=good, backoff=rules.backoff_start_s), answered=True
            )
        delay = m.backoff * (0.5 + seen.jitter)  # jitter: no thundering herd
        if seen.urgent:
            # flush() or close() waits for Kafka: probe again now. (A probe of an
            # unreachable cluster lasts its timeout, which paces them.)
            delay = min(delay, TICK_S)
        backoff = min(m.backoff * 2, rules.probe_backoff_max_s)
        return Action(dataclasses.replace(m, good=0, backoff=backoff), wait=delay, wakeable=True)
    # A probe through the live client (ONLINE).
    bad = 0 if ok else m.bad + 1
    degrade = None
    if bad >= 2:
        degrade, bad = "health probe failed twice", 0
    m = dataclasses.replace(m, bad=bad, next_probe=seen.now + rules.probe_interval_s)
    return Action(m, answered=ok, degrade=degrade)


class Health:
    """The health thread (see the module docstring)."""

    def __init__(
        self,
        config: ProducerConfig,
        pump: Pump,
        flight: InFlight,
        replay: Replayer,
        counters: Counters,
        stop: threading.Event,
        scan_slots: Callable[[], None],
        closing: Callable[[], bool],
    ) -> None:
        self._config = config
        self._rules = Rules.of(config)
        self._pump = pump
        self._flight = flight
        self._replay = replay
        self._counters = counters
        self._stop = stop
        self._scan_slots = scan_slots
        self._closing = closing
        self._lock = threading.Lock()  # a leaf lock: _urgent
        self._urgent = 0  # flush() or close() waiting for Kafka: probe without backoff
        self._wake = threading.Event()
        #: Set by close(): probes end by then. Published.
        self._close_deadline: float | None = None
        self._thread = threading.Thread(target=self._run, name="logsdk-health", daemon=True)

    def start(self) -> None:
        """Start the thread (the producer's start, after the pump's)."""
        self._thread.start()

    def hurry(self, delta: int) -> None:
        """flush()/close() start (+1) or stop (-1) waiting for Kafka (any thread)."""
        with self._lock:
            self._urgent += delta
        self._wake.set()

    def close_by(self, deadline: float) -> None:
        """close() began: probes end by ``deadline`` (any thread)."""
        self._close_deadline = deadline

    def wake(self) -> None:
        """End a backoff wait now (close(), after the producer's stop is set)."""
        self._wake.set()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the thread to end; True if it did (or never ran)."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _probe_timeout(self) -> float:
        """A probe's timeout: ``probe_timeout_s``, within what close() has left (>= 0.2 s)."""
        t = self._config.probe_timeout_s
        deadline = self._close_deadline
        if deadline is not None:
            t = min(t, max(0.2, deadline - time.monotonic()))
        return t

    def _see(self) -> Seen:
        pump, flight = self._pump, self._flight
        return Seen(
            now=time.monotonic(),
            state=pump.state,
            epoch=pump.epoch,
            in_flight=flight.outstanding() > 0 or bool(self._replay.inflight),
            progress=max(flight.last_ack, pump.last_idle),
            closing=self._closing(),
            urgent=self._urgent > 0,
            client=flight.client is not None,
            jitter=_JITTER.random(),
        )

    def _probe(self, how: Literal["client", "fresh"]) -> bool | None:
        """Probe the cluster: True if it answered; None when the live client to probe
        through is gone (retired since it was seen)."""
        cfg = self._config
        if how == "fresh":
            return _client.probe(cfg.probe_config(), cfg.topic, self._probe_timeout(), self._stop)
        client = self._flight.client
        if client is None:
            return None
        return _client.client_probe(client, cfg.topic, cfg.probe_timeout_s, self._stop)

    def _run(self) -> None:
        rules, memory = self._rules, Memory(backoff=self._rules.backoff_start_s)
        requests, flight = self._pump.requests, self._flight
        while not self._stop.is_set():
            seen = self._see()
            act = decide(rules, memory, seen)
            if act.scan:
                try:
                    self._scan_slots()
                except Exception:  # a bug: say so, keep probing
                    self._counters.error("slot_drain")
                    log.exception("logsdk: looking for slots left by other processes failed")
                # What the scan took (probes, at most a few seconds) may have changed
                # what is in flight: the state and the time stay as seen.
                seen = dataclasses.replace(
                    seen,
                    in_flight=flight.outstanding() > 0 or bool(self._replay.inflight),
                    progress=max(flight.last_ack, self._pump.last_idle),
                    client=flight.client is not None,
                )
                act = decide(rules, act.memory, seen)
            if act.probe is not None:
                ok = self._probe(act.probe)
                seen = dataclasses.replace(
                    seen, now=time.monotonic(), urgent=self._urgent > 0, jitter=_JITTER.random()
                )
                if ok is None:  # no client any more: as if there had been none
                    act = decide(rules, act.memory, dataclasses.replace(seen, client=False))
                else:
                    act = decide(rules, act.memory, dataclasses.replace(seen, probe=ok))
            memory = act.memory
            if act.answered:
                flight.answered_probe()
            if act.degrade is not None:
                requests.degrade(act.degrade)
            if act.recover is not None:
                requests.recover(act.recover)
            if act.wakeable:
                self._wake.wait(act.wait)
                self._wake.clear()
            else:
                self._stop.wait(act.wait)
