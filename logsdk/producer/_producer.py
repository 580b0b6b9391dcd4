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

This module is the facade: the public API and its documentation, delegated to one
engine (``_engine.Engine``: the parts wired by ``_wiring.wire``, started and stopped as
one). The parts, each a class of its own module that owns its state and says in its
docstring which thread may call what:

- ``_intake.Intake``: the send path (send lock, seqs, backlog, direct sends, when_full);
- ``_identity.SeqReserver``: seq blocks reserved on disk ahead of need (pump);
- ``_inflight.InFlight``: the client, the in-flight table (tickets), delivery reports;
- ``_custody.Custody``: records handed back, spool commits, the spool's cap;
- ``_rejects.Rejects``: what a rejection does (count, say, set aside);
- ``_alarm.DiskAlarm``: a spool that fails (retries, rebuild of a damaged file);
- ``_replay.Replayer``: the spool sent back to Kafka, paced, with its watermark;
- ``_pump.Pump``: the pump thread and the state machine, as one table;
- ``_health.Health``: probes with backoff, the stall detector (``decide``: a pure step);
- ``_drains.Drains``: the free slots of ``spool_dir`` other processes left;
- ``_counters.Counters``: counts several threads add to (errors, dropped, rejected).

``_records`` says what a record is in memory, what send() accepts and the headers a
record carries; ``_client`` builds clients, classifies librdkafka's errors and runs probes;
``_process`` reaches every engine at a fork and at exit. Who owns what, and a record's
path through the parts: docs/engineering/design.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

from logsdk.producer._config import ProducerConfig, WhenFull
from logsdk.producer._engine import Engine
from logsdk.producer._intake import Intake
from logsdk.producer._outlet import Outlet
from logsdk.producer._pump import State
from logsdk.producer._records import HEADER_PRODUCER, HEADER_SEQ

__all__ = ["HEADER_PRODUCER", "HEADER_SEQ", "LogProducer", "State"]


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
    [`close()`][logsdk.LogProducer.close], which delivers to Kafka within its timeout (the spool
    included) and leaves in the spool only what Kafka could not take by then.
    [`flush()`][logsdk.LogProducer.flush] means "in Kafka" too;
    [`flush_durable()`][logsdk.LogProducer.flush_durable] means "in Kafka or on local disk".
    Thread-safe: ``send()`` may be called from any number of threads.

    ``buffer="shm"`` also keeps every accepted record in a ring in POSIX shared memory
    (named ``shm_name``, by default derived from ``spool_dir``; ``shm_bytes`` long) until
    Kafka acknowledged it or the spool committed it, so a producer restarted after a crash
    of this process (even SIGKILL) resends them. A full ring is handled per ``when_full``
    (``drop_oldest`` waits like ``block``); see `logsdk.shm._ring` for the layout.

    ``delivery="agent"``: ``send()`` only writes the record into a shared-memory ring of
    this process (``shm_bytes`` long) and returns; ``logsdk agent --spool-root
    <spool_dir>`` (one per host and spool root) ships it to Kafka, spooling and replaying
    it there. No librdkafka client, thread or SQLite file in this process; flush() and
    close() wait for the agent to have taken the records (see docs/agent.md).
    ``start_agent=True``: when no agent holds ``spool_dir``, the constructor starts one in
    the background (it outlives this process; its log is ``spool_dir/agent/agent.log``).

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
        delivery: Literal["direct", "agent"] = "direct",
        start_agent: bool = False,
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
            delivery=delivery,
            start_agent=start_agent,
        )
        self._engine: Engine | Outlet
        if delivery == "agent":
            self._engine = Outlet(self.config)
            self.__dict__["send"] = self._engine.send
        else:
            self._engine = Engine(self.config, on_start=self._bind_send)

    def _bind_send(self, intake: Intake) -> None:
        # send() is the intake's own bound method, found in this instance's dict: one call
        # per record, no hop through the facade (bound again by a forked child's start).
        self.__dict__["send"] = intake.send

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
        [`SerializationError`][logsdk.errors.SerializationError], a TypeError, before acceptance).
        ``timestamp``: milliseconds since the epoch (default: now). Raises
        [`RecordTooLargeError`][logsdk.errors.RecordTooLargeError] above ``message_max_bytes`` and,
        only when Kafka is unavailable and the spool is full, per ``when_full``.
        """
        engine = self._engine
        sender = engine.send if isinstance(engine, Outlet) else engine.parts.intake.send
        sender(value, key, topic=topic, headers=headers, timestamp=timestamp)

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
        or on local disk, use [`flush_durable()`][logsdk.LogProducer.flush_durable].
        """
        return self._engine.flush(timeout)

    def flush_durable(self, timeout: float | None = None) -> int:
        """Wait until every record is acknowledged by Kafka or committed to the spool.

        Durability without waiting for Kafka: while Kafka is down, the records in memory
        are committed to the spool (which survives a crash of this process) and the call
        returns. Returns how many records are in neither place (0 when done). ``None``
        waits up to 60 s.
        """
        return self._engine.flush_durable(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Deliver every record to Kafka within ``timeout``, then stop; what Kafka could not
        take by then stays in the spool, for the next producer on ``spool_dir``.

        Delivering means what [`flush()`][logsdk.LogProducer.flush] does: the backlog, the records
        in librdkafka, the shm ring and the spool (including rows left by an earlier run), with
        Kafka probed at once if it was down; and what free slots of ``spool_dir`` hold, where
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
        self._engine.close(timeout)

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
        its last look): what [`flush()`][logsdk.LogProducer.flush] waits for.
        """
        return self._engine.stats()

    @property
    def state(self) -> State:
        """The current state."""
        return self._engine.state

    @property
    def producer_id(self) -> str:
        """The stable id every record of this producer carries (``logsdk.producer``): its
        slot's of ``spool_dir`` (in a forked child, the child's own once it sent)."""
        return self._engine.producer_id

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
        return (
            f"LogProducer(topic={self.config.topic!r}, state={self.state.value}, {self.config!r})"
        )


def engine_of(producer: LogProducer) -> Engine:
    """The engine under ``producer``: for tools that look at its parts
    ([`logsdk.testing.producer_hooks()`][logsdk.testing.producer_hooks]), not an API."""
    engine = producer._engine
    if not isinstance(engine, Engine):
        raise TypeError("a producer with delivery='agent' has no engine")
    return engine
