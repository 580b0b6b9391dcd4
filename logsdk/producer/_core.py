"""The state every part of a :class:`~logsdk.producer.LogProducer` shares, in one place.

A producer is one object built in layers, each a class of its own module that owns a
part of this state and states that part's invariants (the facade's module docstring
lists them). They share one object, not references to each other, so that the hot path
(``send()``, the delivery callbacks) reads plain attributes: the layers are a way of
reading the code, not of calling through it. Each layer sets up its own part in its
``_init_*`` method; the declarations below say, per part, what each attribute is.
"""

from __future__ import annotations

import collections
import enum
import threading
from typing import TYPE_CHECKING, Any

from logsdk._owner import Owner

if TYPE_CHECKING:
    from confluent_kafka import Producer

    from logsdk.producer._config import ProducerConfig
    from logsdk.producer._inflight import _Ticket
    from logsdk.producer._producer import LogProducer
    from logsdk.producer._records import Rec
    from logsdk.producer._replay import _Pace, _ReplayAck
    from logsdk.shm._ring import ShmRing
    from logsdk.spool._spool import Row, Spool


class State(str, enum.Enum):
    """Where new records go: Kafka (ONLINE), the spool (DEGRADED), behind it (RECOVERING)."""

    ONLINE = "ONLINE"
    DEGRADED = "DEGRADED"
    RECOVERING = "RECOVERING"
    CLOSED = "CLOSED"


class ErrorCounts(collections.Counter[str]):
    """Errors by kind, counted from any thread: the send path, the pump, the health
    thread, flush() and close() all add to it, sometimes to the same kind, so each
    increment takes a lock of its own (a leaf lock: nothing is called while it is held).
    Read as a plain dict (``dict(counts)`` is one C call)."""

    def __init__(self) -> None:
        super().__init__()
        self._add_lock = threading.Lock()

    def add(self, kind: str, n: int = 1) -> None:
        """Count ``n`` more errors of ``kind``."""
        with self._add_lock:
            self[kind] += n


