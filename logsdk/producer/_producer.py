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
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import dataclasses
import enum
import json
import logging
import os
import random
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from logsdk.errors import (
    BufferFullError,
    ConfigError,
    LogSDKError,
    ProducerClosedError,
    RecordTooLargeError,
    SerializationError,
    SpoolError,
    SpoolFullError,
    SpoolLockedError,
)
from logsdk.producer import _client
from logsdk.producer._config import ProducerConfig, WhenFull, check_topic
from logsdk.shm._ring import ShmRing, inspect, open_for_producer, segment_name
from logsdk.spool._slots import open_slot, orphans, slot_path, slot_shm_name, spooled_records
from logsdk.spool._spool import (
    Headers,
    Row,
    Spool,
    columns_bytes,
    decode_headers,
    encode_headers,
    row_size,
    transpose,
)

log = logging.getLogger("logsdk.producer")

#: Header names every record carries, so any reader can drop duplicates.
HEADER_PRODUCER = "logsdk.producer"
HEADER_SEQ = "logsdk.seq"
_SEQ_BLOCK = 1 << 20  # sequence numbers reserved on disk at a time
_TS_LIMIT = 1 << 63  # Kafka timestamps are int64 milliseconds
_PURGE_WAIT_S = 30.0  # how long a purge may take to hand records back
_SLOT_SCAN_S = 10.0  # how often free slots of spool_dir are looked at for leftovers
_BACKOFF_START_S = 0.1  # the health thread's first pause after a failed probe (doubles)
_SPOOL_BATCH = 5_000  # records per spool transaction
#: A delivery report without an error but without an offset either. librdkafka reports a
#: DUPLICATE_SEQUENCE_NUMBER reply as a success with no offset: the broker says it already
#: has the batch. Apache Kafka only says so for a batch it stored, but a broker that saved
#: the producer's sequence and then failed before storing the batch (Tansu 0.6 with S3
#: storage does this after a crash) says so too, and the records are gone. Such records are
#: treated as possibly persisted: spooled and resent (a duplicate at worst, which the
#: headers identify), never counted as acknowledged.
_UNCONFIRMED = "delivery reported without an offset (duplicate sequence reply); resending"

#: A record in memory: topic, key, value, user headers, timestamp ms, seq.
Rec = tuple[str, bytes | None, bytes | None, Headers | None, int | None, int]
#: Headers as confluent-kafka takes them.
KHeaders = list[tuple[str, str | bytes | None]]


class _Ticket(int):
    """A slot of the producer's in-flight table, and the delivery callback of the record
    that holds it.

    librdkafka holds the callback of every record in flight, and the record must come
    back with its report (librdkafka drops the headers from purged reports: nothing is
    rebuilt from one). The record itself is a plain tuple in ``_slots[ticket]``; the
    tickets are reused, so a producer in steady state allocates no object the garbage
    collector tracks beyond the record's own tuple, which the collector stops tracking at
    its first pass when every field is a str, bytes, int or None (a record with user
    headers holds their list, and stays tracked until its report). A callback object per
    record (the record as a tuple subclass, before) is tracked until its report: with
    100k records in flight, CPython's collector took 100-140 ms of a 1 s benchmark round.
    Each producer has its own subclass that names it in ``_producer``.
    """

    __slots__ = ()
    _producer: ClassVar[LogProducer]

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        p = self._producer
        slots = p._slots
        rec: Rec = slots[self]  # type: ignore[assignment]  # set before produce()
        slots[self] = None
        p._free.append(self)  # the record is out of the table: the ticket may serve again
        # _on_delivery()'s ack path, inlined (no chain of unconfirmed reports under way)
        if err is None and not p._dupseq and msg.offset() is not None:
            p._n_acked += 1  # _polled() notes the time of the progress, once per poll
            if p._shm is not None:
                p._shm.settle(rec[5])
            return
        p._on_delivery(rec, err, msg)


class _ReplayAck(int):
    """The spool row id of a replayed record, which is also its delivery callback.

    One small object per replayed record instead of a ``functools.partial`` of a bound
    method. The ack path only moves the id; the spool rows are deleted per batch in
    ``_settle_spool``. Each producer has its own subclass.
    """

    __slots__ = ()
    _producer: ClassVar[LogProducer]

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        p = self._producer
        if err is None and not p._dupseq and msg.offset() is not None:
            p._replay_inflight.pop(self, None)
            p._acked_ids.append(self)
            return
        p._on_replay_delivery(self, err, msg)


#: Every producer not yet closed, so a forked child can mark the ones it inherited.
_LIVE: weakref.WeakSet[LogProducer] = weakref.WeakSet()
#: What a forked child inherited from a producer of its parent: the librdkafka client
#: (its threads did not survive the fork: any call, its destructor included, can hang),
#: the spool's SQLite connections and lock (closing them could disturb the parent's
#: files), the shm mapping. Never used again, never freed, even at interpreter exit.
_GRAVE: list[object] = []


def _bury(obj: object) -> None:
    """Keep ``obj`` alive for the life of the process, finalisation included."""
    if obj is None:
        return
    _GRAVE.append(obj)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def _after_fork_in_child() -> None:
    for p in list(_LIVE):
        p._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class State(str, enum.Enum):
    """Where new records go: Kafka (ONLINE), the spool (DEGRADED), behind it (RECOVERING)."""

    ONLINE = "ONLINE"
    DEGRADED = "DEGRADED"
    RECOVERING = "RECOVERING"
    CLOSED = "CLOSED"


def _to_bytes(value: object, what: str) -> bytes | None:
    if value is None:
        return None
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: not text Kafka can carry
            raise SerializationError(
                f"{what} is not valid Unicode text ({exc.reason} at {exc.start}); "
                "pass bytes, or text without lone surrogates"
            ) from exc
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dict) and what == "value":
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            return text.encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise SerializationError(f"value is not JSON-serialisable: {exc}") from exc
    raise SerializationError(
        f"{what} must be bytes, str{' or a JSON-serialisable dict' if what == 'value' else ''}"
        f" or None, got {type(value).__name__}"
    )


