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
  other processes left with records (:mod:`logsdk.producer._process`: drained only
  while Kafka answers).

Owner: the health thread, for its own loop's state; :meth:`Health.hurry` and
``close_deadline`` are for flush()/close() (any thread), under ``_lock``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from logsdk.producer import _client
from logsdk.producer._config import ProducerConfig
from logsdk.producer._inflight import InFlight
from logsdk.producer._pump import Pump, State
from logsdk.producer._replay import Replayer
from logsdk.producer._tally import Tally

log = logging.getLogger("logsdk.producer")

# The backoff's jitter comes from os.urandom: the health thread must not draw from the
# application's global `random` state behind its back, and forked workers must not share
# one sequence (a private random.Random would be copied by fork: a herd again).
_JITTER = random.SystemRandom()
_SLOT_SCAN_S = 10.0  # how often free slots of spool_dir are looked at for leftovers
_BACKOFF_START_S = 0.1  # the health thread's first pause after a failed probe (doubles)


class Health:
    """The health thread (see the module docstring)."""

    def __init__(
        self,
        config: ProducerConfig,
        pump: Pump,
        flight: InFlight,
        replay: Replayer,
        errors: Tally,
        stop: threading.Event,
        scan_slots: Callable[[], None],
        closing: Callable[[], bool],
    ) -> None:
        self._config = config
        self._pump = pump
        self._flight = flight
        self._replay = replay
        self._errors = errors
        self._stop = stop
        self._scan_slots = scan_slots
        self._closing = closing
        self._lock = threading.Lock()  # a leaf lock: _urgent
        self._urgent = 0  # flush() or close() waiting for Kafka: probe without backoff
        self.wake = threading.Event()
        #: Set by close(): probes end by then. Published.
        self.close_deadline: float | None = None
        self.thread = threading.Thread(target=self._run, name="logsdk-health", daemon=True)

    def hurry(self, delta: int) -> None:
        """flush()/close() start (+1) or stop (-1) waiting for Kafka (any thread)."""
        with self._lock:
            self._urgent += delta
        self.wake.set()

    def _probe_timeout(self) -> float:
        """A probe's timeout: ``probe_timeout_s``, within what close() has left (>= 0.2 s)."""
        t = self._config.probe_timeout_s
        deadline = self.close_deadline
        if deadline is not None:
            t = min(t, max(0.2, deadline - time.monotonic()))
        return t

    def _run(self) -> None:
        cfg, pump, flight = self._config, self._pump, self._flight
        topic = cfg.topic
        good = bad = 0
        backoff = _BACKOFF_START_S
        next_probe = time.monotonic()
        epoch = -1  # the degrade whose probes ``good`` counts
        next_scan = time.monotonic()  # at once: the constructor starts no drain
        while not self._stop.is_set():
            state = pump.state
            now = time.monotonic()
            if now >= next_scan and not self._closing():
                next_scan = now + _SLOT_SCAN_S
                try:
                    self._scan_slots()
                except Exception:  # a bug: say so, keep probing
                    self._errors.add("slot_drain")
                    log.exception("logsdk: looking for slots left by other processes failed")
            if state in (State.ONLINE, State.RECOVERING):
                backoff, good = _BACKOFF_START_S, 0
                busy = flight.outstanding() > 0 or self._replay.inflight
                if busy and now - max(flight.last_ack, pump.last_idle) > cfg.stall_timeout_s:
                    pump.requests.degrade(
                        f"no acknowledgement for {cfg.stall_timeout_s:g}s with records in flight"
                    )
                elif state is State.ONLINE and now >= next_probe:
                    client = flight.client
                    # No client yet (nothing sent): nothing to probe through.
                    ok = client is None or _client.client_probe(
                        client, topic, cfg.probe_timeout_s, self._stop
                    )
                    if ok and client is not None:
                        flight.answered_probe()
                    bad = 0 if ok else bad + 1
                    if bad >= 2:
                        pump.requests.degrade("health probe failed twice")
                        bad = 0
                    next_probe = time.monotonic() + cfg.probe_interval_s
                self._stop.wait(0.1)
            elif state is State.DEGRADED:
                if pump.epoch != epoch:  # a new outage: earlier probes do not count
                    epoch, good, bad, backoff = pump.epoch, 0, 0, _BACKOFF_START_S
                if _client.probe(cfg.probe_config(), topic, self._probe_timeout(), self._stop):
                    flight.answered_probe()
                    good += 1
                    backoff = _BACKOFF_START_S
                    if good >= cfg.recovery_probes:
                        good = 0
                        pump.requests.recover(epoch)
                    self._stop.wait(0.1)
                else:
                    good = 0
                    delay = backoff * (0.5 + _JITTER.random())  # jitter: no thundering herd
                    backoff = min(backoff * 2, cfg.probe_backoff_max_s)
                    if self._urgent:
                        # flush() or close() waits for Kafka: probe again now. (A probe
                        # of an unreachable cluster lasts its timeout, which paces them.)
                        delay = min(delay, 0.1)
                    self.wake.wait(delay)
                    self.wake.clear()
            else:
                self._stop.wait(0.1)
