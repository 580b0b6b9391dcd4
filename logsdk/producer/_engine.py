"""The engine: a producer minus its facade, started and stopped as one.

An `Engine` opens a slot of ``spool_dir`` (its own, or a free one it drains), has
the parts wired (`wire()`), starts their threads, and takes
them down: flush() and close() wait here, close() spools what Kafka could not take by its
deadline, stats() reads the parts. It also owns what a process does to it: a forked child
starts afresh at its first use (`Engine.forked()`), and one left open at exit is
closed then (`Engine.close_left_open()`). A ``LogProducer`` is a facade over one
engine; a drain of another process's slot is an engine too, reached by the
`Drains` of its producer through the public methods
``undelivered``, ``delivered``, ``hurry`` and ``close``.

Invariants owned here:
- close() delivers within its timeout, then everything not acknowledged goes to the
  spool once the pump has ended; the pump's state and the spool are handed back to the
  closing thread only then (a pump that did not end keeps them: ``pump_stuck``);
- close() re-entered on the thread already inside it (a signal handler that interrupted
  it) returns at once; a second close() on another thread waits for the first;
- in a forked child, what the engine inherited (spool, ring, drains, client) is buried,
  never used or freed there; its first use starts it afresh on a slot of its own.

Owner: ``_restart_lock`` (first use, fork, a forked child's close) guards ``_parts`` and
``_stale``; ``_parts`` is replaced whole (a reference read once is one engine's parts).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from logsdk._fork import bury
from logsdk._resolver import resolver_ready
from logsdk.errors import ProducerClosedError
from logsdk.producer import _client
from logsdk.producer._config import ProducerConfig
from logsdk.producer._drains import Drain
from logsdk.producer._intake import Intake
from logsdk.producer._process import OPEN_AT_EXIT_TIMEOUT_S, gone, live
from logsdk.producer._pump import State
from logsdk.producer._shm import open_for_producer
from logsdk.producer._wiring import Parts, wire
from logsdk.shm._ring import ShmRing
from logsdk.spool._slots import open_slot, slot_shm_name
from logsdk.spool._spool import Spool

log = logging.getLogger("logsdk.producer")


class _InClose(threading.local):
    """Whether this thread is inside `Engine.close()` (one per engine)."""

    here = False


class Engine:
    """A producer's parts, started and stopped as one (see the module docstring)."""

    def __init__(
        self,
        config: ProducerConfig,
        *,
        drain: tuple[int, Path] | None = None,
        on_start: Callable[[Intake], None] | None = None,
    ) -> None:
        """Open a slot of ``config.spool_dir`` (the lowest free one; ``drain``: the free
        slot ``(index, path)`` to deliver, under its own producer id and seqs), wire the
        parts and start them. ``on_start(intake)``: after each start (this one, and a
        forked child's new one), the intake that takes records from then on."""
        self.config = config
        self._drain = drain
        # Held weakly: the facade that asks to be told holds the engine, not the other way.
        self._on_start = None if on_start is None else weakref.WeakMethod(on_start)
        self._restart_lock = threading.Lock()
        self._closed = threading.Event()  # close() has finished (the first call)
        self._in_close = _InClose()
        self._stale = False  # a forked child's, not yet started afresh
        # A kafka_config librdkafka refuses fails here, before the spool is opened, not in
        # the pump once a client is needed (a spool with leftovers makes that one later).
        _client.check_config(config.librdkafka())
        self._recovered_at_start = 0
        self._parts = self._start()
        live(self)

    @property
    def parts(self) -> Parts:
        """The parts running now (a forked child's new ones once it started afresh)."""
        return self._parts

    @property
    def state(self) -> State:
        """The pump's state (any thread)."""
        return self._parts.pump.state

    @property
    def producer_id(self) -> str:
        """The producer id of the slot this engine delivers."""
        return self._parts.spool.producer_id

    # -- start ---------------------------------------------------------------------------

    def _start(self) -> Parts:
        """Open the slot, wire the parts, start the threads (the constructor, and a forked
        child's first use)."""
        cfg = self.config
        slot, spool = self._open_spool()
        ring: ShmRing | None = None
        try:
            # buffer="shm": every accepted record is also in a shared-memory ring until it
            # is acknowledged or spooled; what a dead owner left there goes to the spool.
            if cfg.buffer == "shm":
                ring = open_for_producer(spool, slot_shm_name(cfg.shm_name, slot), cfg.shm_bytes)
            me = weakref.ref(self)  # the parts do not keep the engine alive

            def first_use() -> Intake:
                engine = me()
                if engine is None:
                    raise ProducerClosedError("the producer is gone")
                return engine.first_use()

            def open_drain(index: int, path: Path) -> Drain:
                return Engine(dataclasses.replace(cfg), drain=(index, path))

            parts = wire(
                cfg,
                spool,
                slot,
                ring=ring,
                first_use=first_use,
                open_drain=None if self._drain is not None else open_drain,
            )
            self._recovered_at_start = spool.count
            if spool.count:
                log.info(
                    "spool %s holds %d record(s) from an earlier run; they are replayed first",
                    spool.directory,
                    spool.count,
                )
            parts.pump.begin()
            parts.drains.look()
            # From here on the spool (its connection, its files) and the pump's state are
            # the pump's alone; close() takes them back once the pump has ended.
            parts.pump.start()
            parts.health.start()
        except BaseException:
            # Nothing of it may stay held: a corrected retry in this process must work.
            if ring is not None:
                ring.close(unlink=False)
            spool.owner.take()  # the pump, if it was made, never ran
            spool.close()
            raise
        tell = None if self._on_start is None else self._on_start()
        if tell is not None:
            tell(parts.intake)
        return parts

    def _open_spool(self) -> tuple[int, Spool]:
        """Take the lowest free slot of ``spool_dir`` (see `logsdk.spool._slots`), or
        the slot this engine drains."""
        cfg = self.config
        if self._drain is not None:
            index, path = self._drain
            spool = Spool(path, synchronous=cfg.spool_synchronous, max_bytes=cfg.spool_max_bytes)
            return index, spool.open()
        return open_slot(
            cfg.spool_dir, synchronous=cfg.spool_synchronous, max_bytes=cfg.spool_max_bytes
        )

    def first_use(self) -> Intake:
        """Before the first record: start afresh in a forked child, and make the client of
        an engine that started ONLINE, so that send() goes direct from its first record (a
        process that forks before it logs, gunicorn --preload's master, then has no
        librdkafka thread resolving a name at the fork: see logsdk._resolver). Returns the
        intake that takes records now."""
        if self._stale:
            self._restart_in_child()
        with self._restart_lock:
            parts = self._parts
            if parts.intake.cold:
                self._first_client(parts)
                parts.intake.warmed()
            return parts.intake

    @staticmethod
    def _first_client(parts: Parts) -> None:
        flight, pump, intake = parts.flight, parts.pump, parts.intake
        if flight.client is not None or pump.state is not State.ONLINE or intake.closing:
            return
        client = flight.new_client()
        mine = False

        def install() -> bool:
            # The pump may have degraded meanwhile (it flips the state under the send
            # lock, then owns the client until it recovers with one of its own): then this
            # one is not needed, and holds nothing.
            nonlocal mine
            mine = pump.state is State.ONLINE and flight.client is None
            if mine:
                flight.install(client)
            return mine

        intake.go_direct(install)
        if not mine:
            del client

    # -- what drains and flush() ask -----------------------------------------------------

    def undelivered(self) -> int:
        """Records accepted and not yet acknowledged by Kafka: in memory or in the spool,
        and in the free slots this engine drains (not the rejected nor the dropped)."""
        p = self._parts
        return self._unsettled() + p.spool.count + p.drains.undelivered()

    def delivered(self) -> tuple[int, int]:
        """(acknowledged, rejected) so far."""
        p = self._parts
        return p.flight.acked + p.replay.replayed, p.counters.rejected

    def hurry(self, delta: int) -> None:
        """flush()/close() start (+1) or stop (-1) waiting: probe without backoff."""
        self._parts.health.hurry(delta)

    def _unsettled(self) -> int:
        """Records neither acknowledged nor committed to the spool (nor dropped/rejected).

        Read under the send lock (the backlog moves into the client under it), the records
        in librdkafka first: a failed one reaches custody before its ticket is freed, so a
        record moving between the two while they are read is counted twice, never not at
        all."""
        p = self._parts
        with p.intake.lock:
            outstanding = p.flight.outstanding()
            return outstanding + p.intake.held() + p.custody.held() + p.rejects.pending()

    # -- flush ---------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> int:
        """``LogProducer.flush`` (documented there)."""
        if self._stale:
            return 0  # a forked child that has sent nothing: the parent's records are its own
        deadline = time.monotonic() + (60.0 if timeout is None else max(0.0, timeout))
        return self._wait_until_delivered(deadline)

    def flush_durable(self, timeout: float | None = None) -> int:
        """``LogProducer.flush_durable`` (documented there)."""
        if self._stale:
            return 0  # a forked child that has sent nothing
        deadline = time.monotonic() + (60.0 if timeout is None else max(0.0, timeout))
        p = self._parts
        p.requests.wake.set()
        with p.done:
            while True:
                left = self._unsettled()
                if left == 0 or time.monotonic() >= deadline or not p.pump.alive():
                    return left
                if p.pump.state is State.DEGRADED and p.intake.spool_full:
                    return left  # nowhere to put them until Kafka or spool space returns
                p.done.wait(min(0.05, max(0.0, deadline - time.monotonic())))

    def _wait_until_delivered(self, deadline: float, *, closing: bool = False) -> int:
        """flush() and close(): wait until nothing is left to deliver, or the deadline.

        What free slots of spool_dir hold is delivered too, where Kafka answers
        (`Drains.scan`); slots left alone
        because it did not at first (this producer was degraded) are looked at again once
        it does."""
        p = self._parts
        drains = p.drains
        p.requests.wake.set()
        p.health.hurry(+1)  # the health threads probe without backoff meanwhile
        hurried = drains.hurry()
        try:
            drains.scan(deadline, closing=closing)
            while True:
                if drains.waiting and p.flight.answered and p.pump.state is not State.DEGRADED:
                    drains.scan(deadline, closing=closing)
                with p.done:
                    left = self.undelivered()
                    if left == 0 or time.monotonic() >= deadline or not p.pump.alive():
                        return left
                    if p.flight.client is None and not resolver_ready():
                        return left  # no client can connect from this process: in the spool
                    p.done.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        finally:
            p.health.hurry(-1)
            drains.calm(hurried)

    # -- close ---------------------------------------------------------------------------

    def close(self, timeout: float | None = 30.0) -> None:
        """``LogProducer.close`` (documented there)."""
        # Before any lock: a signal handler runs on the thread it interrupted, which may
        # hold one of them here, and it cannot wait for the call it interrupted.
        in_close = self._in_close
        if in_close.here:
            return
        in_close.here = True
        try:
            self._close(timeout)
        finally:
            in_close.here = False

    def _close(self, timeout: float | None) -> None:
        budget = 60.0 if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + budget
        if self._stale and self._close_stale():
            return
        p = self._parts
        if not p.intake.close():
            self._closed.wait(budget + 60.0)
            return
        try:
            p.health.close_by(deadline)
            # Slots other processes left (a pool's children that closed before Kafka took
            # everything) are delivered too, within the same timeout, if Kafka answers.
            self._wait_until_delivered(deadline, closing=True)
            p.pump.stop()
            p.requests.wake.set()
            p.health.wake()
            # A probe under way ends within 0.1 s of the stop; one that does not (its
            # client's threads wedged by a lock held at a fork) is left behind.
            left = max(0.0, deadline - time.monotonic())
            if not p.health.join(max(left, self.config.probe_timeout_s) + 1.0):
                log.warning(
                    "close(): a health probe of this producer did not end by the deadline; "
                    "closing without it"
                )
            p.drains.close_all(deadline)
            if p.pump.join(max(30.0, budget + 30.0)):
                p.pump.take_back()
                self._shutdown(budget)
            else:
                # Its spool and records are still its own: nothing here may touch them.
                p.counters.error("pump_stuck")
                log.error(
                    "close(): the pump thread did not stop within %gs; the records it holds "
                    "stay where they are (the spool, memory) and this producer is left open",
                    max(30.0, budget + 30.0),
                )
        finally:
            gone(self)
            self._closed.set()

    def _shutdown(self, budget: float) -> None:
        """After the threads stopped: everything unacknowledged goes to the spool."""
        p = self._parts
        lost = p.pump.final_drain()
        if lost:
            log.error(
                "close(): %d record(s) could not be written to the spool (%s) and are lost",
                lost,
                p.alarm.reason or "spool full",
            )
            p.counters.error("lost_on_close", lost)
        left = p.spool.count
        if left:
            if self._drain is None:
                log.warning(
                    "close(): %d record(s) not delivered to Kafka within %gs are kept in the "
                    "spool %s; the next producer opened on that spool_dir delivers them",
                    left,
                    budget,
                    p.spool.directory,
                )
            else:
                # Said once already, by the producer that left these records (its own
                # close()); every process that tries to deliver them would say it again.
                log.debug("drain of %s closed; %d record(s) stay there", p.spool.directory, left)
        p.pump.mark_closed()
        p.pump.flush_logs()
        if p.ring is not None:
            # Clean close: every record is acknowledged or spooled, so the segment goes.
            # Otherwise it stays, and the next producer on it resends what it holds.
            p.ring.close(unlink=p.ring.pending == 0)
        p.spool.close()
        # Nothing serves a report once the threads have stopped: the callback classes
        # name their part (a cycle), let go so the closed producer is freed at once.
        p.flight.forget()
        p.replay.forget()

    # -- stats ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """``LogProducer.stats`` (documented there)."""
        if self._stale:  # first use in a forked child
            self._restart_in_child()
        p = self._parts
        intake, flight, replay, pump, counters = p.intake, p.flight, p.replay, p.pump, p.counters
        with intake.lock:
            sent, seq_next, seq_waits = intake.sent, intake.seq_next, intake.seq_waits
            outstanding = flight.outstanding()
            held = intake.held() + p.custody.held()
        drained, drain_rejected = p.drains.counts()
        out: dict[str, Any] = {
            "state": pump.state.value,
            "producer_id": p.spool.producer_id,
            "next_seq": seq_next,
            "seq_waits": seq_waits,
            "sent": sent,
            "acked": flight.acked + replay.replayed,
            "spooled": p.custody.spooled,
            "replayed": replay.replayed,
            "dropped": counters.dropped,
            "rejected": counters.rejected,
            "buffered": held + outstanding,
            "in_flight": outstanding + len(replay.inflight),
            "spool_records": p.spool.count,
            "spool_bytes": p.spool.bytes,
            "recovered_at_start": self._recovered_at_start,
            "possible_duplicates": flight.possible_dups,
            "unconfirmed_acks": flight.unconfirmed,
            "transitions": pump.transitions,
            "degraded_s": round(pump.degraded_s(), 3),
            "alarm": p.alarm.reason,
            "retired_clients": len(flight.zombies),
            "spool_corrupt_files": p.spool.corrupt_files_moved,
            "spool_unreadable": p.spool.unreadable_ids,
            "slot": p.slot,
            "draining_slots": len(p.drains.drains),
            "free_slot_records": p.drains.waiting,
            "drained": drained,
            "drain_rejected": drain_rejected,
            "undelivered": self.undelivered(),
            "errors": dict(counters.errors),
        }
        if p.ring is not None:
            out.update(p.ring.stats())
        return out

    # -- processes: fork, exit -----------------------------------------------------------

    def forked(self) -> None:
        """In a child just forked (one thread runs): all this engine runs on is the
        parent's. Buried now, so that dropping the engine can never free them; its first
        use in the child starts afresh (``_restart_in_child``). Its clients, current and
        retired, are kept by `logsdk._fork` with every other client alive at the
        fork; the locks of its slot and ring are left to the parent (the child closes its
        copies of their descriptors: logsdk.spool._dirlock, logsdk.shm._ring)."""
        p = self._parts
        bury(p.spool)
        bury(p.ring)
        for d in p.drains.forget():
            bury(d)
        p.intake.forked()
        self._stale = True
        # The parent's locks may have been held by one of its threads at the fork (every
        # part is built again by the first use: only these two are used before it).
        self._restart_lock = threading.Lock()
        self._closed = threading.Event()
        self._in_close = _InClose()  # the forking thread may have been inside close()

    def _restart_in_child(self) -> None:
        """First use in a forked child: start as a new producer on the same configuration,
        with a slot of its own (producer id, seqs, spool, shm ring), a client and threads.
        The parent's records stay the parent's: the child sends none of them."""
        with self._restart_lock:
            if not self._stale:
                return
            self._parts = self._start()
            self._stale = False
            live(self)
        log.info(
            "logsdk producer started afresh in forked process %d: slot %d, producer id %s",
            os.getpid(),
            self._parts.slot,
            self.producer_id,
        )

    def _close_stale(self) -> bool:
        """close() in a forked child that never used this engine: nothing of this process
        to deliver, and what it inherited is the parent's. True if it did that."""
        with self._restart_lock:
            if not self._stale:
                return False
            self._stale = False
            self._parts.pump.mark_closed()
            gone(self)
            self._closed.set()
            return True

    def left_open(self) -> bool:
        """At exit: this engine delivers its process's own records (it drains no other
        process's slot), and no one closed it."""
        return self._drain is None and not self._closed.is_set()

    def close_left_open(self, deadline: float) -> None:
        """At exit, an engine the application left open: closed by ``deadline``, and said
        (a forked child's, never used there, is the parent's: closed without a word)."""
        if self._stale:
            self.close(0)
            return
        log.warning(
            "logsdk: a LogProducer (topic %r, spool_dir %s) was still open at exit; closing "
            "it (at most %gs: what Kafka cannot take by then stays in the spool). Call "
            "close() (or use it as a context manager) to choose how long",
            self.config.topic,
            self.config.spool_dir,
            OPEN_AT_EXIT_TIMEOUT_S,
        )
        self.close(max(0.0, deadline - time.monotonic()))
