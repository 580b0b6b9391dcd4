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
  there) and touches the spool; ``send()`` only appends or produces under a lock.

This module is the facade: the public API (send, flush, flush_durable, close, stats) and
the wiring. The rest of the producer is built in layers, each a class of its own module
that owns a part of the state (declared in ``_core``) and states that part's invariants;
each layer extends the one before it, and LogProducer the last:

- ``_core``: the shared state, declared by owner, and ``State``;
- ``_identity``: the producer id and seq reservation;
- ``_inflight``: the client, the in-flight table (tickets), delivery reports;
- ``_custody``: the records not yet in Kafka (backlog, spool commits, overflow, disk alarm);
- ``_replay``: the spool sent back to Kafka, paced, with its watermark;
- ``_pump``: the pump thread and the state machine, as one table;
- ``_process``: fork, the slots of spool_dir, exit;
- ``_health``: probes with backoff, the stall detector.

``_records`` says what a record is in memory and what send() accepts; ``_client`` builds
clients, classifies librdkafka's errors and runs probes. A record's path through them:
docs/engineering/design.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from confluent_kafka import KafkaException

from logsdk._resolver import resolver_ready
from logsdk.errors import (
    ConfigError,
    LogSDKError,
    ProducerClosedError,
    RecordTooLargeError,
    SerializationError,
)
from logsdk.producer import _client
from logsdk.producer._config import ProducerConfig, WhenFull, check_topic
from logsdk.producer._core import ErrorCounts, State
from logsdk.producer._health import _Health
from logsdk.producer._process import _LIVE
from logsdk.producer._records import (
    HEADER_PRODUCER,
    HEADER_SEQ,
    KHeaders,
    Rec,
    _to_bytes,
    _user_headers,
)
from logsdk.shm._ring import open_for_producer
from logsdk.spool._slots import open_slot, slot_shm_name
from logsdk.spool._spool import Spool

__all__ = ["HEADER_PRODUCER", "HEADER_SEQ", "LogProducer", "State"]

log = logging.getLogger("logsdk.producer")

_TS_LIMIT = 1 << 63  # Kafka timestamps are int64 milliseconds


