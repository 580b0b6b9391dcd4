"""The pump thread and the producer's state machine.

The states say where new records go: Kafka (ONLINE), the spool (DEGRADED), or behind the
spool while it is replayed (RECOVERING). Only the pump thread moves the machine, and only
through `Pump.transition()`, which checks the move against this table and logs it once:

============  ==========  ============  =============================================
from          event       to            what the pump does on the way
============  ==========  ============  =============================================
ONLINE        FAILURE     DEGRADED      ``degrade``: send() stops producing; the
                                        client is retired, every record it held comes
                                        back (custody's ``failed``) and goes to the spool
RECOVERING    FAILURE     DEGRADED      the same; the replay starts again from the
                                        spool's first row next time
DEGRADED      RECOVER     RECOVERING    ``start_recovery``: pending records spooled, a
                                        new client, the replay begins
RECOVERING    DRAINED     ONLINE        ``recover_step``: the spool is empty; the
                                        backlog is handed over in order, then send()
                                        produces directly again
============  ==========  ============  =============================================

FAILURE comes from any thread as ``Requests.degrade(reason)`` (a failed delivery,
produce, poll or probe, a stall, a full ring); RECOVER from the health thread once
``recovery_probes`` probes in a row succeeded in the current outage (``epoch``), or at
start when the spool holds records of an earlier run; DRAINED from the pump itself. A
producer starts ONLINE (empty spool) or DEGRADED with a recovery asked for
(`Pump.begin()`); CLOSED is set by close() once the pump has stopped.

Invariants owned here:
- only the pump thread changes the state, polls the client (so delivery reports run
  there) and touches the spool; other threads only ask (``Requests.degrade``,
  ``Requests.recover``, ``Requests.wake``);
- a request for recovery from an earlier outage is ignored (``epoch``);
- records reach Kafka in send order per partition: once the backlog is in use, every
  newer record goes through it (``Intake.direct`` is off), and the spool drains before it;
- the pump never logs while it holds the send lock (a logging framework's own lock may be
  held by a thread waiting for that lock in send()): its lines wait in ``_deferred``.

Owner: the pump thread (``owner``, handed to it before it starts; close() takes it back
once the thread has ended). ``state``, ``epoch``, ``last_idle`` are published; the
requests are guarded by ``Requests._lock`` (a leaf lock).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException

from logsdk._owner import Owner
from logsdk._resolver import resolver_ready
from logsdk.errors import SpoolError
from logsdk.producer._alarm import DiskAlarm
from logsdk.producer._config import ProducerConfig
from logsdk.producer._counters import Counters
from logsdk.producer._custody import Custody
from logsdk.producer._identity import SeqReserver
from logsdk.producer._inflight import InFlight
from logsdk.producer._intake import Intake
from logsdk.producer._records import Rec
from logsdk.producer._rejects import Rejects
from logsdk.producer._replay import Replayer
from logsdk.spool._spool import Spool

#: Backlog records handed to librdkafka per hold of the send lock by the pump (about
#: 0.5 ms of produce() calls: the longest a sender waits on it).
FEED_CHUNK = 256

log = logging.getLogger("logsdk.producer")


class State(str, enum.Enum):
    """Where new records go: Kafka (ONLINE), the spool (DEGRADED), behind it (RECOVERING)."""

    ONLINE = "ONLINE"
    DEGRADED = "DEGRADED"
    RECOVERING = "RECOVERING"
    CLOSED = "CLOSED"


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


class Requests:
    """What other threads ask of the pump: a degrade (with why), a recovery (for an
    outage, by its epoch), and to wake up. Any thread; a leaf lock guards the two asks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._degrade: str | None = None
        self._recover: int | None = None
        #: Set to wake the pump now (send() sets it when it queued a record).
        self.wake = threading.Event()

    def degrade(self, reason: str) -> None:
        """Ask for a degrade (any thread): the first reason since the pump's last look wins."""
        with self._lock:
            if self._degrade is None:
                self._degrade = reason
        self.wake.set()

    def recover(self, epoch: int) -> None:
        """Ask for a recovery from the outage ``epoch`` (the health thread, or the start)."""
        with self._lock:
            self._recover = epoch
        self.wake.set()

    def take_degrade(self) -> str | None:
        """The pump takes the degrade asked for, if any."""
        if self._degrade is None:
            return None
        with self._lock:
            reason, self._degrade = self._degrade, None
        return reason

    def take_recover(self, epoch: int) -> bool:
        """The pump takes a recovery asked for the outage ``epoch``; an older one is dropped."""
        if self._recover is None:
            return False
        with self._lock:
            asked, self._recover = self._recover, None
        return asked == epoch


