"""The intake: the send path and the state it owns, under the send lock.

``send()`` runs on any number of application threads: it validates a record, takes a seq
from memory and hands the record over, to librdkafka directly while the producer is
ONLINE with nothing queued (``direct``), else to the backlog, in send order. The pump
takes records from the backlog's head (into the client, or into the spool), puts back what
it could not place, turns direct sends on and off, and raises the seq reservation; it does
so only through the methods below, which are the only code that changes this state.

Invariants owned here:
- seqs are handed out in order, below ``seq_limit`` (reserved on disk ahead of need: see
  `logsdk.producer._identity`); one taken and then refused goes back only when no
  later one was taken meanwhile (else a gap, never a reuse), and never once the record
  may have reached librdkafka;
- records reach Kafka in send order per key: once the backlog is in use, every newer
  record goes through it (``direct`` is off); ``direct`` goes on only once the backlog is
  empty and no sender waits for its turn (``waiters``, in seq order), and a sender that
  waits for room takes its turn in that order;
- a record taken from the backlog is counted (``taken``) until it is in the client's
  in-flight table or committed to the spool, or put back: `held()` never misses one;
- the backlog holds at most ``buffer_max_records``; past it, and with a full shm ring or
  spool, ``when_full`` says what happens (wait up to ``max_block_s``, drop, or raise);
- with ``buffer="shm"`` every accepted record is in the ring first, and a record refused
  or dropped here has its frame settled at once.

Owner: the send lock (`Intake.lock`), not a thread. Every field is read and written
with it held, except those said "published" (one attribute read, a stale value harmless).
The pump holds it only for what must change at once with the send path (a state flip,
``direct``, the backlog's head), never while it does I/O or hands records to librdkafka;
the health thread never takes it. Other parts may hold it to read one consistent picture
(the in-flight table and the backlog, for flush() and stats()), never to change a field.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaException

from logsdk.errors import (
    BufferFullError,
    ConfigError,
    LogSDKError,
    ProducerClosedError,
    RecordTooLargeError,
    SerializationError,
    SpoolError,
    SpoolFullError,
)
from logsdk.producer import _client
from logsdk.producer._config import ProducerConfig, check_topic
from logsdk.producer._counters import Counters
from logsdk.producer._inflight import InFlight
from logsdk.producer._records import HEADER_SEQ, KHeaders, Rec, _to_bytes, _user_headers
from logsdk.producer._rejects import Rejects
from logsdk.shm._ring import ShmRing

_TS_LIMIT = 1 << 63  # Kafka timestamps are int64 milliseconds
_CLOSED = "the producer is closed; it accepts no more records"


class Intake:
    """The send path and its state (see the module docstring)."""

    def __init__(
        self,
        config: ProducerConfig,
        seqs: tuple[int, int],
        *,
        flight: InFlight,
        ring: ShmRing | None,
        rejects: Rejects,
        counters: Counters,
        wake: threading.Event,
        degrade: Callable[[str], None],
        alarm: Callable[[], str | None],
        first_use: Callable[[], Intake],
    ) -> None:
        self._config = config
        self._topic = config.topic
        self._max_bytes = config.message_max_bytes
        self._flight = flight
        self._ring = ring
        self._rejects = rejects
        self._counters = counters
        self._wake = wake
        self._degrade = degrade
        self._alarm = alarm
        self._first_use = first_use
        self._pid_header = flight.pid_header
        #: Topics send() has checked (a set: each name once). Any application thread:
        #: GIL-atomic set operations, an idempotent cache.
        self._topics_ok = {config.topic}
        self.lock = threading.Lock()
        #: On ``lock``: senders waiting for room (backlog, ring, spool, seqs) wait here;
        #: whoever makes room notifies.
        self.space = threading.Condition(self.lock)
        #: The next record must first make this producer ready (its first client, or a
        #: new start in a forked child): see ``first_use``. Published.
        self.cold = True
        #: close() began: send() refuses. Published (read by the health thread).
        self.closing = False
        #: send() may hand records straight to librdkafka (ONLINE, nothing queued). Only
        #: send() (turning it off when the client refuses a record) and the pump change
        #: it. Published to the pump, which reads it without the lock between its steps.
        self.direct = False
        #: Records accepted and not handed to librdkafka, in send order.
        self.backlog: collections.deque[Rec] = collections.deque()
        #: The seqs of senders waiting for room, in seq order (see the module docstring).
        self.waiters: collections.deque[int] = collections.deque()
        #: Records the pump took from the backlog's head and has not yet placed.
        self.taken = 0
        #: The next record's seq; seqs below ``seq_limit`` are reserved on disk.
        self.seq_next, self.seq_limit = seqs
        #: send() calls that had to wait for a reservation (0 unless the pump stalls).
        self.seq_waits = 0
        #: Records accepted by send().
        self.sent = 0
        #: A sender waits for room in the shm ring (the pump wakes senders and spills).
        #: Published: send() raises it, the pump lowers it (`relieve()`).
        self.shm_pressure = False
        #: The spool has no room: block/raise wait for it. Published: the pump writes it
        #: (`spool_has_room()`).
        self.spool_full = False

    # -- the send path (application threads) ---------------------------------------------

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
        """``LogProducer.send()`` (documented there): the hot path, one record at a time,
        every step inline."""
        if self.cold:  # the first record (of this process)
            live = self._first_use()
            if live is not self:  # a forked child's new start: its intake takes it
                return live.send(value, key, topic=topic, headers=headers, timestamp=timestamp)
        v = value if type(value) is bytes else _to_bytes(value, "value")
        k = key if (key is None or type(key) is bytes) else _to_bytes(key, "key")
        h = None if headers is None else _user_headers(headers)
        if topic is None:
            topic = self._topic
        elif type(topic) is not str or topic not in self._topics_ok:
            check_topic(topic)
            if len(self._topics_ok) > 10_000:  # names made up per record: keep it bounded
                self._topics_ok.clear()
            self._topics_ok.add(topic)
        if timestamp is not None and (type(timestamp) is not int or not 0 < timestamp < _TS_LIMIT):
            raise ConfigError(
                f"timestamp must be milliseconds since the epoch, >= 1 (librdkafka reads 0 as "
                f"'now'), got {timestamp!r}"
            )
        size = (0 if v is None else len(v)) + (0 if k is None else len(k))
        if size > self._max_bytes:
            self._rejects.refused("record_too_large")
            raise RecordTooLargeError(
                f"record of {size} bytes exceeds message_max_bytes={self._max_bytes}"
            )
        with self.lock:
            if self.closing:
                raise ProducerClosedError(_CLOSED)
            seq = self.seq_next
            if seq >= self.seq_limit:  # never while the pump keeps up (see _identity)
                seq = self._wait_for_seq()
            # Taken now: a wait below (ring or buffer full) releases the lock, so another
            # sender must not get the same seq. A refused record gives it back when no
            # one took a later one meanwhile (else it leaves a gap, never a reuse).
            self.seq_next = seq + 1
            try:
                if timestamp is None:
                    # Fixed now, so a record spooled and replayed keeps its creation time.
                    timestamp = time.time_ns() // 1_000_000
                rec: Rec = (topic, k, v, h, timestamp, seq)
                ring = self._ring
                # Others wait for room, or the ring is full: wait for a turn behind them,
                # in send order (or drop, or raise, per when_full).
                if (
                    self.waiters
                    or (ring is not None and not ring.put_fields(topic, k, v, h, timestamp, seq))
                ) and not self._accept_in_turn(rec, need_ring=True):
                    return
                if self.direct:
                    # InFlight.produce() inlined, headers as kafka_headers() makes them:
                    # this is the hot path (tests/unit/test_part_intake.py checks both
                    # hand librdkafka the same call).
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
                        self.sent += 1
                        return
                if (
                    len(self.backlog) < self._config.buffer_max_records and not self.spool_full
                ) or self._accept_in_turn(rec, need_ring=False):  # a full backlog or spool
                    self.backlog.append(rec)
                    self.sent += 1
            except BaseException as exc:
                # Only a refusal of ours (a LogSDKError, raised before the record reached
                # the client or the buffer) gives its seq back. Any other exception, such as
                # a signal handler's KeyboardInterrupt, surfaces when a call returns: maybe
                # right after produce() handed the record over, and a delivered record's seq
                # must never name another one (the dedupe would drop one of the two). Its
                # seq stays taken: a gap.
                if not isinstance(exc, LogSDKError):
                    if self._ring is not None:
                        # Its frame, if the put was done, is let go: a frame left open
                        # would stop the ring's tail for good (the ring fills, every send
                        # waits, then fails). send() raised, so the record was not accepted
                        # and the ring owes it nothing; if it reached the client its report
                        # settles the seq again, which is harmless (the seq is not reused).
                        self._ring.settle(seq)
                elif self.seq_next == seq + 1:
                    if self._ring is not None:
                        # A refused record's frame was settled by seq: flag it now, while
                        # the seq still names that frame and not the next record's (also
                        # when the pump's drain has already taken it from the list).
                        self._ring.drain_all()
                    self.seq_next = seq
                raise
        wake = self._wake
        if not wake.is_set():  # set() takes a lock each time; the pump clears before a step
            wake.set()

    def _wait_for_seq(self) -> int:
        """send() caught up with the reservation (the lock held): wait for the pump to
        reserve more, at most ``max_block_s``. Returns the seq to take."""
        self.seq_waits += 1
        max_block_s = self._config.max_block_s
        deadline = time.monotonic() + max_block_s
        while self.seq_next >= self.seq_limit:
            if self.closing:
                raise ProducerClosedError(_CLOSED)
            left = deadline - time.monotonic()
            if left <= 0:
                raise SpoolError(
                    f"no sequence number reserved on disk within max_block_s={max_block_s} "
                    f"(reserved up to {self.seq_limit}; spool alarm: {self._alarm() or 'none'})"
                )
            self._wake.set()
            self.space.wait(min(left, 0.05))
        return self.seq_next

    def _direct_refused(
        self, rec: Rec, exc: BufferError | KafkaException | ValueError | TypeError
    ) -> None:
        """send()'s produce raised (the lock held): queue the record behind the client
        (full, or broken: a degrade is asked for), or raise when librdkafka refuses the
        record itself."""
        if isinstance(exc, (ValueError, TypeError)):  # the client refused its fields
            self._refuse(rec, "record_rejected")
            raise SerializationError(f"librdkafka refused the record: {exc}") from exc
        if isinstance(exc, KafkaException):
            if _client.is_record_exception(exc):  # the record itself: not accepted
                self._refuse(rec, "record_rejected")
                raise RecordTooLargeError(f"librdkafka refused the record: {exc}") from exc
            self._counters.error("produce_error")
            self._degrade(f"produce failed: {exc}")
        self.direct = False  # full, or the client is broken: queue behind it

    def _refuse(self, rec: Rec, kind: str) -> None:
        """send() refuses ``rec`` (an error of ``kind``): counted, and its frame settled
        (it is not in custody); send() raises."""
        self._rejects.refused(kind)
        self._settle(rec)

    def _settle(self, rec: Rec) -> None:
        """``rec`` was refused or dropped here: its shm frame is free."""
        if self._ring is not None:
            self._ring.settle(rec[5])

    def _accept_in_turn(self, rec: Rec, need_ring: bool) -> bool:
        """send()'s slow path (the lock held): the ring, the backlog or the spool has no
        room, or other senders wait for room. ``need_ring``: ``rec`` is not in the shm ring
        yet (the ring was full, or others wait). Applies ``when_full``.

        True: ``rec`` is in the ring (if there is one), nobody waits before it, and there
        is room: the caller goes on as any sender (produces directly, or appends to the
        backlog). False: done here: appended to the backlog, or dropped (counted in
        ``sent`` and ``dropped``). Raises when the policy refuses it.

        ``drop_newest`` and ``raise`` never wait, nor does ``drop_oldest`` on a full
        backlog (it drops the oldest record); ``block``, and ``drop_oldest`` on a full
        ring, wait up to ``max_block_s`` while the pump makes room. A sender that waits
        takes its turn in seq order (``waiters``): every later sender queues behind it,
        and direct sends stay off while anyone waits, so records reach Kafka in send order
        (waiters appended in the order they woke up, a sender arriving meanwhile went
        ahead of them, and a waiter's record could stay in the backlog behind direct sends
        for good)."""
        cfg, ring = self._config, self._ring
        policy = cfg.when_full
        need_ring = need_ring and ring is not None
        if policy in ("drop_newest", "raise") or (policy == "drop_oldest" and not need_ring):
            return self._at_once(rec, need_ring)
        backlog, waiters, seq = self.backlog, self.waiters, rec[5]
        waiters.append(seq)  # in seq order: the seq was taken under the lock just now
        deadline = time.monotonic() + cfg.max_block_s
        go_on = True
        try:
            while True:
                if waiters[0] == seq:
                    if need_ring:
                        need_ring = not ring.put(rec)  # type: ignore[union-attr]
                        if need_ring:
                            self.shm_pressure = True
                    if not need_ring and (
                        policy == "drop_oldest"
                        or (len(backlog) < cfg.buffer_max_records and not self.spool_full)
                    ):
                        break
                if self.closing:
                    if need_ring:
                        raise ProducerClosedError(_CLOSED)
                    go_on = False  # in the ring (or none): accepted, close() spools it
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    reason = (
                        f"shm ring full (shm_bytes={ring.capacity})"  # type: ignore[union-attr]
                        if need_ring
                        else self._full_reason()
                    )
                    raise BufferFullError(f"{reason}; waited max_block_s={cfg.max_block_s}")
                self._wake.set()
                self.space.wait(min(left, 0.05))
        except BaseException:
            waiters.remove(seq)
            self.space.notify_all()  # the next in line may go
            if not need_ring:
                self._settle(rec)  # in the ring, and refused: not in custody
            raise
        waiters.remove(seq)  # the first (or, when closing, anywhere)
        self.space.notify_all()  # the next in line may go
        self._wake.set()
        if go_on and (len(backlog) < cfg.buffer_max_records and not self.spool_full):
            return True
        if len(backlog) >= cfg.buffer_max_records and policy == "drop_oldest":
            self._settle(backlog.popleft())
            self._counters.drop()
        backlog.append(rec)
        self.sent += 1
        return False

    def _at_once(self, rec: Rec, need_ring: bool) -> bool:
        """``when_full`` for a policy that does not wait (see `_accept_in_turn()`)."""
        cfg = self._config
        policy = cfg.when_full
        if need_ring:  # the ring is full (and nobody waits: these policies never do)
            self.shm_pressure = True
            self._wake.set()
            if policy == "raise":
                raise BufferFullError(f"shm ring full (shm_bytes={self._ring.capacity})")  # type: ignore[union-attr]
            self.sent += 1  # drop_newest: accepted, then dropped
            self._counters.drop()
            return False
        backlog = self.backlog
        memory_full = len(backlog) >= cfg.buffer_max_records
        if not memory_full and not self.spool_full:
            return True  # room after all: the caller appends
        if policy == "raise":
            self._settle(rec)  # refused: not in custody
            # The spool at its cap is SpoolFullError; memory full alone, its parent.
            raise (SpoolFullError if self.spool_full else BufferFullError)(self._full_reason())
        if policy == "drop_newest":
            self._settle(rec)
            self._counters.drop()
        else:  # drop_oldest: the spool's cap is applied when the backlog is committed
            if memory_full:
                self._settle(backlog.popleft())
                self._counters.drop()
            backlog.append(rec)
        self.sent += 1
        return False

    def _full_reason(self) -> str:
        if self.spool_full:
            return (
                f"Kafka is unavailable and the spool is full (spool_max_bytes="
                f"{self._config.spool_max_bytes})"
            )
        return f"memory buffer full (buffer_max_records={self._config.buffer_max_records})"

    # -- first use -----------------------------------------------------------------------

    def warmed(self) -> None:
        """The producer is ready for records (its first client made, if it could be): the
        next send() goes straight on. Called under the producer's first-use lock."""
        self.cold = False

    def forked(self) -> None:
        """A child just forked (one thread runs): every send() on this intake first asks
        for the child's own (``first_use``); nothing here is used again."""
        self.cold = True

    def go_direct(self, first: Callable[[], bool]) -> None:
        """The first client: ``first()`` installs it (the lock held, so no send() is
        between) and says whether it did; then direct sends go on if nothing is queued."""
        with self.lock:
            if first() and not self.backlog and not self.waiters:
                self.direct = True

    # -- the pump ------------------------------------------------------------------------

    def close_direct(self, then: Callable[[], None] | None = None) -> None:
        """Direct sends off: every new record goes to the backlog. ``then`` runs with the
        lock held (a state flip that must happen at once with it)."""
        with self.lock:
            self.direct = False
            if then is not None:
                then()

    def open_direct(self, then: Callable[[], None] | None = None) -> bool:
        """If the backlog is empty: direct sends on (once no sender waits for its turn: a
        later step turns them on), ``then`` run with the lock held, senders woken; True.
        False, changing nothing, while the backlog holds records."""
        with self.lock:
            if self.backlog:
                return False
            self.direct = not self.waiters
            if then is not None:
                then()
            self.space.notify_all()
            return True

    def queued(self) -> int:
        """Records in the backlog (any thread, without the lock: a size, read once)."""
        return len(self.backlog)

    def take(self, n: int) -> list[Rec]:
        """Take up to ``n`` records from the backlog's head, in send order, counted in
        ``taken`` until `put_back()` (the pump, which places them meanwhile without
        the lock: into the client's in-flight table, or the spool)."""
        with self.lock:
            backlog = self.backlog
            if n >= len(backlog):  # all of it (the usual case): copied in C, under the lock
                batch = list(backlog)
                backlog.clear()
            else:
                batch = [backlog.popleft() for _ in range(n)]
            self.taken = len(batch)
            return batch

    def put_back(self, rest: Sequence[Rec]) -> bool:
        """The records taken are placed, but for ``rest`` (the tail of what was taken, in
        order), which goes back to the backlog's head; senders waiting for room are woken.
        True if the backlog holds records."""
        with self.lock:
            if rest:
                self.backlog.extendleft(reversed(rest))
            self.taken = 0
            self.space.notify_all()
            return bool(self.backlog)

    def held(self) -> int:
        """Records here, not in librdkafka nor the spool: the backlog and what the pump took
        from it (the caller holds the lock, with what else it reads)."""
        return len(self.backlog) + self.taken

    def extend_seqs(self, limit: int) -> None:
        """Seqs below ``limit`` are reserved on disk now; senders waiting for one may go."""
        with self.lock:
            self.seq_limit = limit
            self.space.notify_all()

    def spool_has_room(self, room: bool) -> None:
        """The pump found the spool with room or without (block/raise wait for room)."""
        if self.spool_full == room:
            self.spool_full = not room
            if room:
                with self.lock:
                    self.space.notify_all()

    def relieve(self) -> int:
        """Senders wait for room in the shm ring: wake them (each raises the flag again if
        the ring is still full). Returns how many records the backlog holds."""
        self.shm_pressure = False
        with self.lock:
            self.space.notify_all()
            return len(self.backlog)

    def close(self) -> bool:
        """close() begins: send() refuses from now on, and senders waiting for room give
        up. True for the first call."""
        with self.lock:
            first = not self.closing
            self.closing = True
            self.space.notify_all()
            return first
