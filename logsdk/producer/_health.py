"""The health thread: probes of the cluster, with backoff, and the stall detector.

Invariants owned here:
- while DEGRADED, the cluster is probed with a fresh client; ``recovery_probes`` good
  probes in a row within one outage (``_epoch``) ask the pump for a recovery; a failed
  probe waits a jittered, doubling backoff (from ``_BACKOFF_START_S`` up to
  ``probe_backoff_max_s``), except while flush() or close() wait for Kafka
  (``_urgent``): then it probes again within 0.1 s;
- a probe never outlives close()'s deadline by more than 0.2 s (``_probe_timeout``);
- while ONLINE or RECOVERING, records in flight with no acknowledgement for
  ``stall_timeout_s`` ask for a degrade, and so do two failed probes in a row of the
  live client;
- every ``_SLOT_SCAN_S`` it looks for slots of ``spool_dir`` that other processes left
  with records (:mod:`logsdk.producer._process`).
"""

from __future__ import annotations

import logging
import random
import threading
import time

from logsdk.producer import _client
from logsdk.producer._core import State
from logsdk.producer._process import _Processes

log = logging.getLogger("logsdk.producer")

# The backoff's jitter comes from os.urandom: the health thread must not draw from the
# application's global `random` state behind its back, and forked workers must not share
# one sequence (a private random.Random would be copied by fork: a herd again).
_JITTER = random.SystemRandom()
_SLOT_SCAN_S = 10.0  # how often free slots of spool_dir are looked at for leftovers
_BACKOFF_START_S = 0.1  # the health thread's first pause after a failed probe (doubles)


class _Health(_Processes):
    """The health thread (a part of :class:`LogProducer`)."""

    def _init_health(self) -> None:
        self._urgent = 0
        self._health_wake = threading.Event()
        self._close_deadline = None

    def _hurry(self, delta: int) -> None:
        with self._lock:
            self._urgent += delta
        self._health_wake.set()

    def _health_loop(self) -> None:
        cfg = self.config
        good = bad = 0
        backoff = _BACKOFF_START_S
        next_probe = time.monotonic()
        epoch = -1  # the degrade whose probes ``good`` counts
        next_scan = time.monotonic() + _SLOT_SCAN_S
        while not self._stop.is_set():
            state = self._state
            now = time.monotonic()
            if now >= next_scan and not self._closing:
                next_scan = now + _SLOT_SCAN_S
                try:
                    self._scan_slots()
                except Exception:  # a bug: say so, keep probing
                    self._errors.add("slot_drain")
                    log.exception("logsdk: looking for slots left by other processes failed")
            if state in (State.ONLINE, State.RECOVERING):
                backoff, good = _BACKOFF_START_S, 0
                busy = self._outstanding() > 0 or self._replay_inflight
                if busy and now - max(self._last_ack, self._last_idle) > cfg.stall_timeout_s:
                    self._request_degrade(
                        f"no acknowledgement for {cfg.stall_timeout_s:g}s with records in flight"
                    )
                elif state is State.ONLINE and now >= next_probe:
                    client = self._client
                    # No client yet (nothing sent): nothing to probe through.
                    ok = client is None or _client.client_probe(
                        client, self._topic, cfg.probe_timeout_s, self._stop
                    )
                    if ok and client is not None:
                        self._answered = True
                    bad = 0 if ok else bad + 1
                    if bad >= 2:
                        self._request_degrade("health probe failed twice")
                        bad = 0
                    next_probe = time.monotonic() + cfg.probe_interval_s
                self._stop.wait(0.1)
            elif state is State.DEGRADED:
                if self._epoch != epoch:  # a new outage: earlier probes do not count
                    epoch, good, bad, backoff = self._epoch, 0, 0, _BACKOFF_START_S
                if _client.probe(
                    cfg.probe_config(), self._topic, self._probe_timeout(), self._stop
                ):
                    self._answered = True
                    good += 1
                    backoff = _BACKOFF_START_S
                    if good >= cfg.recovery_probes:
                        good = 0
                        self._want_recover = epoch
                        self._wake.set()
                    self._stop.wait(0.1)
                else:
                    good = 0
                    delay = backoff * (0.5 + _JITTER.random())  # jitter: no thundering herd
                    backoff = min(backoff * 2, cfg.probe_backoff_max_s)
                    if self._urgent:
                        # flush() or close() waits for Kafka: probe again now. (A probe
                        # of an unreachable cluster lasts its timeout, which paces them.)
                        delay = min(delay, 0.1)
                    self._health_wake.wait(delay)
                    self._health_wake.clear()
            else:
                self._stop.wait(0.1)

    def _probe_timeout(self) -> float:
        """A probe's timeout: ``probe_timeout_s``, within what close() has left (>= 0.2 s)."""
        t = self.config.probe_timeout_s
        deadline = self._close_deadline
        if deadline is not None:
            t = min(t, max(0.2, deadline - time.monotonic()))
        return t