class LogProducer(_Health):
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
        self._topic = topic
        self._topics_ok = {topic}
        self._init_processes()
        # A kafka_config librdkafka refuses fails here, before the spool is opened, not in
        # the pump once a client is needed (a spool with leftovers makes that one later).
        _client.check_config(self.config.librdkafka())
        self._start()
        _LIVE.add(self)

    def _start(self) -> None:
        """Open a slot of spool_dir, a client and the threads: everything a producer runs
        on (the constructor, and a forked child's first use of the producer)."""
        cfg = self.config
        self._slot, self._spool = self._open_spool()
        try:
            self._start_on_spool(cfg)
        except BaseException:
            # Nothing of it may stay held: a corrected retry in this process must work.
            if getattr(self, "_shm", None) is not None:
                self._shm.close(unlink=False)  # type: ignore[union-attr]
            self._spool.owner.take()  # the pump, if it was made, never ran
            self._spool.close()
            raise

    def _start_on_spool(self, cfg: ProducerConfig) -> None:
        self._init_identity()
        self._max_bytes = cfg.message_max_bytes
        self._init_inflight()
        self._init_replay()
        # buffer="shm": every accepted record is also in a shared-memory ring until it is
        # acknowledged or spooled; what a dead owner left there goes to the spool first.
        self._shm = None
        if cfg.buffer == "shm":
            self._shm = open_for_producer(
                self._spool, slot_shm_name(cfg.shm_name, self._slot), cfg.shm_bytes
            )
        self._recovered_at_start = self._spool.count

        # -- guarded by _lock (send path and state flips) --
        self._lock = threading.Lock()
        self._direct = False  # True: send() may hand records straight to librdkafka
        self._n_sent = 0
        self._n_dropped = 0
        self._n_rejected = 0
        self._closing = False
        self._space = threading.Condition(self._lock)  # send() waiting for room

        self._errors = ErrorCounts()
        self._closed = threading.Event()  # close() has finished (the first call)
        self._done = threading.Condition()  # notified after every pump step
        self._init_custody()
        self._init_pump()
        self._init_health()

        self._pump = threading.Thread(target=self._pump_loop, name="logsdk-pump", daemon=True)
        self._health = threading.Thread(target=self._health_loop, name="logsdk-health", daemon=True)
        if self._recovered_at_start:
            log.info(
                "spool %s holds %d record(s) from an earlier run; they are replayed first",
                self._spool.directory,
                self._recovered_at_start,
            )
            # No outage has been seen, so no probes to wait for (an empty spool starts
            # ONLINE at once too): the pump starts replaying now; a failure degrades.
            self._state = State.DEGRADED
            self._want_recover = self._epoch
        elif not resolver_ready():
            # No client can connect from this process (logsdk._resolver): records go to
            # the spool, and the health thread waits for the resolver, not for Kafka.
            self._state = State.DEGRADED
        else:
            # Nothing to replay: start ONLINE and let the first failure degrade. The client
            # is made by the first send() (``_warm_up``), which then goes direct: a process
            # that forks before it logs (gunicorn --preload's master) has no librdkafka
            # thread resolving a name at the fork (see logsdk._resolver).
            self._state = State.ONLINE
        self._cold = True
        self._scan_slots()
        # From here on the spool (its connection, its files) is the pump's alone; close()
        # takes it back once the pump has ended.
        self._spool.owner.hand_to(self._pump)
        self._pump_owner.hand_to(self._pump)
        self._pump.start()
        self._health.start()

    def _warm_up(self) -> None:
        """Before the first record: start afresh in a forked child, and make the client of
        a producer that started ONLINE, so that send() goes direct from its first record."""
        if self._stale:
            self._restart_in_child()
        with self._restart_lock:
            if not self._cold:
                return
            if self._client is None and self._state is State.ONLINE and not self._closing:
                client = self._new_client()
                with self._lock:
                    # The pump may have degraded meanwhile (it flips the state under _lock,
                    # then owns _client until it recovers with a client of its own): then
                    # this one is not needed, and holds nothing.
                    mine = self._state is State.ONLINE and self._client is None
                    if mine:
                        self._client = client
                        if not self._backlog:
                            self._direct = True
                if not mine:
                    del client
            self._cold = False

    def _open_spool(self) -> tuple[int, Spool]:
        """Take the lowest free slot of ``spool_dir`` (see :mod:`logsdk.spool._slots`)."""
        cfg = self.config
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
            with self._lock:
                self._n_rejected += 1
                self._errors.add("record_too_large")
            raise RecordTooLargeError(
                f"record of {size} bytes exceeds message_max_bytes={self._max_bytes}"
            )
        with self._lock:
            if self._closing:
                raise ProducerClosedError("the producer is closed; it accepts no more records")
            seq = self._seq_next
            if seq >= self._seq_limit:  # never while the pump keeps up (see _identity)
                seq = self._wait_for_seq()
            # Taken now: a wait below (ring or buffer full) releases the lock, so another
            # sender must not get the same seq. A refused record gives it back when no
            # one took a later one meanwhile (else it leaves a gap, never a reuse).
            self._seq_next = seq + 1
            try:
                if timestamp is None:
                    # Fixed now, so a record spooled and replayed keeps its creation time.
                    timestamp = time.time_ns() // 1_000_000
                rec: Rec = (topic, k, v, h, timestamp, seq)
                shm = self._shm
                # Ring full: wait for room, or raise/drop per when_full (None: dropped).
                if (
                    shm is not None
                    and not shm.put_fields(topic, k, v, h, timestamp, seq)
                    and self._shm_full(rec) is None
                ):
                    return
                if self._direct:
                    # _produce_rec() inlined: this is the hot path.
                    hdrs: KHeaders = [self._pid_header, (HEADER_SEQ, b"%d" % seq)]
                    if h:
                        hdrs = [*h, *hdrs]
                    # In the table and counted first: the pump may serve its ack before
                    # produce() returns here, and flush() must never see one record less
                    # outstanding.
                    free = self._free
                    ticket = free.pop() if free else self._new_ticket()
                    self._slots[ticket] = rec
                    self._n_produced += 1
                    try:
                        # Positional: produce()'s keyword parsing costs 0.3 µs a call.
                        # (topic, value, key, partition, on_delivery, callback, timestamp,
                        # headers); the ticket is the callback.
                        self._client.produce(  # type: ignore[union-attr]
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
                        self._n_produced -= 1
                        self._give_back(ticket)
                        self._direct_refused(rec, exc)
                    else:
                        self._n_sent += 1
                        return
                backlog = self._backlog
                if len(backlog) < self._backlog_max and not self._spool_full:
                    backlog.append(rec)  # _enqueue() when there is room, inlined
                else:
                    try:
                        self._enqueue(rec)
                    except BaseException:
                        self._release(rec)  # refused: not in custody
                        raise
                self._n_sent += 1
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
                elif self._seq_next == seq + 1:
                    if self._shm is not None:
                        # A refused record's frame was settled by seq: flag it now, while
                        # the seq still names that frame and not the next record's (also
                        # when the pump's drain has already taken it from the list).
                        self._shm.drain_all()
                    self._seq_next = seq
                raise
        wake = self._wake
        if not wake.is_set():  # set() takes a lock each time; the pump clears before a step
            wake.set()

    def _direct_refused(
        self, rec: Rec, exc: BufferError | KafkaException | ValueError | TypeError
    ) -> None:
        """send()'s produce raised (caller holds _lock): queue the record behind the client
        (full, or broken: a degrade is requested), or raise when Kafka refuses the record."""
        if isinstance(exc, (ValueError, TypeError)):  # the client refused its fields
            self._n_rejected += 1
            self._errors.add("record_rejected")
            self._release(rec)  # refused: not in custody
            raise SerializationError(f"librdkafka refused the record: {exc}") from exc
        if isinstance(exc, KafkaException):
            if _client.is_record_exception(exc):  # the record itself: not accepted
                self._n_rejected += 1
                self._errors.add("record_rejected")
                self._release(rec)  # refused: not in custody
                raise RecordTooLargeError(f"librdkafka refused the record: {exc}") from exc
            self._errors.add("produce_error")
            self._request_degrade(f"produce failed: {exc}")
        self._direct = False  # full, or the client is broken: queue behind it

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
        self._scan_slots()
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
                if left == 0 or time.monotonic() >= deadline or not self._pump.is_alive():
                    return left
                if self._state is State.DEGRADED and self._spool_full:
                    return left  # nowhere to put them until Kafka or spool space returns
                self._done.wait(min(0.05, max(0.0, deadline - time.monotonic())))

    def _wait_until_delivered(self, deadline: float) -> int:
        """flush() and close(): wait until nothing is left to deliver, or the deadline."""
        self._wake.set()
        drains = self._drains
        for p in (self, *drains):
            p._hurry(+1)  # their health threads probe without backoff meanwhile
        try:
            with self._done:
                while True:
                    left = self._not_in_kafka()
                    if left == 0 or time.monotonic() >= deadline or not self._pump.is_alive():
                        return left
                    if self._client is None and not resolver_ready():
                        return left  # no client can connect from this process: in the spool
                    self._done.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        finally:
            for p in (self, *drains):
                p._hurry(-1)

    def close(self, timeout: float | None = 30.0) -> None:
        """Deliver every record to Kafka within ``timeout``, then stop; what Kafka could not
        take by then stays in the spool, for the next producer on ``spool_dir``.

        Delivering means what :meth:`flush` does: the backlog, the records in librdkafka,
        the shm ring and the spool (including rows left by an earlier run), with Kafka
        probed at once if it was down; and what free slots of ``spool_dir`` hold, where
        Kafka answers (with Kafka down they are left for the next producer). At the
        deadline, every record not acknowledged is committed to the spool, and the log
        says how many and where (a warning). ``None`` waits up to 60 s. A second call
        (from any thread) waits for the first one to end.

        It also waits for a health probe under way to end (probes give up within 0.1 s
        once close() stops them), so that nothing of this producer talks to the cluster
        once it has returned (an abandoned probe of the topic could create it on a broker
        that comes up later: seen in a test).
        """
        budget = 60.0 if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + budget
        if self._stale and self._close_stale():
            return
        with self._lock:
            first = not self._closing
            self._closing = True
            self._space.notify_all()
        if not first:
            self._closed.wait(budget + 60.0)
            return
        try:
            self._close_deadline = deadline
            # Slots other processes left (a pool's children that closed before Kafka took
            # everything) are delivered too, within the same timeout, if Kafka answers.
            self._scan_slots(closing_by=deadline)
            self._wait_until_delivered(deadline)
            self._stop.set()
            self._wake.set()
            self._health_wake.set()
            # A probe under way ends within its timeout (``_probe_timeout``: probe_timeout_s,
            # or what close() has left); one that does not (its client's threads wedged by
            # a lock held at a fork) is left behind.
            left = max(0.0, deadline - time.monotonic())
            self._health.join(max(left, self.config.probe_timeout_s) + 1.0)
            if self._health.is_alive():
                log.warning(
                    "close(): a health probe of this producer did not end by the deadline; "
                    "closing without it"
                )
            with self._drains_lock:
                for d in self._drains:
                    d.close(max(0.0, deadline - time.monotonic()))
            self._pump.join(max(30.0, budget + 30.0))
            if self._pump.is_alive():
                # Its spool and records are still its own: nothing here may touch them.
                self._errors.add("pump_stuck")
                log.error(
                    "close(): the pump thread did not stop within %gs; the records it holds "
                    "stay where they are (the spool, memory) and this producer is left open",
                    max(30.0, budget + 30.0),
                )
            else:
                self._spool.owner.take()
                self._pump_owner.take()
                self._shutdown(budget)
        finally:
            _LIVE.discard(self)
            self._closed.set()

    def _shutdown(self, budget: float) -> None:
        """After the threads stopped: everything unacknowledged goes to the spool."""
        with self._lock:
            self._direct = False
        self._retire_client()
        for z, _ in self._zombies:
            z.flush(5)
            self._polled()
        self._disk_retry_at = 0.0  # last chance: try the disk now, whatever the alarm
        self._settle_spool()
        while self._failed or self._backlog:
            before = len(self._failed) + len(self._backlog)
            self._disk_retry_at = 0.0
            self._spool_pending()
            if len(self._failed) + len(self._backlog) >= before:
                break
        lost = len(self._failed) + len(self._backlog) + len(self._rejects)
        if lost:
            log.error(
                "close(): %d record(s) could not be written to the spool (%s) and are lost",
                lost,
                self._alarm or "spool full",
            )
            self._errors.add("lost_on_close", lost)
        left = self._spool.count
        if left:
            self._report_left(left, budget)
        self._state = State.CLOSED
        self._flush_logs()
        if self._shm is not None:
            # Clean close: every record is acknowledged or spooled, so the segment goes.
            # Otherwise it stays, and the next producer on it resends what it holds.
            self._shm.close(unlink=self._shm.pending == 0)
        self._spool.close()
        # The ticket classes name this producer, a reference cycle: without it, a closed
        # producer and its in-flight table (one ticket per record in flight at the peak)
        # are freed as soon as the application drops it, not at the cyclic collector's
        # next full pass. Nothing serves a report once the threads have stopped. (The
        # class that holds the name may be a base: chaos tracing subclasses them.)
        for cls in (*self._ticket.__mro__, *self._replay_ack.__mro__):
            if vars(cls).get("_producer") is self:
                delattr(cls, "_producer")

    def _report_left(self, left: int, budget: float) -> None:
        """close(): say once that ``left`` records stay in this producer's spool."""
        log.warning(
            "close(): %d record(s) not delivered to Kafka within %gs are kept in the "
            "spool %s; the next producer opened on that spool_dir delivers them",
            left,
            budget,
            self._spool.directory,
        )

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
        ``undelivered``: records not yet in Kafka, those slots' included (what
        :meth:`flush` waits for).
        """
        if self._stale:  # first use in a forked child
            self._restart_in_child()
        with self._lock:
            backlog = len(self._backlog) + self._in_transit + len(self._failed)
            sent, dropped, rejected = self._n_sent, self._n_dropped, self._n_rejected
            produced = self._n_produced
        outstanding = produced - self._n_acked - self._n_failed
        out: dict[str, Any] = {
            "state": self._state.value,
            "producer_id": self.producer_id,
            "next_seq": self._seq_next,
            "seq_waits": self._n_seq_waits,
            "sent": sent,
            "acked": self._n_acked + self._n_replayed,
            "spooled": self._n_spooled,
            "replayed": self._n_replayed,
            "dropped": dropped,
            "rejected": rejected,
            "buffered": backlog + outstanding,
            "in_flight": outstanding + len(self._replay_inflight),
            "spool_records": self._spool.count,
            "spool_bytes": self._spool.bytes,
            "recovered_at_start": self._recovered_at_start,
            "possible_duplicates": self._n_possible_dups,
            "unconfirmed_acks": self._n_unconfirmed,
            "transitions": self._transitions,
            "degraded_s": round(
                self._degraded_s
                + (
                    time.monotonic() - self._degraded_since
                    if self._state is State.DEGRADED
                    else 0.0
                ),
                3,
            ),
            "alarm": self._alarm,
            "retired_clients": len(self._zombies),
            "spool_corrupt_files": self._spool.corrupt_files_moved,
            "spool_unreadable": self._spool.unreadable_ids,
            "slot": self._slot,
            "draining_slots": len(self._drains),
            "undelivered": self._not_in_kafka(),
            "errors": dict(self._errors),
        }
        if self._shm is not None:
            out.update(self._shm.stats())
        return out

    @property
    def state(self) -> State:
        """The current state."""
        return self._state

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
        return f"LogProducer(topic={self._topic!r}, state={self._state.value}, {self.config!r})"


class _SlotDrain(LogProducer):
    """Delivers what a free slot of a spool_dir holds, under the slot's own producer id
    and seqs (and the shm ring its dead owner left), then is closed by the producer that
    started it. It sends nothing of its own and drains no other slot."""

    def __init__(self, config: ProducerConfig, index: int, path: Path) -> None:
        self._drain_at = (index, path)
        super().__init__(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})

    def _open_spool(self) -> tuple[int, Spool]:
        index, path = self._drain_at
        cfg = self.config
        spool = Spool(path, synchronous=cfg.spool_synchronous, max_bytes=cfg.spool_max_bytes)
        return index, spool.open()

    def _orphans_with_records(self) -> list[tuple[int, Path]]:
        return []  # a drain delivers its own slot only

    def _report_left(self, left: int, budget: float) -> None:
        # Said once already, by the producer that left these records (its own close());
        # every process that tries to deliver them would otherwise say it again.
        log.debug("drain of %s closed; %d record(s) stay there", self._spool.directory, left)