class Pump:
    """The pump thread and the state machine (see the module docstring)."""

    def __init__(
        self,
        config: ProducerConfig,
        intake: Intake,
        requests: Requests,
        stop: threading.Event,
        done: threading.Condition,
        owner: Owner,
        parts: PumpParts,
    ) -> None:
        self._config = config
        self._intake = intake
        self.requests = requests
        self._stop = stop
        self._done = done
        self.owner = owner
        self._p = parts
        self.state = State.DEGRADED  # the first one is chosen by begin()
        self.transitions = 0
        self._degraded_s = 0.0  # time spent DEGRADED, up to the last state change
        self._degraded_since = time.monotonic()
        #: When nothing was last in flight (the stall detector's other clock). Published.
        self.last_idle = time.monotonic()
        #: Log lines of the pump made while it holds the send lock, written once it let go.
        self._deferred: list[tuple[int, str, tuple[Any, ...]]] = []
        #: Each degrade starts a new epoch; the health thread asks for a recovery with the
        #: epoch its good probes were counted in. Published.
        self.epoch = 0
        self.thread = threading.Thread(target=self._run, name="logsdk-pump", daemon=True)
        self._counters = parts.counters

    # -- the thread ----------------------------------------------------------------------

    def begin(self, state: State | None = None) -> None:
        """Before the thread starts (the thread that built the pump): the first state.
        ``None``: as a producer starts: DEGRADED with a recovery asked for at once when
        the spool holds records of an earlier run (no outage was seen: no probes to wait
        for), DEGRADED where no client can connect from this process (records go to the
        spool; the health thread waits for the resolver, see logsdk._resolver), else
        ONLINE (the first failure degrades)."""
        if state is None:
            if self._p.spool.count:
                state = State.DEGRADED
                self.requests.recover(self.epoch)
            elif not resolver_ready():
                state = State.DEGRADED
            else:
                state = State.ONLINE
        self.state = state

    def alive(self) -> bool:
        """The thread runs (any thread)."""
        return self.thread.is_alive()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the thread to end (after `stop()`); True if it
        did (or never started)."""
        if self.thread.ident is not None:
            self.thread.join(timeout)
        return not self.thread.is_alive()

    def start(self) -> None:
        """Hand the pump's state and the spool to the thread, and start it."""
        self.owner.hand_to(self.thread)
        self._p.spool.owner.hand_to(self.thread)
        self._p.seqs.owner.hand_to(self.thread)
        self._p.flight.owner.hand_to(self.thread)
        self.thread.start()

    def stop(self) -> None:
        """close(): the pump, the health thread and probes under way stop (any thread)."""
        self._stop.set()

    def take_back(self) -> None:
        """close(), once the thread has ended: its state and the spool are the caller's."""
        self.owner.take()
        self._p.spool.owner.take()
        self._p.seqs.owner.take()
        self._p.flight.owner.take()

    def _run(self) -> None:
        flight, wake = self._p.flight, self.requests.wake
        while not self._stop.is_set():
            try:
                busy = self.step()
                self.flush_logs()
            except Exception:  # a bug: say so loudly, keep the records, keep pumping
                self._counters.error("pump")
                log.exception("logsdk pump step failed; retrying (records stay buffered)")
                self._stop.wait(0.5)
                continue
            with self._done:
                self._done.notify_all()
            if not busy:
                try:
                    if flight.client is not None:
                        flight.poll(0.01)
                    else:
                        wake.wait(0.01)
                except Exception:  # poll() may raise a fatal client error: degrade
                    self._counters.error("pump")
                    log.exception("librdkafka poll failed; replacing the client")
                    self.requests.degrade("poll failed")
                wake.clear()

    def step(self) -> bool:
        """One round of work; True when there may be more to do right away."""
        self.owner.check("run a pump step")
        p = self._p
        p.seqs.reserve_ahead(self._intake)
        p.flight.poll(0)
        if p.flight.zombies:
            p.flight.poll_retired()
        reason = self.requests.take_degrade()
        if reason is not None and self.state is not State.DEGRADED:
            self.degrade(reason)
        self.settle_spool()
        if self._intake.shm_pressure:
            self.relieve_shm()
        state = self.state
        busy = False
        if state is State.ONLINE:
            busy = self.drain_backlog_to_client()
            if p.flight.outstanding() == 0:
                self.last_idle = time.monotonic()
        elif state is State.DEGRADED:
            if self.requests.take_recover(self.epoch):
                self.start_recovery()
            else:
                busy = p.custody.spool_pending(p.replay.cursor)
        elif state is State.RECOVERING:
            busy = self.recover_step()
        return busy

    # -- the state machine ---------------------------------------------------------------

    def transition(self, event: Event, reason: str) -> None:
        """Move the state machine on ``event`` (the one place that does), and log the move
        once: deferred while the caller holds the send lock (see ``_deferred``)."""
        self.owner.check("move the state machine")
        old = self.state
        new = TRANSITIONS.get((old, event))
        if new is None:  # a bug: the pump reports it and retries the step
            raise RuntimeError(f"no transition from {old.value} on {event.value}")
        now = time.monotonic()
        if old is State.DEGRADED:
            self._degraded_s += now - self._degraded_since
        elif new is State.DEGRADED:
            self._degraded_since = now
        self.state = new
        self.transitions += 1
        level = logging.WARNING if new is State.DEGRADED else logging.INFO
        self._deferred.append(
            (level, "logsdk producer %s -> %s: %s", (old.value, new.value, reason))
        )

    def degraded_s(self) -> float:
        """Seconds spent DEGRADED so far (any thread)."""
        extra = time.monotonic() - self._degraded_since if self.state is State.DEGRADED else 0.0
        return self._degraded_s + extra

    def flush_logs(self) -> None:
        """Write the deferred log lines (pump thread, never holding the send lock)."""
        while self._deferred:
            level, msg, args = self._deferred.pop(0)
            log.log(level, msg, *args)

    def degrade(self, reason: str) -> None:
        """Take the client away: every record it holds comes back and goes to the spool."""
        p = self._p

        def fail() -> None:  # with direct sends turned off, under the send lock
            self.epoch += 1
            self.transition(Event.FAILURE, reason)

        self._intake.close_direct(then=fail)
        self.flush_logs()
        # The purge's reports see whether this client was talking to Kafka (what it hands
        # back as queued may then have been sent: see _client.possibly_persisted).
        p.flight.retire()
        p.flight.forget_answer()
        # The purge's own failure reports asked for a degrade: this one. Left pending, the
        # request would end the next recovery at its first step.
        self.requests.take_degrade()
        # The retired client may still deliver the rows it was given: the overflow policy
        # keeps them until they are replayed again.
        p.custody.keep_rows(p.replay.cursor)
        p.replay.forget_inflight()
        p.replay.restart()

    def start_recovery(self) -> None:
        """DEGRADED -> RECOVERING: pending records spooled first, then a new client."""
        p = self._p
        p.custody.spool_pending(p.replay.cursor)  # what is already failed goes first
        if p.custody.failed:
            return  # the disk refused them: stay DEGRADED (records in memory) and retry
        if not resolver_ready():
            return  # no client can connect from this process; the health thread re-asks
        client = p.flight.new_client()
        p.flight.install(client)
        p.flight.connect(client)
        p.replay.restart()
        p.replay.pace.reset()
        reason = (
            "replaying the spool left by an earlier run"
            if self.transitions == 0
            else f"{self._config.recovery_probes} good probes"
        )
        self.transition(Event.RECOVER, reason)
        self.last_idle = time.monotonic()

    def recover_step(self) -> bool:
        """Replay the spool; when it is empty, hand the backlog over and go ONLINE."""
        p = self._p
        # The backlog waits behind the spool; memory stays bounded by spilling its head,
        # past half the buffer while the spool holds rows. Once it holds none (the last
        # replay batch awaits its acks) the backlog may grow to three quarters: spilling
        # there would put rows back in the spool as fast as the app sends, and a steady
        # sender would keep the producer RECOVERING, every record through the disk.
        bound = self._config.buffer_max_records
        keep = bound // 2 if p.spool.count > 0 else bound * 3 // 4
        over = self._intake.queued() - keep
        if over > 0:
            p.custody.spool_pending(p.replay.cursor, limit=over)
        client = p.flight.client
        if client is None:
            return False
        if p.spool.count > 0 or p.replay.inflight:
            return p.replay.replay_some(client)
        if p.custody.failed:
            return False
        # The gauges say the spool is empty: the table must agree before the backlog may
        # go ahead of its rows (a wrong count would leave them behind for good).
        try:
            if p.spool.holds_rows():
                return p.replay.replay_some(client)
        except SpoolError as exc:
            p.alarm.failed(exc, "read")
            return False
        # Spool drained: the backlog (all newer than anything replayed) goes next, then
        # ONLINE: send() produces directly again.
        return self._feed_backlog(go_online=True)

    def drain_backlog_to_client(self) -> bool:
        """ONLINE with a backlog (librdkafka was full): feed it in order, then go direct."""
        if self._intake.direct:
            # Read without the lock: the pump steps after every poll, and taking the lock
            # each time made it queue behind send(), which holds it most of the time. Only
            # send() and the pump change ``direct``; a send() that just turned it off wakes
            # the pump.
            return False
        if self._p.flight.client is None:
            return False  # not made yet: send() makes it with the first record
        return self._feed_backlog(go_online=False, limit=self._config.buffer_max_records)

    def _feed_backlog(self, go_online: bool, limit: int | None = None) -> bool:
        """Hand the backlog's head to the client, at most ``FEED_CHUNK`` records, in send
        order; once it is empty, turn direct sends on (and go ONLINE with ``go_online``).
        True when more is left for the next step. A backlog longer than ``limit`` asks for
        a degrade instead (librdkafka is not taking records: the spool will).

        The send lock is held only to take the chunk and to put back what is left, never
        while records go to librdkafka: senders append behind the chunk meanwhile (direct
        is off, so none produces, and the in-flight table is the pump's alone). The chunk
        is counted by the intake (``taken``) until its records are in the table, so
        flush() never sees one record less outstanding."""
        intake = self._intake
        if limit is not None and intake.queued() > limit:
            self.requests.degrade("local queue full beyond buffer_max_records")
            return True

        def drained() -> None:  # with direct sends turned on, under the send lock
            if go_online:
                self.transition(Event.DRAINED, "spool drained")

        # Senders waiting for their turn go through the backlog first (send order): direct
        # only once none waits (a later step turns it on).
        if intake.open_direct(then=drained):
            return False
        chunk = intake.take(FEED_CHUNK)
        done = 0
        try:
            for rec in chunk:
                if not self._produce_backlog_rec(rec):
                    break  # librdkafka's queue is full, or the client broke: poll first
                done += 1
        finally:
            rest = chunk[done:]
            intake.put_back(rest)
        return not rest

    def _produce_backlog_rec(self, rec: Rec) -> bool:
        """Hand an accepted record to the client (direct sends off); one Kafka refuses is
        set aside (out of the backlog: kept in the spool's rejected table)."""
        p = self._p
        try:
            return p.flight.produce(rec)
        except (KafkaException, ValueError, TypeError) as exc:
            p.rejects.reject(rec, str(exc))
            return True

    def relieve_shm(self) -> None:
        """Senders wait for room in the ring: wake them, and spill the backlog to the spool
        as a full memory buffer does (records in flight free their room when acked)."""
        p = self._p
        backlog = self._intake.relieve()
        if backlog:
            if self.state is State.ONLINE:
                self.requests.degrade("shm ring full")
            elif self.state is State.RECOVERING:
                p.custody.spool_pending(p.replay.cursor)

    def settle_spool(self) -> None:
        """Delete acknowledged replays and set refused records aside; after a disk error,
        retried once a second; their success clears an alarm they raised."""
        p = self._p
        if p.replay.progressed():
            p.flight.heard()  # replays acknowledged: progress, for the stall detector
        if not p.alarm.ready():
            return
        try:
            wrote = p.rejects.set_aside_records()
            if p.replay.settle(self.state is State.RECOVERING, p.flight.client is not None):
                p.flight.heard()
                wrote = True
            p.custody.check_room()
        except SpoolError as exc:
            p.alarm.failed(exc, "settle")
            return
        if p.alarm.take_rebuilt():
            p.custody.room_changed()
        if wrote:
            p.alarm.ok("settle")

    def mark_closed(self) -> None:
        """close(), once the thread has ended (or never ran in this process): CLOSED. A
        last outage still under way is added to ``degraded_s`` (which never goes back)."""
        if self.state is State.DEGRADED:
            self._degraded_s += time.monotonic() - self._degraded_since
        self.state = State.CLOSED

    # -- close(), once the thread has ended --------------------------------------------

    def final_drain(self) -> int:
        """Everything unacknowledged goes to the spool (close()'s thread, after
        `take_back()`). Returns how many records could not be written (lost)."""
        p, intake = self._p, self._intake
        intake.close_direct()
        p.flight.retire()
        p.flight.flush_retired()
        p.alarm.retry_now()  # last chance: try the disk now, whatever the alarm
        self.settle_spool()
        custody = p.custody
        while custody.failed or intake.queued():
            before = len(custody.failed) + intake.queued()
            p.alarm.retry_now()
            custody.spool_pending(p.replay.cursor)
            if len(custody.failed) + intake.queued() >= before:
                break
        return len(custody.failed) + intake.queued() + p.rejects.pending()


class PumpParts:
    """The parts the pump drives (built by the wiring, ``logsdk.producer._wiring``)."""

    def __init__(
        self,
        spool: Spool,
        seqs: SeqReserver,
        flight: InFlight,
        custody: Custody,
        rejects: Rejects,
        replay: Replayer,
        alarm: DiskAlarm,
        counters: Counters,
    ) -> None:
        self.spool = spool
        self.seqs = seqs
        self.flight = flight
        self.custody = custody
        self.rejects = rejects
        self.replay = replay
        self.alarm = alarm
        self.counters = counters