def _is_utf8_text(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _user_headers(headers: object) -> Headers | None:
    if headers is None:
        return None
    items: Sequence[Any]
    if isinstance(headers, Mapping):
        items = list(headers.items())
    elif isinstance(headers, (list, tuple)):
        items = headers
    else:
        raise SerializationError("headers must be a mapping or a list of (str, bytes) pairs")
    out: Headers = []
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise SerializationError(f"header {item!r} is not a (name, value) pair")
        name, val = item
        if not isinstance(name, str):
            raise SerializationError(f"header name {name!r} must be str")
        if "\x00" in name or (not name.isascii() and not _is_utf8_text(name)):
            raise SerializationError(
                f"header name {name!r} must be text without NUL or lone surrogates"
            )
        if name.startswith("logsdk."):
            raise SerializationError(f"header names starting with 'logsdk.' are reserved: {name}")
        out.append((name, _to_bytes(val, f"header {name!r}")))
    return out or None


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
        self._topic = topic
        self._topics_ok: set[str] = {topic}  # topic names send() has checked
        # Set in a child forked after this producer started: its first use starts afresh.
        self._stale = False
        self._restart_lock = threading.Lock()
        # Producers delivering what free slots of spool_dir hold (see _drain_orphans).
        self._drains: list[LogProducer] = []
        self._drains_lock = threading.Lock()  # looking at slots: health thread, flush, close
        self._exit_timeout: float | None = None  # set by _close_at_exit()
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
            self._spool.close()
            raise

    def _start_on_spool(self, cfg: ProducerConfig) -> None:
        self.producer_id = self._spool.producer_id
        self._pid_bytes = self.producer_id.encode()
        self._pid_header = (HEADER_PRODUCER, self._pid_bytes)
        self._max_bytes = self.config.message_max_bytes
        self._ticket: type[_Ticket] = type(
            "_Ticket", (_Ticket,), {"__slots__": (), "_producer": self}
        )
        # Records handed to a client, by ticket; the tickets not in use (see _Ticket).
        self._slots: list[Rec | None] = []
        self._free: list[_Ticket] = []
        self._replay_ack: type[_ReplayAck] = type(
            "_ReplayAck", (_ReplayAck,), {"__slots__": (), "_producer": self}
        )
        self._seq_next = self._spool.seq_reserved
        self._seq_limit = self._seq_next + _SEQ_BLOCK
        self._spool.reserve_seq(self._seq_limit)
        # buffer="shm": every accepted record is also in a shared-memory ring until it is
        # acknowledged or spooled; what a dead owner left there goes to the spool first.
        self._shm: ShmRing | None = None
        self._shm_pressure = False  # a sender waits for room in the ring
        if cfg.buffer == "shm":
            self._shm = open_for_producer(
                self._spool, slot_shm_name(cfg.shm_name, self._slot), cfg.shm_bytes
            )
        self._recovered_at_start = self._spool.count

        # -- guarded by _lock (send path and state flips) --
        self._lock = threading.Lock()
        self._direct = False  # True: send() may hand records straight to librdkafka
        self._backlog: collections.deque[Rec] = collections.deque()
        self._backlog_max = self.config.buffer_max_records
        self._n_sent = 0
        self._n_produced = 0  # fresh records handed to librdkafka (any client)
        self._n_dropped = 0
        self._n_rejected = 0
        self._closing = False
        self._space = threading.Condition(self._lock)  # send() waiting for room

        # -- owned by the pump thread --
        self._client: Producer | None = None
        self._zombies: list[tuple[Producer, float]] = []
        self._state = State.DEGRADED
        self._n_acked = 0  # fresh records acknowledged
        self._n_failed = 0  # fresh records handed back by librdkafka (to spool or reject)
        self._n_replayed = 0
        self._n_spooled = 0
        self._n_possible_dups = 0
        self._n_unconfirmed = 0  # "delivered" reports without an offset: resent
        # (topic, partition) -> the offset librdkafka gives the next record of a batch whose
        # first record came back without one (see _unconfirmed); empty almost always.
        self._dupseq: dict[tuple[str | None, int | None], int] = {}
        self._failed: list[Rec] = []
        self._in_transit = 0  # records between memory and the spool (a commit under way)
        self._rejects: list[tuple[Row, str]] = []
        self._replay_cursor = 0
        # Spool row ids handed to the client and not yet reported, in id order (a dict:
        # ordered, so its first key is the oldest one outstanding).
        self._replay_inflight: dict[int, None] = {}
        self._acked_ids: list[int] = []  # acknowledged replays not yet deleted
        self._acked_kept = 0  # of those, how many a watermark delete had to keep
        self._acked_seen = 0  # len(_acked_ids) at the last step: more since is progress
        self._replay_failed = False  # a replay was reported failed since the cursor reset
        self._reject_ids: list[tuple[int, str]] = []
        self._replay_tokens = 0.0
        self._replay_refill = time.monotonic()
        self._spool_full = False
        self._alarm: str | None = None
        self._alarm_op = ""  # which spool operation raised it: "write", "settle" or "read"
        self._disk_retry_at = 0.0
        self._last_ack = time.monotonic()
        self._acked_polled = 0  # _n_acked at the last poll that saw it move
        self._last_idle = time.monotonic()
        self._transitions = 0
        # Log lines of the pump made while it holds _lock, written once it let go: a
        # logging framework's own lock (loguru, a structlog formatter) may be held by an
        # application thread that is waiting for _lock in send().
        self._deferred_logs: list[tuple[int, str, tuple[Any, ...]]] = []
        self._degraded_s = 0.0  # time spent DEGRADED, up to the last state change
        self._degraded_since = time.monotonic()
        self._errors: collections.Counter[str] = collections.Counter()

        # -- requests from other threads to the pump --
        self._want_degrade: str | None = None
        # Each degrade starts a new epoch; the health thread asks for a recovery with the
        # epoch its good probes were counted in, and a request from an older epoch (probes
        # that ended after the recovery they asked for had begun) is ignored.
        self._epoch = 0
        self._want_recover: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        # flush() or close() is waiting for Kafka: the health thread probes without backoff.
        self._urgent = 0  # guarded by _lock
        self._health_wake = threading.Event()
        self._close_deadline: float | None = None
        self._closed = threading.Event()  # close() has finished (the first call)
        self._done = threading.Condition()

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
        else:
            # Nothing to replay: start ONLINE and let the first failure degrade.
            self._client = self._new_client()
            self._state = State.ONLINE
            self._direct = True
        self._scan_slots()
        self._pump.start()
        self._health.start()

    def _open_spool(self) -> tuple[int, Spool]:
        """Take the lowest free slot of ``spool_dir`` (see :mod:`logsdk.spool._slots`)."""
        cfg = self.config
        return open_slot(
            cfg.spool_dir, synchronous=cfg.spool_synchronous, max_bytes=cfg.spool_max_bytes
        )

    # -- processes: fork, slots left by others, exit ---------------------------------------

    def _forked(self) -> None:
        """In a child just forked (one thread runs): all this producer runs on is the
        parent's. Buried now, so that dropping the producer can never free them; its first
        use in the child starts afresh (``_restart_in_child``)."""
        for obj in (self._client, self._spool, self._shm, *(z for z, _ in self._zombies)):
            _bury(obj)
        for d in self._drains:
            _bury(d)
        self._stale = True
        # The parent's locks may have been held by one of its threads at the fork.
        self._restart_lock = threading.Lock()
        self._drains_lock = threading.Lock()
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._closed = threading.Event()

    def _restart_in_child(self) -> None:
        """First use in a forked child: start as a new producer on the same configuration,
        with a slot of its own (producer id, seqs, spool, shm ring), a client and threads.
        The parent's records stay the parent's: the child sends none of them."""
        with self._restart_lock:
            if not self._stale:
                return
            self._drains = []
            self._close_deadline = None
            self._start()
            self._stale = False
            if self._exit_timeout is not None:
                self._register_exit(self._exit_timeout)
        log.info(
            "logsdk producer started afresh in forked process %d: slot %d, producer id %s",
            os.getpid(),
            self._slot,
            self.producer_id,
        )

    def _close_at_exit(self, timeout: float) -> None:
        """Close this producer (delivering for at most ``timeout`` seconds) when the process
        leaves: at interpreter exit, and at the end of a process that multiprocessing or
        billiard (Celery's pool) started, which leaves through ``os._exit`` (no atexit).
        Registered again in a forked child at its first use."""
        self._exit_timeout = timeout
        self._register_exit(timeout)

    def _register_exit(self, timeout: float) -> None:
        ref = weakref.ref(self)

        def close_at_exit() -> None:
            p = ref()
            if p is not None:
                p.close(timeout)

        atexit.register(close_at_exit)
        for name in ("multiprocessing.util", "billiard.util"):
            util = sys.modules.get(name)
            finalize = getattr(util, "Finalize", None)
            if finalize is not None:
                finalize(None, close_at_exit, exitpriority=10)

    def _scan_slots(self) -> None:
        """Close the drains that are done; start one for each free slot with records."""
        with self._drains_lock:
            self._collect_drains()
            self._drain_orphans()

    def _drain_orphans(self) -> None:
        """Deliver what the free slots of ``spool_dir`` hold (their producers died, were
        recycled, or closed before Kafka took everything). Each such slot is drained by a
        producer of its own on that slot, under the slot's producer id and seqs; this
        producer's flush() and close() wait for them, and it closes them once they are
        done (``_collect_drains``)."""
        cfg = self.config
        for index in orphans(cfg.spool_dir, self._slot):
            path = slot_path(cfg.spool_dir, index)
            if not self._holds_records(index, path):
                continue
            try:
                drain = _SlotDrain(cfg, index, path)
            except SpoolLockedError:
                continue  # another process took the slot meanwhile
            except LogSDKError as exc:
                self._errors["slot_drain"] += 1
                log.warning("spool slot %s left by another process not drained: %s", path, exc)
                continue
            log.info(
                "spool slot %s: %d record(s) left by another process; delivering them",
                path,
                drain._not_in_kafka(),
            )
            self._drains = [*self._drains, drain]

    def _holds_records(self, index: int, path: Path) -> bool:
        if spooled_records(path) > 0:
            return True
        if self.config.buffer != "shm":
            return False
        try:
            seg = segment_name(slot_shm_name(self.config.shm_name, index), path)
            return inspect(seg).pending > 0
        except LogSDKError:
            return False  # no segment (or not readable): nothing to resend from it

    def _collect_drains(self) -> None:
        """Close the drains that delivered everything."""
        done = [d for d in self._drains if d._not_in_kafka() == 0]
        if done:
            self._drains = [d for d in self._drains if d not in done]
            for d in done:
                d.close(0)

    # -- public API ----------------------------------------------------------------------

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
        if self._stale:  # first use in a forked child
            self._restart_in_child()
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
                self._errors["record_too_large"] += 1
            raise RecordTooLargeError(
                f"record of {size} bytes exceeds message_max_bytes={self._max_bytes}"
            )
        with self._lock:
            if self._closing:
                raise ProducerClosedError("the producer is closed; it accepts no more records")
            seq = self._seq_next
            if seq >= self._seq_limit:
                self._reserve_seq()
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
            self._errors["record_rejected"] += 1
            self._release(rec)  # refused: not in custody
            raise SerializationError(f"librdkafka refused the record: {exc}") from exc
        if isinstance(exc, KafkaException):
            if _client.is_record_exception(exc):  # the record itself: not accepted
                self._n_rejected += 1
                self._errors["record_rejected"] += 1
                self._release(rec)  # refused: not in custody
                raise RecordTooLargeError(f"librdkafka refused the record: {exc}") from exc
            self._errors["produce_error"] += 1
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
                    self._done.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        finally:
            for p in (self, *drains):
                p._hurry(-1)

    def _hurry(self, delta: int) -> None:
        with self._lock:
            self._urgent += delta
        self._health_wake.set()

    def close(self, timeout: float | None = 30.0) -> None:
        """Deliver every record to Kafka within ``timeout``, then stop; what Kafka could not
        take by then stays in the spool, for the next producer on ``spool_dir``.

        Delivering means what :meth:`flush` does: the backlog, the records in librdkafka,
        the shm ring and the spool (including rows left by an earlier run), with Kafka
        probed at once if it was down. At the deadline, every record not acknowledged is
        committed to the spool, and the log says how many and where (a warning). ``None``
        waits up to 60 s. A second call (from any thread) waits for the first one to end.

        It also waits for a health probe under way to end (bounded by what is left of
        ``timeout``, at least 0.2 s), so that nothing of this producer talks to the
        cluster once it has returned (an abandoned probe of the topic could create it on
        a broker that comes up later: seen in a test).
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
            # everything) are delivered too, within the same timeout.
            self._scan_slots()
            self._wait_until_delivered(deadline)
            self._stop.set()
            self._wake.set()
            self._health_wake.set()
            self._health.join(10)
            with self._drains_lock:
                for d in self._drains:
                    d.close(max(0.0, deadline - time.monotonic()))
            self._pump.join(max(30.0, budget + 30.0))
            self._shutdown(budget)
        finally:
            _LIVE.discard(self)
            self._closed.set()

    def _close_stale(self) -> bool:
        """close() in a forked child that never used this producer: nothing of this
        process to deliver, and what it inherited is the parent's. True if it did that."""
        with self._restart_lock:
            if not self._stale:
                return False
            self._stale = False
            self._closing = True
            self._drains = []
            self._state = State.CLOSED
            _LIVE.discard(self)
            self._closed.set()
            return True

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

    # -- send path helpers (caller holds _lock) ----------------------------------------------

    def _reserve_seq(self) -> None:
        # On disk first: a failed write raises with nothing advanced, so no seq is ever
        # used that a restart could hand out again.
        limit = self._seq_limit + _SEQ_BLOCK
        self._spool.reserve_seq(limit)
        self._seq_limit = limit

    def _enqueue(self, rec: Rec) -> None:
        """Append to the backlog, applying ``when_full`` when memory and spool are full."""
        cfg = self.config
        full = len(self._backlog) >= cfg.buffer_max_records or (
            self._spool_full and cfg.when_full in ("block", "raise")
        )
        if full:
            policy = cfg.when_full
            if policy == "drop_newest":
                self._n_dropped += 1  # accepted (counted in sent by the caller), then dropped
                self._release(rec)
                return
            if policy == "drop_oldest":
                if len(self._backlog) >= cfg.buffer_max_records:
                    self._release(self._backlog.popleft())
                    self._n_dropped += 1
                self._backlog.append(rec)
                return
            if policy == "raise":
                raise SpoolFullError(self._full_reason())
            deadline = time.monotonic() + cfg.max_block_s
            while (
                len(self._backlog) >= cfg.buffer_max_records or self._spool_full
            ) and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BufferFullError(
                        f"{self._full_reason()}; waited max_block_s={cfg.max_block_s}"
                    )
                self._wake.set()
                self._space.wait(min(left, 0.05))
        self._backlog.append(rec)

    def _full_reason(self) -> str:
        if self._spool_full:
            return (
                f"Kafka is unavailable and the spool is full (spool_max_bytes="
                f"{self.config.spool_max_bytes})"
            )
        return f"memory buffer full (buffer_max_records={self.config.buffer_max_records})"

    # -- shm buffer hooks ---------------------------------------------------------------------

    def _release(self, rec: Rec) -> None:
        """``rec`` left custody (acknowledged, spooled, dropped or refused): free its slot."""
        if self._shm is not None:
            self._shm.settle(rec[5])

    def _shm_full(self, rec: Rec) -> Rec | None:
        """The ring has no room for ``rec`` (caller holds _lock): apply ``when_full``.

        ``drop_newest`` drops the record (None; counted as sent and dropped), ``raise``
        raises :class:`BufferFullError`; ``block`` and ``drop_oldest`` wait up to
        ``max_block_s`` while the pump makes room. Returns the record once it is in the
        ring (its seq was taken before the wait, so no other sender can reuse it).
        """
        cfg, shm = self.config, self._shm
        assert shm is not None
        self._shm_pressure = True
        self._wake.set()
        reason = f"shm ring full (shm_bytes={shm.capacity})"
        if cfg.when_full == "drop_newest":
            self._n_sent += 1
            self._n_dropped += 1
            return None
        if cfg.when_full == "raise":
            raise BufferFullError(reason)
        deadline = time.monotonic() + cfg.max_block_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BufferFullError(f"{reason}; waited max_block_s={cfg.max_block_s}")
            self._space.wait(min(left, 0.05))
            if self._closing:
                raise ProducerClosedError("the producer is closed; it accepts no more records")
            if shm.put(rec):
                return rec
            self._shm_pressure = True
            self._wake.set()

    def _relieve_shm(self) -> None:
        """Senders wait for room in the ring: wake them, and spill the backlog to the spool
        as a full memory buffer does (records in flight free their room when acked)."""
        self._shm_pressure = False
        with self._lock:
            backlog = len(self._backlog)
            self._space.notify_all()
        if backlog:
            if self._state is State.ONLINE:
                self._request_degrade("shm ring full")
            elif self._state is State.RECOVERING:
                self._spool_pending()

    # -- delivery callbacks (pump thread) ---------------------------------------------------

    def _on_delivery(self, rec: Rec, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            if not self._unconfirmed(msg):
                self._n_acked += 1
                if self._shm is not None:
                    self._shm.settle(rec[5])
                return
            # Unconfirmed: a delivery that possibly persisted the record; spooled, resent.
            self._failed.append(rec)
            self._n_failed += 1
            self._unconfirmed_seen()
            return
        if _client.is_record_error(err):
            self._reject(rec, err)
            self._n_failed += 1
            return
        if err.code() in _client.POSSIBLY_PERSISTED:
            self._n_possible_dups += 1
        self._errors[err.name()] += 1
        self._failed.append(rec)  # before the count below: flush() must never miss it
        self._n_failed += 1
        self._request_degrade(f"delivery failed: {err.str()}")

    def _on_replay_delivery(self, rid: int, err: KafkaError | None, msg: Message) -> None:
        # _ReplayAck handles the plain ack path itself (only the id moves; the counters and
        # the ack clock are updated per batch in _settle_spool); the rest comes here.
        if err is None and not self._unconfirmed(msg):
            self._replay_inflight.pop(rid, None)
            self._acked_ids.append(rid)
            return
        self._replay_inflight.pop(rid, None)
        # Neither in flight nor acknowledged: the watermark delete must not pass this row
        # (rows up to the cursor are deleted by id until the cursor is reset).
        self._replay_failed = True
        if err is None:  # unconfirmed (see _UNCONFIRMED): the row stays, and is resent
            self._unconfirmed_seen()
            return
        if _client.is_record_error(err):
            self._reject_replayed(rid, _seq_of(msg), err.str())
            return
        if err.code() in _client.POSSIBLY_PERSISTED:
            self._n_possible_dups += 1
        self._errors[err.name()] += 1
        self._request_degrade(f"replay delivery failed: {err.str()}")

    def _unconfirmed(self, msg: Message) -> bool:
        """True for a "delivered" report that no offset confirms (see ``_UNCONFIRMED``).

        librdkafka gives the batch's base offset to its first record and base+i to the
        others; after a duplicate-sequence reply the base is -1, so the first record has no
        offset and the rest of its batch come right after it (in the same poll) with the
        offsets 0, 1, 2... Those are unconfirmed too. The chain ends at the first report of
        that partition that breaks it, and at the end of the poll (``_polled``).
        """
        off = msg.offset()
        key = (msg.topic(), msg.partition())
        if off is None:
            self._dupseq[key] = 0
            return True
        nxt = self._dupseq.get(key)
        if nxt is None:
            return False
        if off == nxt:
            self._dupseq[key] = nxt + 1
            return True
        del self._dupseq[key]
        return False

    def _unconfirmed_seen(self) -> None:
        """Count one unconfirmed delivery report and degrade, so its record is resent."""
        self._n_unconfirmed += 1
        self._errors["unconfirmed_ack"] += 1
        self._n_possible_dups += 1
        self._request_degrade(_UNCONFIRMED)

    def _polled(self) -> None:
        """A poll or flush returned: every batch it reported is complete, and the ring
        slots of the records it settled are flagged (one lock for the lot). Acknowledgements
        it served count as progress for the stall detector (one clock read per poll, not
        per record: delivery reports are only served inside poll() and flush())."""
        if self._n_acked != self._acked_polled:
            self._acked_polled = self._n_acked
            self._last_ack = time.monotonic()
        if self._dupseq:
            self._dupseq.clear()
        if self._shm is not None:
            self._shm.drain_settled()

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._errors["fatal"] += 1
            self._request_degrade(f"fatal client error: {err.str()}")
        elif _client.is_cluster_down(err):
            self._request_degrade(f"cluster unreachable: {err.str()}")

    def _reject_replayed(self, rid: int, seq: object, why: str) -> None:
        """Kafka refused spool row ``rid`` (on produce or on delivery): count it, say so,
        and have the pump move it to the rejected table."""
        with self._lock:
            self._n_rejected += 1
        self._errors["rejected"] += 1
        log.error("record seq=%s rejected by Kafka (%s); set aside", seq, why)
        self._reject_ids.append((rid, why))

    def _reject(self, rec: Rec, err: KafkaError) -> None:
        with self._lock:
            self._n_rejected += 1
        self._errors["rejected"] += 1
        log.error("record seq=%d rejected by Kafka (%s); set aside in the spool", rec[5], err.str())
        self._rejects.append((_row(rec), err.str()))

    def _request_degrade(self, reason: str) -> None:
        if self._want_degrade is None:
            self._want_degrade = reason
        self._wake.set()

    # -- pump thread ------------------------------------------------------------------------

    def _pump_loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self._step()
                self._flush_logs()
            except Exception:  # a bug: say so loudly, keep the records, keep pumping
                self._errors["pump"] += 1
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
                    self._errors["pump"] += 1
                    log.exception("librdkafka poll failed; replacing the client")
                    self._request_degrade("poll failed")
                self._wake.clear()

    def _step(self) -> bool:
        """One round of work; True when there may be more to do right away."""
        client = self._client
        if client is not None:
            client.poll(0)
            self._polled()
        if self._zombies:
            self._poll_retired()
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

    def _outstanding(self) -> int:
        return self._n_produced - self._n_acked - self._n_failed

    def _unsettled(self) -> int:
        """Records neither acknowledged nor committed to the spool (nor dropped/rejected)."""
        with self._lock:
            backlog = len(self._backlog) + self._in_transit + len(self._failed)
        # Records Kafka refused wait in _rejects until the rejected table holds them.
        return backlog + len(self._rejects) + max(0, self._outstanding())

    def _not_in_kafka(self) -> int:
        """Records accepted and not yet acknowledged by Kafka: in memory or in the spool
        (not counting the rejected and the dropped)."""
        return self._unsettled() + self._spool.count + sum(d._not_in_kafka() for d in self._drains)

    def _new_client(self) -> Producer:
        return _client.new_producer(self.config.librdkafka(), self._on_error)

    def _connect(self, client: Producer) -> None:
        """Have a new client connect to the cluster's brokers before the replay starts.

        An idempotent client sends nothing before the broker gives it a producer id, and
        librdkafka asks for one on a 500 ms timer unless a broker connection comes up
        meanwhile. Its first metadata answer comes through the bootstrap connection, which
        it then closes; the first attempt finds no broker up, and with the real broker not
        yet connected (librdkafka connects on demand) the id came 0.5 to 1 s after the
        client was built, measured: the whole replay window waited for it. A second
        metadata request needs a real broker connection; once that is up the id is asked
        at once (about 70 ms after the client was built instead of 500 to 1000).
        Best effort: a failure here only leaves librdkafka to its timer.
        """
        timeout = min(self.config.probe_timeout_s, 1.0)
        for _ in range(2):
            try:
                client.list_topics(self._topic, timeout=timeout)
            except KafkaException:
                return

    def _set_state(self, new: State, reason: str) -> None:
        old = self._state
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
            self._set_state(State.DEGRADED, reason)
        self._flush_logs()
        self._retire_client()
        # The purge's own failure reports asked for a degrade: this one. Left pending, the
        # request would end the next recovery at its first step.
        self._want_degrade = None
        self._replay_inflight.clear()
        self._replay_cursor = 0  # unacknowledged replays are still in the spool: re-read
        self._replay_failed = False

    def _retire_client(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        try:
            client.purge(in_queue=True, in_flight=True, blocking=False)
        except KafkaException as exc:  # a fatal client may refuse; its reports still come
            log.warning("purge failed: %s", exc)
        deadline = time.monotonic() + _PURGE_WAIT_S
        # len(client): its records not yet reported, and reports not yet served. Only this
        # client's: one retired earlier (still owing reports) is polled, not waited for.
        while len(client) > 0 and time.monotonic() < deadline:
            client.poll(0.05)
            self._polled()
            if self._zombies:
                self._poll_retired()
        if len(client) > 0:
            # Never drop a client that still owes delivery reports: its records would be lost.
            log.error(
                "client still holds %d record(s) after purge; keeping it until it reports",
                len(client),
            )
            self._zombies.append((client, time.monotonic()))
        else:
            del client

    def _poll_retired(self) -> None:
        """Serve the reports of clients retired while they still owed some; a client that
        owes none (librdkafka's out queue is empty) is dropped."""
        keep = []
        for z, since in self._zombies:
            z.poll(0)
            self._polled()
            if len(z):
                keep.append((z, since))
            else:
                log.warning(
                    "retired client reported its last record %.1fs after its purge",
                    time.monotonic() - since,
                )
        self._zombies = keep

    def _start_recovery(self) -> None:
        self._spool_pending()  # what is already failed goes first
        if self._failed:
            return  # the disk refused them: stay DEGRADED (records in memory) and retry
        self._client = self._new_client()
        self._connect(self._client)
        self._replay_cursor = 0
        self._replay_failed = False
        self._replay_tokens = 0.0
        self._replay_refill = time.monotonic()
        reason = (
            "replaying the spool left by an earlier run"
            if self._transitions == 0
            else f"{self.config.recovery_probes} good probes"
        )
        self._set_state(State.RECOVERING, reason)
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
        # Spool drained: the backlog (all newer than anything replayed) goes next.
        with self._lock:
            while self._backlog:
                if not self._produce_backlog_rec(self._backlog[0]):
                    return True
                self._backlog.popleft()
            self._direct = True
            self._set_state(State.ONLINE, "spool drained")
            self._space.notify_all()
        return False

    def _replay_some(self) -> bool:
        cfg = self.config
        window = cfg.replay_batch * 2
        room = window - len(self._replay_inflight)
        if room <= 0 or self._client is None:
            return False
        if cfg.replay_max_rate is not None:
            now = time.monotonic()
            self._replay_tokens = min(
                float(cfg.replay_batch),
                self._replay_tokens + (now - self._replay_refill) * cfg.replay_max_rate,
            )
            self._replay_refill = now
            room = min(room, int(self._replay_tokens))
            if room <= 0:
                return False
        try:
            rows = self._spool.read_replay(self._replay_cursor, min(room, cfg.replay_batch))
        except SpoolError as exc:
            self._disk_alarm(exc, "read")
            return False
        if self._alarm is not None:
            self._disk_ok("read")
        if not rows and not self._replay_inflight and not self._acked_ids and not self._reject_ids:
            # Nothing left to read, in flight or to delete, yet the gauges say rows remain:
            # they are off (a bug). Counted again from the table, so the replay can end.
            self._spool.recount_if_off()
            return False
        client = self._client
        produce = client.produce
        ack = self._replay_ack
        inflight = self._replay_inflight
        pid_header = self._pid_header
        cursor = self._replay_cursor
        sent = 0
        for rid, topic, key, value, hblob, ts, seq in rows:
            hdrs: KHeaders = [pid_header, (HEADER_SEQ, seq)]  # seq: the header's bytes
            if hblob is not None:
                hdrs = [*decode_headers(hblob), *hdrs]
            try:
                produce(topic, value, key, -1, ack(rid), None, ts or 0, hdrs)
            except BufferError:
                break
            except (ValueError, TypeError) as exc:
                # Fields the client cannot take (a row written before send() checked them,
                # or by another program): set aside, and the cursor moves past it.
                self._reject_replayed(rid, seq.decode(), f"{type(exc).__name__}: {exc}")
                cursor = rid
                continue
            except KafkaException as exc:
                if _client.is_record_exception(exc):
                    self._reject_replayed(rid, seq.decode(), str(exc))
                    cursor = rid
                    continue
                self._errors["produce_error"] += 1
                self._request_degrade(f"replay produce failed: {exc}")
                break
            inflight[rid] = None
            cursor = rid
            sent += 1
        self._replay_cursor = cursor
        if cfg.replay_max_rate is not None:
            self._replay_tokens -= sent
        return sent > 0

    def _drain_backlog_to_client(self) -> bool:
        """ONLINE with a backlog (librdkafka was full): feed it in order, then go direct."""
        if self._direct:
            # Read without _lock: the pump steps after every poll, and taking the lock each
            # time made it queue behind send(), which holds it most of the time. Only send()
            # and the pump change _direct; a send() that just turned it off sets _wake.
            return False
        with self._lock:
            if self._direct or not self._backlog:
                if not self._direct and not self._backlog:
                    self._direct = True
                return False
            if len(self._backlog) > self.config.buffer_max_records:
                self._want_degrade = "local queue full beyond buffer_max_records"
                return True
            while self._backlog:
                if not self._produce_backlog_rec(self._backlog[0]):
                    return False
                self._backlog.popleft()
            self._direct = True
            self._space.notify_all()
        return False

    def _new_ticket(self) -> _Ticket:
        """A ticket for one more record in flight (none free: the table grows by one)."""
        ticket = self._ticket(len(self._slots))
        self._slots.append(None)
        return ticket

    def _give_back(self, ticket: _Ticket) -> None:
        """produce() refused the record under ``ticket``: librdkafka holds neither, so no
        report will free it. (Any other exception keeps the ticket taken: had the record
        gone in, its report will come; a leak, never a reuse under a live record.)"""
        self._slots[ticket] = None
        self._free.append(ticket)

    def _produce_rec(self, rec: Rec) -> bool:
        """Hand one record to the client (caller holds _lock), under a ticket that brings it
        back with its delivery report.

        True: handed over. False: not now (librdkafka's queue is full, or the client is
        broken and a degrade is requested). Raises KafkaException when librdkafka refuses
        the record itself (too large, invalid): the caller decides what that means.
        """
        topic, k, v, h, ts, seq = rec
        hdrs: KHeaders = [self._pid_header, (HEADER_SEQ, b"%d" % seq)]
        if h:
            hdrs = [*h, *hdrs]
        free = self._free
        ticket = free.pop() if free else self._new_ticket()
        self._slots[ticket] = rec
        try:
            # librdkafka drops headers from the reports of purged records, so the record
            # comes back through its ticket: nothing is rebuilt from a report.
            self._client.produce(  # type: ignore[union-attr]
                topic,
                v,
                k,
                -1,
                ticket,
                None,
                ts or 0,
                hdrs,
            )
        except (BufferError, KafkaException, ValueError, TypeError) as exc:
            self._give_back(ticket)
            if isinstance(exc, BufferError):
                return False
            if not isinstance(exc, KafkaException) or _client.is_record_exception(exc):
                raise
            self._errors["produce_error"] += 1
            self._request_degrade(f"produce failed: {exc}")
            return False
        self._n_produced += 1
        return True

    def _produce_backlog_rec(self, rec: Rec) -> bool:
        """Hand an already accepted record to the client; one Kafka refuses is set aside."""
        try:
            return self._produce_rec(rec)
        except (KafkaException, ValueError, TypeError) as exc:
            self._errors["rejected"] += 1
            self._n_rejected += 1
            self._deferred_logs.append(
                (
                    logging.ERROR,
                    "record seq=%d rejected by Kafka (%s); set aside in the spool",
                    (rec[5], exc),
                )
            )
            self._rejects.append((_row(rec), str(exc)))
            return True  # out of the backlog: kept in the spool's rejected table

    def _spool_pending(self, limit: int | None = None) -> bool:
        """Commit failed records, then the backlog's head, to the spool. True if more left."""
        if self._alarm is not None and time.monotonic() < self._disk_retry_at:
            return False
        if self._failed:
            self._failed.sort(key=lambda r: r[5])  # send order, whatever the partition
            with self._lock:
                batch, self._failed = self._failed, []
                self._in_transit = len(batch)
            try:
                ok = self._commit(batch, from_backlog=False)
            except BaseException:  # a bug: keep the records, let the pump report it
                ok = False
                raise
            finally:
                if not ok:
                    self._failed = batch + self._failed
                self._in_transit = 0
            if not ok or self._failed:
                # Not written, or the spool took only part of them: nothing newer may go
                # in before the rest (a smaller backlog record could fit the room left).
                return False
        with self._lock:
            backlog = self._backlog
            n = min(len(backlog), _SPOOL_BATCH if limit is None else limit)
            if n == len(backlog):  # all of it (the usual case): copied in C, under the lock
                batch = list(backlog)
                backlog.clear()
            else:
                batch = [backlog.popleft() for _ in range(n)]
            # Counted until committed, so flush() never sees them as settled too early.
            self._in_transit = n
        if not batch:
            return False
        try:
            ok = self._commit(batch, from_backlog=True)
        except BaseException:
            ok = False
            raise
        finally:
            if not ok:
                with self._lock:
                    self._backlog.extendleft(reversed(batch))
            self._in_transit = 0
        if not ok:
            return False
        with self._lock:
            self._space.notify_all()
            return bool(self._backlog)

    def _commit(self, recs: list[Rec], from_backlog: bool) -> bool:
        """Write records to the spool under the cap policy. False: not written, keep them.
        True: written, except a tail the full spool had no room for (``block``/``raise``),
        which goes back where ``recs`` came from once the rest is committed."""
        rest: list[Rec] = []
        n = len(recs)
        # Transposed in C; a record's row is the record itself, but for its user headers
        # (a list), which the spool keeps packed in one blob.
        cols = transpose(recs)  # type: ignore[arg-type]
        if cols[3].count(None) != n:
            cols[3] = tuple(map(encode_headers, cols[3]))
        total = columns_bytes(cols)
        room = self._spool.room()
        if room is not None:
            need = total
            if need > room:
                rows: list[Row] = list(zip(*cols, strict=True))
                sizes = [row_size(r) for r in rows]
                policy = self.config.when_full
                if policy == "drop_oldest":
                    try:
                        # Rows already handed to Kafka for replay are not dropped: they may
                        # arrive, and a record counted as dropped must not.
                        dropped = self._spool.drop_oldest(need - room, self._replay_cursor)
                    except SpoolError as exc:
                        self._disk_alarm(exc, "write")
                        return False
                    if dropped:
                        with self._lock:
                            self._n_dropped += dropped
                        log.warning("spool full: dropped %d oldest record(s)", dropped)
                    room = self._spool.room() or 0
                fit, used = 0, 0
                for s in sizes:
                    if used + s > room:
                        break
                    used += s
                    fit += 1
                if fit < n:
                    if policy in ("drop_newest", "drop_oldest"):
                        self._release_seqs(cols[5][fit:])
                        with self._lock:
                            self._n_dropped += n - fit
                        log.warning("spool full: dropped %d newest record(s)", n - fit)
                    else:
                        # block / raise: keep the rest in memory; send() applies the policy.
                        self._spool_full = True
                        if fit == 0:
                            return False
                        rest = recs[fit:]
                    cols, total = transpose(rows[:fit]), used
                else:
                    self._spool_full = False
            else:
                self._spool_full = False
        try:
            self._spool.append_columns(cols, total)
        except SpoolError as exc:
            self._disk_alarm(exc, "write")
            return False
        self._n_spooled += len(cols[5])
        self._release_seqs(cols[5])
        if rest:
            if from_backlog:
                with self._lock:
                    self._backlog.extendleft(reversed(rest))
            else:
                self._failed = rest + self._failed
        if self._alarm is not None:
            self._disk_ok("write")
        return True

    def _disk_ok(self, op: str) -> None:
        """``op`` succeeded: clear the alarm if that kind of operation raised it."""
        if op == self._alarm_op:
            log.warning("spool usable again (%s): %s cleared", op, self._alarm)
            self._alarm = None

    def _release_seqs(self, seqs: Iterable[int]) -> None:
        """The records with these seqs left custody: free their ring slots."""
        if self._shm is not None:
            for seq in seqs:
                self._shm.settle(seq)

    def _disk_alarm(self, exc: SpoolError, op: str) -> None:
        """The spool failed ``op``; the same kind of operation succeeding clears it."""
        if self._alarm is None:
            log.error("spool unusable, records kept in memory until it recovers: %s", exc)
        self._alarm = str(exc)
        self._alarm_op = op
        self._errors["spool_io"] += 1
        self._disk_retry_at = time.monotonic() + 1.0

    def _settle_spool(self) -> None:
        """Delete acknowledged replays and set rejected ones aside; after a disk error,
        retried once a second (``_disk_retry_at``); their success clears an alarm they raised."""
        n = len(self._acked_ids)
        if n > self._acked_seen:
            # Replays acknowledged since the last step: the stall detector sees progress
            # (their rows are deleted once per replay batch, which may take longer).
            self._acked_seen = n
            self._last_ack = time.monotonic()
        if self._alarm is not None and time.monotonic() < self._disk_retry_at:
            return
        wrote = False
        try:
            if self._rejects:
                # Left in _rejects until committed (flush() counts them): on an error
                # they stay there and are retried.
                rejects = self._rejects[:]
                self._spool.reject(rejects)
                del self._rejects[: len(rejects)]
                wrote = True
                self._release_seqs([r[5] for r, _ in rejects])
            if self._reject_ids:
                pairs, self._reject_ids = self._reject_ids, []
                try:
                    self._spool.move_to_rejected(pairs)
                except SpoolError:
                    self._reject_ids = pairs + self._reject_ids  # retried: still in the spool
                    raise
                wrote = True
            if self._acked_ids and (
                len(self._acked_ids) - self._acked_kept >= self.config.replay_batch
                or not self._replay_inflight
                or self._state is not State.RECOVERING
            ):
                # One DELETE transaction per replay batch, not per pump step: a page
                # of rows is then rewritten once, not once per step that freed some.
                self._delete_acked()
                wrote = True
            if self._spool_full and (self._spool.room() or 0) > 0:
                self._spool_full = False
                with self._lock:
                    self._space.notify_all()
        except SpoolError as exc:
            self._disk_alarm(exc, "settle")
            return
        if wrote and self._alarm is not None:
            self._disk_ok("settle")

    def _delete_acked(self) -> None:
        """Delete the acknowledged replays from the spool (pump thread, from _settle_spool).

        While replaying, by watermark: every row up to the one before the oldest still in
        flight was handed to Kafka in id order and acknowledged (a failed one sets
        ``_replay_failed``, a rejected one waits in ``_reject_ids``), so one range DELETE
        removes them; acknowledged ids above it wait for a later batch (a crash resends
        them: duplicates, never a loss). Otherwise (degraded, closing, a replay failed),
        by id: exactly the acknowledged rows.
        """
        ids, self._acked_ids = self._acked_ids, []
        self._acked_kept = 0
        keep: list[int] = []
        try:
            if (
                self._state is State.RECOVERING
                and self._client is not None
                and not self._replay_failed
            ):
                inflight = self._replay_inflight
                mark = self._replay_cursor
                if inflight:
                    mark = min(mark, next(iter(inflight)) - 1)
                if self._reject_ids:
                    mark = min(mark, min(r for r, _ in self._reject_ids) - 1)
                keep = [i for i in ids if i > mark]
                gone = self._spool.delete_through(mark)
            else:
                gone = self._spool.delete(ids)
        except SpoolError:
            self._acked_ids = ids + self._acked_ids  # still in the spool: delete them later
            self._acked_kept = self._acked_seen = len(self._acked_ids)
            raise
        self._acked_ids = keep + self._acked_ids
        self._acked_kept = len(keep)
        self._acked_seen = len(self._acked_ids)
        # The rows that left the spool: a late acknowledgement (a retired client's) of a
        # row when_full="drop_oldest" has dropped meanwhile counted it dropped already.
        self._n_replayed += gone
        self._last_ack = time.monotonic()

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
            self._errors["lost_on_close"] += lost
        left = self._spool.count
        if left:
            log.warning(
                "close(): %d record(s) not delivered to Kafka within %gs are kept in the "
                "spool %s; the next producer opened on that spool_dir delivers them",
                left,
                budget,
                self._spool.directory,
            )
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

    # -- health thread ----------------------------------------------------------------------

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
                    self._errors["slot_drain"] += 1
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
                    ok = client is not None and _client.client_probe(
                        client, self._topic, cfg.probe_timeout_s
                    )
                    bad = 0 if ok else bad + 1
                    if bad >= 2:
                        self._request_degrade("health probe failed twice")
                        bad = 0
                    next_probe = time.monotonic() + cfg.probe_interval_s
                self._stop.wait(0.1)
            elif state is State.DEGRADED:
                if self._epoch != epoch:  # a new outage: earlier probes do not count
                    epoch, good, bad, backoff = self._epoch, 0, 0, _BACKOFF_START_S
                if _client.probe(cfg.probe_config(), self._topic, self._probe_timeout()):
                    good += 1
                    backoff = _BACKOFF_START_S
                    if good >= cfg.recovery_probes:
                        good = 0
                        self._want_recover = epoch
                        self._wake.set()
                    self._stop.wait(0.1)
                else:
                    good = 0
                    delay = backoff * (0.5 + random.random())  # jitter: no thundering herd
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

    def _drain_orphans(self) -> None:
        return


def _headers_of(msg: Message) -> Headers:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(n, v.encode() if isinstance(v, str) else v) for n, v in items]


def _seq_of(msg: Message) -> int:
    for name, val in reversed(_headers_of(msg)):
        if name == HEADER_SEQ and val is not None:
            return int(val)
    return -1


def _row(rec: Rec) -> Row:
    topic, k, v, h, ts, seq = rec
    return (topic, k, v, encode_headers(h), ts, seq)
