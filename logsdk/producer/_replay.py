"""Replay: the spool sent back to Kafka after an outage, paced, oldest row first.

Invariants owned here:
- rows are handed to the client in id order (send order), from ``cursor``; a row is
  deleted from the spool only after Kafka acknowledged it;
- while RECOVERING, acknowledged rows are deleted by watermark: every row up to the one
  before the oldest still in flight (or set aside) was acknowledged, unless a replay
  failed since the cursor was reset (``_failed``), when they are deleted by id;
- a replay that fails (or is unconfirmed) leaves its row in the spool, to be read again
  after the next degrade resets the cursor: a duplicate at worst, never a loss;
- a row Kafka refuses is moved to the spool's ``rejected`` table (``Rejects``), and the
  replay goes on;
- the pace: at most ``replay_max_rate`` records a second, bursts of at most
  ``replay_batch``, and at most ``2 * replay_batch`` rows in flight.

Owner: the pump thread (``owner``: the pump's; the replay's delivery reports run inside
its polls, and the tickets, ``rows`` and ``free``, are its alone). ``inflight``,
``acked_ids`` and ``replayed`` are published (the health thread and stats() read their
size).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import ClassVar

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from logsdk._owner import Owner
from logsdk.errors import SpoolError
from logsdk.producer import _client
from logsdk.producer._alarm import DiskAlarm
from logsdk.producer._config import ProducerConfig
from logsdk.producer._counters import Counters
from logsdk.producer._inflight import InFlight
from logsdk.producer._records import _seq_of, kafka_headers
from logsdk.producer._rejects import Rejects, SpooledRow
from logsdk.spool._codec import decode_headers
from logsdk.spool._spool import Spool

log = logging.getLogger("logsdk.producer")


class _ReplayAck(int):
    """A slot of the replay's in-flight table, and the delivery callback of the spool row
    it holds (``Replayer.rows[ticket]``: the row's id).

    librdkafka holds the callback of every record in flight and drops a purged record's
    headers, so the callback itself must name the row. Tickets are reused once their
    report is served (as the fresh records' ``_Ticket``): a replay in steady state makes
    no new object the garbage collector tracks. One object per replayed row, kept until
    its batch was deleted, made every replay of tens of thousands of rows a stream of
    survivors, and a full collection (20-50 ms holding the GIL) every second or so.
    Each replayer has its own subclass.
    """

    __slots__ = ()
    _replay: ClassVar[Replayer]

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        r = self._replay
        rows = r.rows
        rid = rows[self]
        rows[self] = 0
        r.free.append(self)  # the report is served: the ticket may carry another row
        if err is None and not r._flight.dupseq and msg.offset() is not None:
            r.inflight.pop(rid, None)
            r.acked_ids.append(rid)
            return
        r.on_delivery(rid, err, msg)


class Pace:
    """A token bucket: at most ``rate`` records a second (None: no limit), bursts of at
    most ``burst``; it starts empty."""

    __slots__ = ("burst", "rate", "refill", "tokens")

    def __init__(self, rate: float | None, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.reset()

    def reset(self) -> None:
        self.tokens = 0.0
        self.refill = time.monotonic()

    def allow(self, room: int) -> int:
        """How many of ``room`` records may go now."""
        if self.rate is None:
            return room
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.refill) * self.rate)
        self.refill = now
        return min(room, int(self.tokens))

    def spent(self, n: int) -> None:
        """``n`` records went."""
        if self.rate is not None:
            self.tokens -= n


class Replayer:
    """Spool -> Kafka after an outage (see the module docstring)."""

    def __init__(
        self,
        config: ProducerConfig,
        spool: Spool,
        flight: InFlight,
        alarm: DiskAlarm,
        rejects: Rejects,
        counters: Counters,
        degrade: Callable[[str], None],
        owner: Owner,
    ) -> None:
        self._config = config
        self._spool = spool
        self._flight = flight
        self._alarm = alarm
        self._rejects = rejects
        self._counters = counters
        self._degrade = degrade
        self._pid_header = flight.pid_header
        self._owner = owner
        self.ack: type[_ReplayAck] = type(
            "_ReplayAck", (_ReplayAck,), {"__slots__": (), "_replay": self}
        )
        #: The spool row id each ticket carries (0: none), and the tickets not in use.
        self.rows: list[int] = []
        self.free: list[_ReplayAck] = []
        #: The id of the last row handed to the client.
        self.cursor = 0
        #: Spool row ids handed to the client and not yet reported, in id order (a dict:
        #: ordered, so its first key is the oldest one outstanding). Published (its size).
        self.inflight: dict[int, None] = {}
        #: Acknowledged replays not yet deleted. Published (its size).
        self.acked_ids: list[int] = []
        self._acked_kept = 0  # of those, how many a watermark delete had to keep
        self._acked_seen = 0  # len(acked_ids) at the last settle: more since is progress
        self._failed = False  # a replay was reported failed since the cursor reset
        self.pace = Pace(config.replay_max_rate, config.replay_batch)
        #: Replays acknowledged and deleted from the spool. Published.
        self.replayed = 0

    def restart(self) -> None:
        """Read the spool again from its first row (after a degrade, or to begin a
        recovery): unacknowledged replays are still in it."""
        self.cursor = 0
        self._failed = False

    def forget_inflight(self) -> None:
        """The client was retired: what it held of the replay is not in flight any more."""
        self.inflight.clear()

    def busy(self) -> bool:
        """Rows in flight, acknowledged and not deleted, or refused and not set aside."""
        return bool(self.inflight or self.acked_ids or self._rejects.rows_waiting())

    def replay_some(self, client: Producer) -> bool:
        """Hand the next rows to ``client``, within the pace. True if it handed some."""
        self._owner.check("replay the spool")
        cfg = self._config
        window = cfg.replay_batch * 2
        room = window - len(self.inflight)
        if room <= 0:
            return False
        room = self.pace.allow(room)
        if room <= 0:
            return False
        try:
            rows = self._spool.read_replay(self.cursor, min(room, cfg.replay_batch))
        except SpoolError as exc:
            self._alarm.failed(exc, "read")
            return False
        self._alarm.ok("read")
        if not rows and not self.busy():
            # Nothing left to read, in flight or to delete, yet the gauges say rows remain:
            # they are off (a bug). Counted again from the table, so the replay can end.
            self._spool.recount_if_off()
            return False
        produce = client.produce
        inflight = self.inflight
        rows_of, free = self.rows, self.free
        pid_header = self._pid_header
        cursor = self.cursor
        sent = 0
        for rid, topic, key, value, hblob, ts, seq in rows:
            # seq: the header's bytes, as the spool keeps them
            hdrs = kafka_headers(pid_header, seq, None if hblob is None else decode_headers(hblob))
            ticket = free.pop() if free else self._new_ticket()
            rows_of[ticket] = rid
            try:
                produce(topic, value, key, -1, ticket, None, ts or 0, hdrs)
            except BufferError:
                self._give_back(ticket)
                break
            except (ValueError, TypeError) as exc:
                self._give_back(ticket)
                # Fields the client cannot take (a row written before send() checked them,
                # or by another program): set aside, and the cursor moves past it.
                self._rejects.reject(SpooledRow(rid, seq.decode()), f"{type(exc).__name__}: {exc}")
                cursor = rid
                continue
            except KafkaException as exc:
                self._give_back(ticket)
                if _client.is_record_exception(exc):
                    self._rejects.reject(SpooledRow(rid, seq.decode()), str(exc))
                    cursor = rid
                    continue
                self._counters.error("produce_error")
                self._degrade(f"replay produce failed: {exc}")
                break
            inflight[rid] = None
            cursor = rid
            sent += 1
        self.cursor = cursor
        self.pace.spent(sent)
        return sent > 0

    def _new_ticket(self) -> _ReplayAck:
        """A ticket for one more row in flight (none free: the table grows by one)."""
        ticket = self.ack(len(self.rows))
        self.rows.append(0)
        return ticket

    def _give_back(self, ticket: _ReplayAck) -> None:
        """produce() refused the row under ``ticket``: librdkafka holds neither, so no
        report will free it. (Any other exception keeps the ticket taken: had the record
        gone in, its report comes; a leak, never a reuse under a live row.)"""
        self.rows[ticket] = 0
        self.free.append(ticket)

    def on_delivery(self, rid: int, err: KafkaError | None, msg: Message) -> None:
        """A replayed row's report, other than a plain acknowledgement (pump thread)."""
        flight = self._flight
        if err is None and not flight.is_unconfirmed(msg):
            self.inflight.pop(rid, None)
            self.acked_ids.append(rid)
            return
        self.inflight.pop(rid, None)
        # Neither in flight nor acknowledged: the watermark delete must not pass this row
        # (rows up to the cursor are deleted by id until the cursor is reset).
        self._failed = True
        if err is None:  # unconfirmed (see _inflight._UNCONFIRMED): the row stays, resent
            flight.unconfirmed_seen()
            return
        if _client.is_record_error(err):
            self._rejects.reject(SpooledRow(rid, _seq_of(msg)), err.str())
            return
        if _client.possibly_persisted(err, flight.answered):
            flight.count_possible_dup()
        self._counters.error(err.name())
        self._degrade(f"replay delivery failed: {err.str()}")

    def progressed(self) -> bool:
        """Replays were acknowledged since the last call (the stall detector's progress:
        their rows are deleted once per replay batch, which may take longer)."""
        n = len(self.acked_ids)
        if n > self._acked_seen:
            self._acked_seen = n
            return True
        return False

    def settle(self, recovering: bool, client_up: bool) -> bool:
        """Move refused rows to the rejected table and delete acknowledged ones (pump).
        ``recovering``/``client_up``: the state, and whether a client is there (the
        watermark delete is for a replay under way). True if it wrote. Raises SpoolError."""
        self._owner.check("settle the spool")
        wrote = self._rejects.set_aside_rows()
        if self.acked_ids and (
            len(self.acked_ids) - self._acked_kept >= self._config.replay_batch
            or not self.inflight
            or not recovering
        ):
            # One DELETE transaction per replay batch, not per pump step: a page of rows
            # is then rewritten once, not once per step that freed some.
            self._delete_acked(recovering and client_up)
            wrote = True
        return wrote

    def _delete_acked(self, by_watermark: bool) -> None:
        """Delete the acknowledged replays from the spool.

        While replaying, by watermark: every row up to the one before the oldest still in
        flight was handed to Kafka in id order and acknowledged (a failed one sets
        ``_failed``, a rejected one waits in ``Rejects``), so one range DELETE removes
        them; acknowledged ids above it wait for a later batch (a crash resends them:
        duplicates, never a loss). Otherwise (degraded, closing, a replay failed), by id:
        exactly the acknowledged rows.
        """
        ids, self.acked_ids = self.acked_ids, []
        self._acked_kept = 0
        keep: list[int] = []
        try:
            if by_watermark and not self._failed:
                mark = self.cursor
                if self.inflight:
                    mark = min(mark, next(iter(self.inflight)) - 1)
                lowest = self._rejects.lowest_row()
                if lowest is not None:
                    mark = min(mark, lowest - 1)
                keep = [i for i in ids if i > mark]
                gone = self._spool.delete_through(mark)
            else:
                gone = self._spool.delete(ids)
        except SpoolError:
            self.acked_ids = ids + self.acked_ids  # still in the spool: delete them later
            self._acked_kept = self._acked_seen = len(self.acked_ids)
            raise
        self.acked_ids = keep + self.acked_ids
        self._acked_kept = len(keep)
        self._acked_seen = len(self.acked_ids)
        # The rows that left the spool: a late acknowledgement (a retired client's) of a
        # row when_full="drop_oldest" has dropped meanwhile counted it dropped already.
        self.replayed += gone

    def forget(self) -> None:
        """After the threads stopped: the ack class names this replayer (a cycle); let go."""
        cls = self.ack
        if vars(cls).get("_replay") is self:
            delattr(cls, "_replay")
