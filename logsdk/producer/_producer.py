"""LogProducer: memory buffer -> Kafka, spool on failure, replay on recovery.

Invariants (the at-least-once contract):
- a record accepted by ``send()`` is, at every instant, in exactly one of: the
  backlog (memory), librdkafka's queue (memory), the spool (committed on disk),
  Kafka (acknowledged), or counted as dropped by the overflow policy or as
  rejected (bad data, set aside in the spool's ``rejected`` table);
- a spool row is deleted only after Kafka acknowledged its replay;
- records reach Kafka in send order per partition: once the backlog is in use,
  every newer record goes through it, and the spool drains before the backlog;
- only the pump thread changes state, polls librdkafka (so delivery callbacks run
  there) and touches the spool; ``send()`` only takes a seq from memory and appends or
  produces under the send lock: it never does disk I/O.

This module is the facade: the public API (send, flush, flush_durable, close, stats) and
the wiring. A producer is composed of parts, each a class of its own module that owns
its state and says in its docstring which thread may call what:

- ``_gate.Gate``: the send path's state, under the send lock (seqs, backlog, counters);
- ``_identity.SeqReserver``: seq blocks reserved on disk ahead of need (pump);
- ``_inflight.InFlight``: the client, the in-flight table (tickets), delivery reports;
- ``_custody.Custody``: what is not yet in Kafka (failed records, spool commits, overflow);
- ``_alarm.DiskAlarm``: a spool that fails (retries, rebuild of a damaged file);
- ``_replay.Replayer``: the spool sent back to Kafka, paced, with its watermark;
- ``_pump.Pump``: the pump thread and the state machine, as one table;
- ``_health.Health``: probes with backoff, the stall detector;
- ``_process.Drains``: the free slots of ``spool_dir`` other processes left; fork, exit;
- ``_tally.Tally``: counts several threads add to (errors, dropped, rejected).

``_records`` says what a record is in memory and what send() accepts; ``_client`` builds
clients, classifies librdkafka's errors and runs probes. Who owns what, and a record's
path through the parts: docs/engineering/design.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException, Message

from logsdk._fork import bury
from logsdk._owner import Owner
from logsdk._resolver import resolver_ready
from logsdk.errors import (
    ConfigError,
    LogSDKError,
    ProducerClosedError,
    RecordTooLargeError,
    SerializationError,
)
from logsdk.producer import _client
from logsdk.producer._alarm import DiskAlarm
from logsdk.producer._config import ProducerConfig, WhenFull, check_topic
from logsdk.producer._custody import Custody
from logsdk.producer._health import Health
from logsdk.producer._hooks import ProducerHooks
from logsdk.producer._identity import SeqReserver, wait_for_seq
from logsdk.producer._inflight import Handback, InFlight
from logsdk.producer._process import _LIVE, Drains, close_at_exit, hook_exit
from logsdk.producer._pump import Pump, PumpParts, Requests, State
from logsdk.producer._records import (
    HEADER_PRODUCER,
    HEADER_SEQ,
    KHeaders,
    Rec,
    _to_bytes,
    _user_headers,
)
from logsdk.producer._replay import Replayer
from logsdk.producer._shm import open_for_producer
from logsdk.producer._tally import Tally
from logsdk.shm._ring import ShmRing
from logsdk.spool._slots import open_slot, slot_shm_name
from logsdk.spool._spool import Spool

__all__ = ["HEADER_PRODUCER", "HEADER_SEQ", "LogProducer", "State"]

log = logging.getLogger("logsdk.producer")

_TS_LIMIT = 1 << 63  # Kafka timestamps are int64 milliseconds


class _InClose(threading.local):
    """Whether this thread is inside :meth:`LogProducer.close` (one per producer)."""

    here = False


class LogProducer:
    """Send log records to Kafka without losing them when Kafka or the network fails.

    ``send()`` never blocks on Kafka: records go to librdkafka while the cluster is
    healthy, and to a SQLite spool in ``spool_dir`` while it is not; a health thread
    probes the cluster and replays the spool, oldest first, when it is back. Every
    record carries the headers ``logsdk.producer`` (a stable id kept in
    ``spool_dir``) and ``logsdk.seq`` (monotonic per producer), so readers can drop
    the duplicates that at-least-once delivery may create.

    The constructor opens the spool (taking its lock: one producer per directory;
    the spool runs its WAL checkpoints on a daemon thread of its own) and starts two
    daemon threads (pump and health). Use it as a context manager or call
    :meth:`close`, which delivers to Kafka within its timeout (the spool included) and
    leaves in the spool only what Kafka could not take by then. :meth:`flush` means "in
    Kafka" too; :meth:`flush_durable` means "in Kafka or on local disk". Thread-safe:
    ``send()`` may be called from any number of threads.

    ``buffer="shm"`` also keeps every accepted record in a ring in POSIX shared memory
    (named ``shm_name``, by default derived from ``spool_dir``; ``shm_bytes`` long) until
    Kafka acknowledged it or the spool committed it, so a producer restarted after a crash
    of this process (even SIGKILL) resends them. A full ring is handled per ``when_full``
    (``drop_oldest`` waits like ``block``); see :mod:`logsdk.shm._ring` for the layout.

    ``kafka_config`` passes librdkafka properties through (SASL/SSL included; their
    secrets are never logged or shown). ``enable.idempotence`` and ``acks=all`` are
    set by logsdk and may not be weakened.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        spool_dir: str | os.PathLike[str],
        *,
        buffer: Literal["memory", "shm"] = "memory",
        kafka_config: Mapping[str, str | int | float | bool] | None = None,
        spool_synchronous: str = "NORMAL",
        spool_max_bytes: int | None = 1 << 30,
        when_full: WhenFull = "block",
        max_block_s: float = 10.0,
        buffer_max_records: int = 100_000,
        stall_timeout_s: float = 10.0,
        probe_interval_s: float = 1.0,
        probe_timeout_s: float = 2.0,
        probe_backoff_max_s: float = 5.0,
        recovery_probes: int = 3,
        replay_batch: int = 2_000,
        replay_max_rate: float | None = 200_000.0,
        message_max_bytes: int = 1_000_000,
        shm_name: str | None = None,
        shm_bytes: int = 64 << 20,
    ) -> None:
        self.config = ProducerConfig(
            bootstrap_servers=bootstrap_servers,
            topic=topic,
            spool_dir=os.fspath(spool_dir),
            buffer=buffer,
            kafka_config=dict(kafka_config or {}),
            spool_synchronous=spool_synchronous,
            spool_max_bytes=spool_max_bytes,
            when_full=when_full,
            max_block_s=max_block_s,
            buffer_max_records=buffer_max_records,
            stall_timeout_s=stall_timeout_s,
            probe_interval_s=probe_interval_s,
            probe_timeout_s=probe_timeout_s,
            probe_backoff_max_s=probe_backoff_max_s,
            recovery_probes=recovery_probes,
            replay_batch=replay_batch,
            replay_max_rate=replay_max_rate,
            message_max_bytes=message_max_bytes,
            shm_name=shm_name,
            shm_bytes=shm_bytes,
        )
        self._setup(None)

    @classmethod
    def _for_slot(cls, config: ProducerConfig, index: int, path: Path) -> LogProducer:
        """A producer that delivers what the free slot ``index`` (at ``path``) holds, under
        the slot's own producer id and seqs (and the shm ring its dead owner left). It
        sends nothing of its own, drains no other slot, and is closed by the producer that
        made it (:class:`~logsdk.producer._process.Drains`)."""
        drain = cls.__new__(cls)
        drain.config = dataclasses.replace(config)
        drain._setup((index, path))
        return drain

    def _setup(self, drain_at: tuple[int, Path] | None) -> None:
        cfg = self.config
        self._drain_at = drain_at
        self._topic = cfg.topic
        self._topics_ok = {cfg.topic}
        self._max_bytes = cfg.message_max_bytes
        self._stale = False
        self._restart_lock = threading.Lock()
        self._closed = threading.Event()  # close() has finished (the first call)
        self._in_close = _InClose()
        # A kafka_config librdkafka refuses fails here, before the spool is opened, not in
        # the pump once a client is needed (a spool with leftovers makes that one later).
        _client.check_config(cfg.librdkafka())
        self._start()
        _LIVE.add(self)
        hook_exit()

    def _start(self) -> None:
        """Open a slot of spool_dir, build the parts, start the threads: everything a
        producer runs on (the constructor, and a forked child's first use of it)."""
        cfg = self.config
        self._slot, self._spool = self._open_spool()
        self._shm: ShmRing | None = None
        try:
            self._build(cfg)
        except BaseException:
            # Nothing of it may stay held: a corrected retry in this process must work.
            if self._shm is not None:
                self._shm.close(unlink=False)
            self._spool.owner.take()  # the pump, if it was made, never ran
            self._spool.close()
            raise

    def _build(self, cfg: ProducerConfig) -> None:
        spool = self._spool
        self._errors = errors = Tally()
        self._counts = counts = Tally()  # dropped, rejected
        self.producer_id = spool.producer_id
        self._pid_header = (HEADER_PRODUCER, self.producer_id.encode())
        seqs = SeqReserver(spool, errors)
        self._gate = gate = seqs.gate()
        # buffer="shm": every accepted record is also in a shared-memory ring until it is
        # acknowledged or spooled; what a dead owner left there goes to the spool first.
        if cfg.buffer == "shm":
            self._shm = open_for_producer(
                spool, slot_shm_name(cfg.shm_name, self._slot), cfg.shm_bytes
            )
        ring = self._shm
        self._recovered_at_start = spool.count
        requests = Requests()
        self._wake = requests.wake
        stop = threading.Event()  # the pump, health and a new client's connect end on it
        self._done = threading.Condition()  # notified after every pump step
        pump_owner = Owner(f"the pump state of producer {self.producer_id}")
        self._alarm = alarm = DiskAlarm(spool, errors, pump_owner)
        self._custody = custody = Custody(
            cfg, gate, spool, ring, alarm, errors, counts, requests.wake, pump_owner
        )
        handback = Handback(custody.take_back, custody.reject, requests.degrade)
        self._flight = flight = InFlight(cfg, errors, counts, handback, ring, stop)
        self._replay = replay = Replayer(
            cfg, spool, flight, alarm, errors, counts, requests.degrade, self._pid_header,
            pump_owner,
        )  # fmt: skip
        parts = PumpParts(
            spool, ring, seqs, flight, custody, replay, alarm, errors, counts, self._pid_header
        )
        self._pump = pump = Pump(cfg, gate, requests, stop, self._done, pump_owner, parts)
        self._drains = Drains(
            cfg,
            self._slot,
            pump,
            lambda: flight.answered,
            errors,
            stop,
            enabled=self._drain_at is None,
        )
        self._health = Health(
            cfg, pump, flight, replay, errors, stop, self._drains.scan, lambda: gate.closing
        )
        if self._recovered_at_start:
            log.info(
                "spool %s holds %d record(s) from an earlier run; they are replayed first",
                spool.directory,
                self._recovered_at_start,
            )
            # No outage has been seen, so no probes to wait for (an empty spool starts
            # ONLINE at once too): the pump starts replaying now; a failure degrades.
            pump.state = State.DEGRADED
            requests.recover(pump.epoch)
        elif not resolver_ready():
            # No client can connect from this process (logsdk._resolver): records go to
            # the spool, and the health thread waits for the resolver, not for Kafka.
            pump.state = State.DEGRADED
        else:
            # Nothing to replay: start ONLINE and let the first failure degrade. The client
            # is made by the first send() (``_warm_up``), which then goes direct: a process
            # that forks before it logs (gunicorn --preload's master) has no librdkafka
            # thread resolving a name at the fork (see logsdk._resolver).
            pump.state = State.ONLINE
        self._cold = True
        self._drains.look()
        # From here on the spool (its connection, its files) and the pump's state are the
        # pump's alone; close() takes them back once the pump has ended.
        pump.start()
        self._health.thread.start()

    def _warm_up(self) -> None:
        """Before the first record: start afresh in a forked child, and make the client of
        a producer that started ONLINE, so that send() goes direct from its first record."""
        if self._stale:
            self._restart_in_child()
        with self._restart_lock:
            if not self._cold:
                return
            gate, flight, pump = self._gate, self._flight, self._pump
            if flight.client is None and pump.state is State.ONLINE and not gate.closing:
                client = flight.new_client()
                with gate.lock:
                    # The pump may have degraded meanwhile (it flips the state under the
                    # send lock, then owns the client until it recovers with one of its
                    # own): then this one is not needed, and holds nothing.
                    mine = pump.state is State.ONLINE and flight.client is None
                    if mine:
                        flight.install(client)
                        if not gate.backlog and not gate.waiters:
                            gate.direct = True
                if not mine:
                    del client
            self._cold = False

    def _open_spool(self) -> tuple[int, Spool]:
        """Take the lowest free slot of ``spool_dir`` (see :mod:`logsdk.spool._slots`), or
        the slot this producer drains."""
        cfg = self.config
        if self._drain_at is not None:
            index, path = self._drain_at
            spool = Spool(path, synchronous=cfg.spool_synchronous, max_bytes=cfg.spool_max_bytes)
            return index, spool.open()
        return open_slot(
            cfg.spool_dir, synchronous=cfg.spool_synchronous, max_bytes=cfg.spool_max_bytes
        )

    def send(
        self,
        value: bytes | str | dict[str, Any],
        key: bytes | str | None = None,
        *,
        topic: str | None = None,
        headers: Mapping[str, bytes | str | None]
        | Sequence[tuple[str, bytes | str | None]]
        | None = None,
        timestamp: int | None = None,
    ) -> None:
        """Accept one record; never blocks on Kafka.

        ``value``: bytes, str, or a JSON-serialisable dict (anything else raises
        :class:`~logsdk.errors.SerializationError`, a TypeError, before acceptance).
        ``timestamp``: milliseconds since the epoch (default: now). Raises
        :class:`~logsdk.errors.RecordTooLargeError` above ``message_max_bytes`` and,
        only when Kafka is unavailable and the spool is full, per ``when_full``.
        """
        if self._cold:  # the first record (of this process)
            self._warm_up()
        v = value if type(value) is bytes else _to_bytes(value, "value")
        k = key if (key is None or type(key) is bytes) else _to_bytes(key, "key")
        h = None if headers is None else _user_headers(headers)
        if topic is None:
            topic = self._topic
        elif type(topic) is not str or topic not in self._topics_ok:
            check_topic(topic)
            if len(self._topics_ok) > 10_000:  # names made up per record: keep it bounded
                self._topics_ok.clear()
            self._topics_ok.add(topic)  # a set: each name is checked once
        if timestamp is not None and (type(timestamp) is not int or not 0 < timestamp < _TS_LIMIT):
            raise ConfigError(
                f"timestamp must be milliseconds since the epoch, >= 1 (librdkafka reads 0 as "
                f"'now'), got {timestamp!r}"
            )
        size = (0 if v is None else len(v)) + (0 if k is None else len(k))
        if size > self._max_bytes:
            self._counts.add("rejected")
            self._errors.add("record_too_large")
            raise RecordTooLargeError(
                f"record of {size} bytes exceeds message_max_bytes={self._max_bytes}"
            )
        gate = self._gate
        with gate.lock:
            if gate.closing:
                raise ProducerClosedError("the producer is closed; it accepts no more records")
            seq = gate.seq_next
            if seq >= gate.seq_limit:  # never while the pump keeps up (see _identity)
                seq = wait_for_seq(gate, self._wake, self.config.max_block_s, self._alarm_reason)
            # Taken now: a wait below (ring or buffer full) releases the lock, so another
            # sender must not get the same seq. A refused record gives it back when no
            # one took a later one meanwhile (else it leaves a gap, never a reuse).
            gate.seq_next = seq + 1
            try:
                if timestamp is None:
                    # Fixed now, so a record spooled and replayed keeps its creation time.
                    timestamp = time.time_ns() // 1_000_000
                rec: Rec = (topic, k, v, h, timestamp, seq)
                shm = self._shm
                # Others wait for room, or the ring is full: wait for a turn behind them,
                # in send order (or drop, or raise, per when_full).
                if (
                    gate.waiters
                    or (shm is not None and not shm.put_fields(topic, k, v, h, timestamp, seq))
                ) and not self._custody.accept_in_turn(rec, need_ring=True):
                    return
                if gate.direct:
                    # InFlight.produce() inlined: this is the hot path.
                    hdrs: KHeaders = [self._pid_header, (HEADER_SEQ, b"%d" % seq)]
                    if h:
                        hdrs = [*h, *hdrs]
                    # In the table first: the pump may serve its ack before produce()
                    # returns here, and flush() must never see one record less outstanding.
                    flight = self._flight
                    free = flight.free
                    ticket = free.pop() if free else flight.new_ticket()
                    flight.slots[ticket] = rec
                    try:
                        # Positional: produce()'s keyword parsing costs 0.3 µs a call.
                        # (topic, value, key, partition, on_delivery, callback, timestamp,
                        # headers); the ticket is the callback.
                        flight.client.produce(  # type: ignore[union-attr]
                            topic,
                            v,
                            k,
                            -1,
                            ticket,
                            None,
                            timestamp,
                            hdrs,
                        )
                    except (BufferError, KafkaException, ValueError, TypeError) as exc:
                        flight.give_back(ticket)
                        self._direct_refused(rec, exc)
                    else:
                        gate.sent += 1
                        return
                custody = self._custody
                if (
                    len(gate.backlog) < custody.backlog_max and not custody.spool_full
                ) or custody.accept_in_turn(rec, need_ring=False):  # a full backlog or spool
                    gate.backlog.append(rec)
                    gate.sent += 1
            except BaseException as exc:
                # Only a refusal of ours (a LogSDKError, raised before the record reached
                # the client or the buffer) gives its seq back. Any other exception, such as
                # a signal handler's KeyboardInterrupt, surfaces when a call returns: maybe
                # right after produce() handed the record over, and a delivered record's seq
                # must never name another one (the dedupe would drop one of the two). Its
                # seq stays taken: a gap.
                if not isinstance(exc, LogSDKError):
                    if self._shm is not None:
                        # Its frame, if the put was done, is let go: a frame left open
                        # would stop the ring's tail for good (the ring fills, every send
                        # waits, then fails). send() raised, so the record was not accepted
                        # and the ring owes it nothing; if it reached the client its report
                        # settles the seq again, which is harmless (the seq is not reused).
                        self._shm.settle(seq)
                elif gate.seq_next == seq + 1:
                    if self._shm is not None:
                        # A refused record's frame was settled by seq: flag it now, while
                        # the seq still names that frame and not the next record's (also
                        # when the pump's drain has already taken it from the list).
                        self._shm.drain_all()
                    gate.seq_next = seq
                raise
        wake = self._wake
        if not wake.is_set():  # set() takes a lock each time; the pump clears before a step
            wake.set()

    def _alarm_reason(self) -> str | None:
        return self._alarm.reason

    def _direct_refused(
        self, rec: Rec, exc: BufferError | KafkaException | ValueError | TypeError
    ) -> None:
        """send()'s produce raised (caller holds the send lock): queue the record behind
        the client (full, or broken: a degrade is requested), or raise when Kafka refuses
        the record."""
        if isinstance(exc, (ValueError, TypeError)):  # the client refused its fields
            self._counts.add("rejected")
            self._errors.add("record_rejected")
            self._custody.release(rec)  # refused: not in custody
            raise SerializationError(f"librdkafka refused the record: {exc}") from exc
        if isinstance(exc, KafkaException):
            if _client.is_record_exception(exc):  # the record itself: not accepted
                self._counts.add("rejected")
                self._errors.add("record_rejected")
                self._custody.release(rec)  # refused: not in custody
                raise RecordTooLargeError(f"librdkafka refused the record: {exc}") from exc
            self._errors.add("produce_error")
            self._pump.requests.degrade(f"produce failed: {exc}")
        self._gate.direct = False  # full, or the client is broken: queue behind it

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every record accepted so far is acknowledged by Kafka, the spooled
        ones included; return how many are not in Kafka yet (0: all there).

        As librdkafka's own flush, records other threads send meanwhile are waited for
        too. While records wait, Kafka is probed at once (not on the health thread's
        backoff schedule) and the spool is replayed as soon as it answers. ``None``
        waits up to 60 s. Kafka still unreachable at the deadline: the count is
        returned and the records stay safe in the spool (or in memory, on their way
        there). Records Kafka refused (``rejected``) and records dropped by
        ``when_full`` are not waited for. To wait only until every record is in Kafka
        or on local disk, use :meth:`flush_durable`.
        """
        if self._stale:
            return 0  # a forked child that has sent nothing: the parent's records are its own
        deadline = time.monotonic() + (60.0 if timeout is None else max(0.0, timeout))
        return self._wait_until_delivered(deadline)

    def flush_durable(self, timeout: float | None = None) -> int:
        """Wait until every record is acknowledged by Kafka or committed to the spool.

        Durability without waiting for Kafka: while Kafka is down, the records in memory
        are committed to the spool (which survives a crash of this process) and the call
        returns. Returns how many records are in neither place (0 when done). ``None``
        waits up to 60 s.
        """
        if self._stale:
            return 0  # a forked child that has sent nothing
        deadline = time.monotonic() + (60.0 if timeout is None else max(0.0, timeout))
        self._wake.set()
        with self._done:
            while True:
                left = self._unsettled()
                if left == 0 or time.monotonic() >= deadline or not self._pump.thread.is_alive():
                    return left
                if self._pump.state is State.DEGRADED and self._custody.spool_full:
                    return left  # nowhere to put them until Kafka or spool space returns
                self._done.wait(min(0.05, max(0.0, deadline - time.monotonic())))

    def _unsettled(self) -> int:
        """Records neither acknowledged nor committed to the spool (nor dropped/rejected).

        Read under the send lock (the backlog moves into the client under it), the records
        in librdkafka first: a failed one reaches custody before its ticket is freed, so a
        record moving between the two while they are read is counted twice, never not at
        all."""
        with self._gate.lock:
            outstanding = self._flight.outstanding()
            return outstanding + self._custody.unsettled()

    def _undelivered(self) -> int:
        """Records accepted and not yet acknowledged by Kafka: in memory or in the spool,
        and in the free slots this producer drains (not counting the rejected and the
        dropped). Any thread."""
        return self._unsettled() + self._spool.count + self._drains.undelivered()

    def _hurry(self, delta: int) -> None:
        self._health.hurry(delta)

    def _wait_until_delivered(self, deadline: float, *, closing: bool = False) -> int:
        """flush() and close(): wait until nothing is left to deliver, or the deadline.

        What free slots of spool_dir hold is delivered too, where Kafka answers
        (:meth:`Drains.scan <logsdk.producer._process.Drains.scan>`); slots left alone
        because it did not at first (this producer was degraded) are looked at again once
        it does."""
        self._wake.set()
        hurried = [self, *self._drains.drains]
        for p in hurried:
            p._hurry(+1)  # their health threads probe without backoff meanwhile
        try:
            drains = self._drains
            drains.scan(deadline, closing=closing)
            while True:
                if (
                    drains.waiting
                    and self._flight.answered
                    and self._pump.state is not State.DEGRADED
                ):
                    drains.scan(deadline, closing=closing)
                with self._done:
                    left = self._undelivered()
                    if (
                        left == 0
                        or time.monotonic() >= deadline
                        or not self._pump.thread.is_alive()
                    ):
                        return left
                    if self._flight.client is None and not resolver_ready():
                        return left  # no client can connect from this process: in the spool
                    self._done.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        finally:
            for p in hurried:
                p._hurry(-1)

    def close(self, timeout: float | None = 30.0) -> None:
        """Deliver every record to Kafka within ``timeout``, then stop; what Kafka could not
        take by then stays in the spool, for the next producer on ``spool_dir``.

        Delivering means what :meth:`flush` does: the backlog, the records in librdkafka,
        the shm ring and the spool (including rows left by an earlier run), with Kafka
        probed at once if it was down; and what free slots of ``spool_dir`` hold, where
        Kafka answers (with Kafka down they are left for the next producer). At the
        deadline, every record not acknowledged is committed to the spool, and the log
        says how many and where (a warning). ``None`` waits up to 60 s. A second call from
        another thread waits for the first one to end; one made on the thread already
        inside close() (a signal handler that interrupted it) returns at once: the
        interrupted call finishes the work once the handler returns.

        It also waits for a health probe under way to end (probes give up within 0.1 s
        once close() stops them), so that nothing of this producer talks to the cluster
        once it has returned (an abandoned probe of the topic could create it on a broker
        that comes up later: seen in a test).
        """
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
        gate = self._gate
        with gate.lock:
            first = not gate.closing
            gate.closing = True
            gate.space.notify_all()
        if not first:
            self._closed.wait(budget + 60.0)
            return
        try:
            self._health.close_deadline = deadline
            # Slots other processes left (a pool's children that closed before Kafka took
            # everything) are delivered too, within the same timeout, if Kafka answers.
            self._wait_until_delivered(deadline, closing=True)
            self._pump.stop()
            self._wake.set()
            self._health.wake.set()
            # A probe under way ends within 0.1 s of the stop; one that does not (its
            # client's threads wedged by a lock held at a fork) is left behind.
            left = max(0.0, deadline - time.monotonic())
            health = self._health.thread
            health.join(max(left, self.config.probe_timeout_s) + 1.0)
            if health.is_alive():
                log.warning(
                    "close(): a health probe of this producer did not end by the deadline; "
                    "closing without it"
                )
            self._drains.close_all(deadline)
            pump = self._pump.thread
            pump.join(max(30.0, budget + 30.0))
            if pump.is_alive():
                # Its spool and records are still its own: nothing here may touch them.
                self._errors.add("pump_stuck")
                log.error(
                    "close(): the pump thread did not stop within %gs; the records it holds "
                    "stay where they are (the spool, memory) and this producer is left open",
                    max(30.0, budget + 30.0),
                )
            else:
                self._pump.take_back()
                self._shutdown(budget)
        finally:
            _LIVE.discard(self)
            self._closed.set()

    def _shutdown(self, budget: float) -> None:
        """After the threads stopped: everything unacknowledged goes to the spool."""
        lost = self._pump.final_drain()
        if lost:
            log.error(
                "close(): %d record(s) could not be written to the spool (%s) and are lost",
                lost,
                self._alarm.reason or "spool full",
            )
            self._errors.add("lost_on_close", lost)
        left = self._spool.count
        if left:
            if self._drain_at is None:
                log.warning(
                    "close(): %d record(s) not delivered to Kafka within %gs are kept in the "
                    "spool %s; the next producer opened on that spool_dir delivers them",
                    left,
                    budget,
                    self._spool.directory,
                )
            else:
                # Said once already, by the producer that left these records (its own
                # close()); every process that tries to deliver them would say it again.
                log.debug(
                    "drain of %s closed; %d record(s) stay there", self._spool.directory, left
                )
        self._pump.mark_closed()
        self._pump.flush_logs()
        if self._shm is not None:
            # Clean close: every record is acknowledged or spooled, so the segment goes.
            # Otherwise it stays, and the next producer on it resends what it holds.
            self._shm.close(unlink=self._shm.pending == 0)
        self._spool.close()
        # Nothing serves a report once the threads have stopped: the callback classes
        # name their part (a cycle), let go so the closed producer is freed at once.
        self._flight.forget()
        self._replay.forget()

    def stats(self) -> dict[str, Any]:
        """Counters and gauges: state, sent, acked, spooled, replayed, dropped, buffered, errors.

        - ``sent``: records accepted by send(); ``acked``: acknowledged by Kafka (fresh and
          replayed); ``replayed``: acknowledged replays from the spool; ``spooled``:
          records committed to the spool; ``dropped``: removed by the ``when_full`` policy;
          ``rejected``: bad records set aside (too large, invalid);
          ``buffered``: in memory, neither acknowledged nor spooled;
          ``spool_records``/``spool_bytes``: what the spool holds now;
          ``alarm``: None, or why the disk cannot be used;
          ``retired_clients``: librdkafka clients replaced after a failure that have not
          yet reported all their records (their records stay in custody meanwhile).

        ``slot``: the slot of ``spool_dir`` this producer holds (one per live process);
        ``draining_slots``: slots left by other processes it is delivering;
        ``free_slot_records``: records in free slots it leaves alone while Kafka does not
        answer (as counted at its last look);
        ``undelivered``: records not yet in Kafka, what free slots hold included (those
        it delivers, and those it leaves alone while Kafka does not answer, as counted at
        its last look): what :meth:`flush` waits for.
        """
        if self._stale:  # first use in a forked child
            self._restart_in_child()
        gate, flight, replay, pump, counts = (
            self._gate, self._flight, self._replay, self._pump, self._counts
        )  # fmt: skip
        with gate.lock:
            sent, seq_next, seq_waits = gate.sent, gate.seq_next, gate.seq_waits
            outstanding = flight.outstanding()
            held = self._custody.held()
        drained, drain_rejected = self._drains.counts()
        out: dict[str, Any] = {
            "state": pump.state.value,
            "producer_id": self.producer_id,
            "next_seq": seq_next,
            "seq_waits": seq_waits,
            "sent": sent,
            "acked": flight.acked + replay.replayed,
            "spooled": self._custody.spooled,
            "replayed": replay.replayed,
            "dropped": counts["dropped"],
            "rejected": counts["rejected"],
            "buffered": held + outstanding,
            "in_flight": outstanding + len(replay.inflight),
            "spool_records": self._spool.count,
            "spool_bytes": self._spool.bytes,
            "recovered_at_start": self._recovered_at_start,
            "possible_duplicates": flight.possible_dups,
            "unconfirmed_acks": flight.unconfirmed,
            "transitions": pump.transitions,
            "degraded_s": round(pump.degraded_s(), 3),
            "alarm": self._alarm.reason,
            "retired_clients": len(flight.zombies),
            "spool_corrupt_files": self._spool.corrupt_files_moved,
            "spool_unreadable": self._spool.unreadable_ids,
            "slot": self._slot,
            "draining_slots": len(self._drains.drains),
            "free_slot_records": self._drains.waiting,
            "drained": drained,
            "drain_rejected": drain_rejected,
            "undelivered": self._undelivered(),
            "errors": dict(self._errors),
        }
        if self._shm is not None:
            out.update(self._shm.stats())
        return out

    @property
    def state(self) -> State:
        """The current state."""
        return self._pump.state

    # -- processes: fork, exit -----------------------------------------------------------

    def _forked(self) -> None:
        """In a child just forked (one thread runs): all this producer runs on is the
        parent's. Buried now, so that dropping the producer can never free them; its first
        use in the child starts afresh (``_restart_in_child``). Its clients, current and
        retired, are kept by :mod:`logsdk._fork` with every other client alive at the
        fork; the locks of its slot and ring are left to the parent (the child closes its
        copies of their descriptors: logsdk.spool._dirlock, logsdk.shm._ring)."""
        bury(self._spool)
        bury(self._shm)
        for d in self._drains.forget():
            bury(d)
        self._stale = True
        self._cold = True
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
            self._start()
            self._stale = False
            hook_exit()
        log.info(
            "logsdk producer started afresh in forked process %d: slot %d, producer id %s",
            os.getpid(),
            self._slot,
            self.producer_id,
        )

    def _close_stale(self) -> bool:
        """close() in a forked child that never used this producer: nothing of this
        process to deliver, and what it inherited is the parent's. True if it did that."""
        with self._restart_lock:
            if not self._stale:
                return False
            self._stale = False
            self._pump.mark_closed()
            _LIVE.discard(self)
            self._closed.set()
            return True

    def _delivered_counts(self) -> tuple[int, int]:
        """(acknowledged, rejected) so far: what a drain reports to its producer."""
        return self._flight.acked + self._replay.replayed, self._counts["rejected"]

    def _close_at_exit(self, timeout: float) -> None:
        """Close this producer (delivering for at most ``timeout`` seconds) when the process
        leaves (see :func:`logsdk.producer._process.close_at_exit`)."""
        close_at_exit(self, timeout)

    def _testing_hooks(self) -> ProducerHooks:
        """The testing hooks into this producer (:func:`logsdk.testing.producer_hooks`)."""
        return ProducerHooks(self)

    def _trace_reports(self, tracer: Callable[[int, KafkaError | None, Message], None]) -> None:
        """A testing hook (:func:`logsdk.testing.chaos.trace_deliveries`): ``tracer(seq,
        err, msg)`` on the pump thread before each delivery report is served, fresh and
        replayed (seq -1: a purged replay report, which has no headers). Install it right
        after the producer is built."""
        self._flight.trace(tracer)
        self._replay.trace(tracer)

    def __enter__(self) -> LogProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LogProducer(topic={self._topic!r}, state={self.state.value}, {self.config!r})"
