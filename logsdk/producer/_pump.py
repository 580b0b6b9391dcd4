"""The pump thread and the producer's state machine.

The states say where new records go: Kafka (ONLINE), the spool (DEGRADED), or behind the
spool while it is replayed (RECOVERING). Only the pump thread moves the machine, and only
through ``_transition``, which checks the move against this table and logs it once:

============  ==========  ============  =============================================
from          event       to            what the pump does on the way
============  ==========  ============  =============================================
ONLINE        FAILURE     DEGRADED      ``_degrade``: send() stops producing; the
                                        client is retired, every record it held comes
                                        back (``_failed``) and goes to the spool
RECOVERING    FAILURE     DEGRADED      the same; the replay starts again from the
                                        spool's first row next time
DEGRADED      RECOVER     RECOVERING    ``_start_recovery``: pending records spooled, a
                                        new client, the replay begins
RECOVERING    DRAINED     ONLINE        ``_recover_step``: the spool is empty; the
                                        backlog is handed over in order, then send()
                                        produces directly again
============  ==========  ============  =============================================

FAILURE comes from any thread as ``_request_degrade(reason)`` (a failed delivery,
produce, poll or probe, a stall, a full ring); RECOVER from the health thread once
``recovery_probes`` probes in a row succeeded in the current outage (``_epoch``), or at
start when the spool holds records of an earlier run; DRAINED from the pump itself. A
producer starts ONLINE (empty spool) or DEGRADED with a recovery asked for; CLOSED is set
by close() once the pump has stopped.

Invariants owned here:
- only the pump thread changes the state, polls the client (so delivery reports run
  there) and touches the spool; other threads only ask (``_want_degrade``,
  ``_want_recover``, ``_wake``);
- a request for recovery from an earlier outage is ignored (``_epoch``);
- records reach Kafka in send order per partition: once the backlog is in use, every
  newer record goes through it (``_direct`` is off), and the spool drains before it;
- the pump never logs while it holds ``_lock`` (a logging framework's own lock may be held
  by a thread waiting for ``_lock`` in send()): its lines wait in ``_deferred_logs``.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Mapping

from logsdk._owner import Owner
from logsdk._resolver import resolver_ready
from logsdk.errors import SpoolError
from logsdk.producer._core import State
from logsdk.producer._replay import _Replay

log = logging.getLogger("logsdk.producer")


class Event(str, enum.Enum):
    """What moves the state machine (see the table above)."""

    FAILURE = "FAILURE"
    RECOVER = "RECOVER"
    DRAINED = "DRAINED"


#: (state, event) -> the next state; any other pair is a bug.
TRANSITIONS: Mapping[tuple[State, Event], State] = {
    (State.ONLINE, Event.FAILURE): State.DEGRADED,
    (State.RECOVERING, Event.FAILURE): State.DEGRADED,
    (State.DEGRADED, Event.RECOVER): State.RECOVERING,
    (State.RECOVERING, Event.DRAINED): State.ONLINE,
}


class _Pump(_Replay):
    """The pump thread and the state machine (a part of :class:`LogProducer`)."""

    def _init_pump(self) -> None:
        self._pump_owner = Owner(f"the pump state of producer {self.producer_id}")
        self._state = State.DEGRADED
        self._transitions = 0
        self._degraded_s = 0.0
        self._degraded_since = time.monotonic()
        self._last_idle = time.monotonic()
        self._deferred_logs = []
        self._request_lock = threading.Lock()
        self._want_degrade = None
        self._epoch = 0
        self._want_recover = None
        self._wake = threading.Event()
        self._stop = threading.Event()

    def _pump_loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self._step()
                self._flush_logs()
            except Exception:  # a bug: say so loudly, keep the records, keep pumping
                self._errors.add("pump")
                log.exception("logsdk pump step failed; retrying (records stay buffered)")
                self._stop.wait(0.5)
                continue
            with self._done:
                self._done.notify_all()
            if not busy:
                client = self._client
                try:
                    if client is not None:
                        client.poll(0.01)
                        self._polled()
                    else:
                        self._wake.wait(0.01)
                except Exception:  # poll() may raise a fatal client error: degrade
                    self._errors.add("pump")
                    log.exception("librdkafka poll failed; replacing the client")
                    self._request_degrade("poll failed")
                self._wake.clear()

    def _step(self) -> bool:
        """One round of work; True when there may be more to do right away."""
        self._pump_owner.check("run a pump step")
        self._reserve_ahead()
        client = self._client
        if client is not None:
            client.poll(0)
            self._polled()
        if self._zombies:
            self._poll_retired()
        reason = None
        if self._want_degrade is not None:
            with self._request_lock:
                reason, self._want_degrade = self._want_degrade, None
        if reason is not None and self._state is not State.DEGRADED:
            self._degrade(reason)
        self._settle_spool()
        if self._shm_pressure:
            self._relieve_shm()
        state = self._state
        busy = False
        if state is State.ONLINE:
            busy = self._drain_backlog_to_client()
            if self._outstanding() == 0:
                self._last_idle = time.monotonic()
        elif state is State.DEGRADED:
            if self._want_recover == self._epoch:
                self._want_recover = None
                self._start_recovery()
            else:
                busy = self._spool_pending()
        elif state is State.RECOVERING:
            busy = self._recover_step()
        return busy

    def _transition(self, event: Event, reason: str) -> None:
        """Move the state machine on ``event`` (the one place that does), and log the move
        once: deferred while the caller holds ``_lock`` (see ``_deferred_logs``)."""
        self._pump_owner.check("move the state machine")
        old = self._state
        new = TRANSITIONS.get((old, event))
        if new is None:  # a bug: the pump reports it and retries the step
            raise RuntimeError(f"no transition from {old.value} on {event.value}")
        now = time.monotonic()
        if old is State.DEGRADED:
            self._degraded_s += now - self._degraded_since
        elif new is State.DEGRADED:
            self._degraded_since = now
        self._state = new
        self._transitions += 1
        level = logging.WARNING if new is State.DEGRADED else logging.INFO
        self._deferred_logs.append(
            (level, "logsdk producer %s -> %s: %s", (old.value, new.value, reason))
        )

    def _flush_logs(self) -> None:
        """Write the deferred log lines (pump thread, never holding _lock)."""
        while self._deferred_logs:
            level, msg, args = self._deferred_logs.pop(0)
            log.log(level, msg, *args)

    def _degrade(self, reason: str) -> None:
        """Take the client away: every record it holds comes back and goes to the spool."""
        with self._lock:
            self._direct = False
            self._epoch += 1
            self._transition(Event.FAILURE, reason)
        self._flush_logs()
        # The purge's reports see whether this client was talking to Kafka (what it hands
        # back as queued may then have been sent: see _client.possibly_persisted).
        self._retire_client()
        self._answered = False
        # The purge's own failure reports asked for a degrade: this one. Left pending, the
        # request would end the next recovery at its first step.
        with self._request_lock:
            self._want_degrade = None
        self._replay_inflight.clear()
        self._restart_replay()

    def _start_recovery(self) -> None:
        self._spool_pending()  # what is already failed goes first
        if self._failed:
            return  # the disk refused them: stay DEGRADED (records in memory) and retry
        if not resolver_ready():
            return  # no client can connect from this process; the health thread re-asks
        self._client = self._new_client()
        self._connect(self._client)
        self._restart_replay()
        self._pace.reset()
        reason = (
            "replaying the spool left by an earlier run"
            if self._transitions == 0
            else f"{self.config.recovery_probes} good probes"
        )
        self._transition(Event.RECOVER, reason)
        self._last_idle = time.monotonic()

    def _recover_step(self) -> bool:
        """Replay the spool; when it is empty, hand the backlog over and go ONLINE."""
        cfg = self.config
        with self._lock:
            over = len(self._backlog) - cfg.buffer_max_records // 2
        if over > 0:
            # The backlog waits behind the spool; keep memory bounded by spilling its head.
            self._spool_pending(limit=over)
        if self._spool.count > 0 or self._replay_inflight:
            return self._replay_some()
        if self._failed:
            return False
        # The gauges say the spool is empty: the table must agree before the backlog may
        # go ahead of its rows (a wrong count would leave them behind for good).
        try:
            if self._spool.holds_rows():
                return self._replay_some()
        except SpoolError as exc:
            self._disk_alarm(exc, "read")
            return False
        # Spool drained: the backlog (all newer than anything replayed) goes next.
        with self._lock:
            while self._backlog:
                if not self._produce_backlog_rec(self._backlog[0]):
                    return True
                self._backlog.popleft()
            self._direct = True
            self._transition(Event.DRAINED, "spool drained")
            self._space.notify_all()
        return False

    def _drain_backlog_to_client(self) -> bool:
        """ONLINE with a backlog (librdkafka was full): feed it in order, then go direct."""
        if self._direct:
            # Read without _lock: the pump steps after every poll, and taking the lock each
            # time made it queue behind send(), which holds it most of the time. Only send()
            # and the pump change _direct; a send() that just turned it off sets _wake.
            return False
        if self._client is None:
            return False  # not made yet: send() makes it with the first record
        with self._lock:
            if self._direct or not self._backlog:
                if not self._direct and not self._backlog:
                    self._direct = True
                return False
            if len(self._backlog) > self.config.buffer_max_records:
                self._request_degrade("local queue full beyond buffer_max_records")
                return True
            while self._backlog:
                if not self._produce_backlog_rec(self._backlog[0]):
                    return False
                self._backlog.popleft()
            self._direct = True
            self._space.notify_all()
        return False