class _Core:
    """The shared state, declared by owner; and the two calls every layer makes."""

    # -- _producer (the facade): configuration, the spool, the send path's lock --
    config: ProducerConfig
    _topic: str
    _topics_ok: set[str]  # topic names send() has checked
    _spool: Spool
    _shm: ShmRing | None  # buffer="shm": the ring every accepted record is also in
    _max_bytes: int
    _recovered_at_start: int
    _lock: threading.Lock  # the send path and state flips
    _space: threading.Condition  # on _lock: send() waiting for room
    _direct: bool  # True: send() may hand records straight to librdkafka (guarded by _lock)
    _n_sent: int  # guarded by _lock, as the two below
    _n_dropped: int
    _n_rejected: int
    _closing: bool
    _errors: ErrorCounts  # any thread, through add()
    _closed: threading.Event  # close() has finished (the first call)
    _done: threading.Condition  # notified after every pump step
    _pump: threading.Thread
    _health: threading.Thread

    # -- _identity: the producer id and seq reservation --
    producer_id: str
    _pid_bytes: bytes
    _pid_header: tuple[str, bytes]
    _seq_next: int  # the next record's seq (guarded by _lock)
    _seq_limit: int  # seqs below it are reserved on disk (written by the pump under _lock)
    _seq_block: int  # seqs reserved at a time
    _seq_refill_at: int  # the pump reserves the next block once _seq_next reaches it (pump)
    _seq_retry_at: float  # after a failed reservation, when the pump tries again (pump)
    _n_seq_waits: int  # send() calls that waited for a reservation (guarded by _lock)
    _seq_waits_logged: int  # _n_seq_waits when the pump last logged them (pump)
    _seq_log_at: float  # the pump logs those waits again no sooner than this (pump)

    # -- _inflight: the client and the records it holds (pump thread) --
    _client: Producer | None  # None while DEGRADED (pump thread)
    _zombies: list[tuple[Producer, float]]  # retired clients that still owe reports
    _ticket: type[_Ticket]
    _slots: list[Rec | None]  # in-flight records, by ticket
    _free: list[_Ticket]  # tickets not in use
    _n_produced: int  # fresh records handed to librdkafka, any client (guarded by _lock)
    _n_acked: int  # fresh records acknowledged
    _n_failed: int  # fresh records handed back by librdkafka (to spool or reject)
    _n_possible_dups: int
    _n_unconfirmed: int  # "delivered" reports without an offset: resent
    # (topic, partition) -> the offset librdkafka gives the next record of a batch whose
    # first record came back without one (see _unconfirmed); empty almost always.
    _dupseq: dict[tuple[str | None, int | None], int]
    _last_ack: float  # when an acknowledgement last came (the stall detector's clock)
    _acked_polled: int  # _n_acked at the last poll that saw it move
    # Kafka answered this producer (an acknowledgement, a good probe) since its last
    # degrade: free slots may be drained now. Published flag: pump and health set it.
    _answered: bool

    # -- _custody: the records not yet in Kafka --
    _backlog: collections.deque[Rec]  # guarded by _lock
    _backlog_max: int
    _failed: list[Rec]  # handed back by a client, for the spool (pump thread)
    _in_transit: int  # records between memory and the spool (a commit under way)
    _rejects: list[tuple[Row, str]]  # refused by Kafka, for the rejected table
    _n_spooled: int
    _spool_full: bool  # the spool has no room (block/raise wait for it)
    _shm_pressure: bool  # a sender waits for room in the shm ring
    _alarm: str | None  # why the disk cannot be used, or None
    _alarm_op: str  # which spool operation raised it: "write", "settle" or "read"
    _disk_retry_at: float
    _rebuilt_at: float  # when the pump last rebuilt a damaged spool (monotonic)

    # -- _replay: the spool sent back to Kafka --
    _replay_ack: type[_ReplayAck]
    _replay_cursor: int  # the id of the last row handed to the client
    # Spool row ids handed to the client and not yet reported, in id order (a dict:
    # ordered, so its first key is the oldest one outstanding).
    _replay_inflight: dict[int, None]
    _acked_ids: list[int]  # acknowledged replays not yet deleted
    _acked_kept: int  # of those, how many a watermark delete had to keep
    _acked_seen: int  # len(_acked_ids) at the last step: more since is progress
    _replay_failed: bool  # a replay was reported failed since the cursor reset
    _reject_ids: list[tuple[int, str]]  # rows Kafka refused, for the rejected table
    _pace: _Pace
    _n_replayed: int

    # -- _pump: the pump thread and the state machine --
    # The state only the pump thread may touch (the failed records, the replay, delivery
    # reports, the state machine, seq reservations; the spool has an Owner of its own):
    # handed to the pump before it starts, taken back by close() once it has ended.
    _pump_owner: Owner
    _state: State
    _transitions: int
    _degraded_s: float  # time spent DEGRADED, up to the last state change
    _degraded_since: float
    _last_idle: float  # when nothing was last in flight (the stall detector's other clock)
    # Log lines of the pump made while it holds _lock, written once it let go.
    _deferred_logs: list[tuple[int, str, tuple[Any, ...]]]
    # -- requests from other threads to the pump (guarded by _request_lock) --
    _request_lock: threading.Lock  # a leaf lock: taken with or without _lock held
    _want_degrade: str | None
    # Each degrade starts a new epoch; the health thread asks for a recovery with the
    # epoch its good probes were counted in, and a request from an older epoch (probes
    # that ended after the recovery they asked for had begun) is ignored.
    _epoch: int
    _want_recover: int | None
    _wake: threading.Event
    _stop: threading.Event

    # -- _process: fork, slots, exit --
    # Set in a child forked after this producer started: its first use starts afresh.
    _stale: bool
    # Set until the first send() (of this process) has run ``_warm_up``.
    _cold: bool
    _restart_lock: threading.Lock
    _slot: int  # the slot of spool_dir this producer holds
    # Producers delivering what free slots of spool_dir hold (see _drain_orphans).
    _drains: list[LogProducer]
    _drains_lock: threading.Lock  # looking at slots: health thread, flush, close

    # -- _health: the health thread --
    # flush() or close() is waiting for Kafka: the health thread probes without backoff.
    _urgent: int  # guarded by _lock
    _health_wake: threading.Event
    _close_deadline: float | None  # set by close(): probes end by then

    def _request_degrade(self, reason: str) -> None:
        """Ask the pump to degrade (any thread): the first reason since its last step wins."""
        with self._request_lock:
            if self._want_degrade is None:
                self._want_degrade = reason
        self._wake.set()

    def _start(self) -> None:
        """Open a slot, a client and the threads (the facade's; see LogProducer._start)."""
        raise NotImplementedError
