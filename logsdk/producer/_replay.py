"""Replay: the spool sent back to Kafka after an outage, paced, oldest row first.

Invariants owned here:
- rows are handed to the client in id order (send order), from ``_replay_cursor``; a
  row is deleted from the spool only after Kafka acknowledged it;
- while RECOVERING, acknowledged rows are deleted by watermark: every row up to the one
  before the oldest still in flight (or set aside) was acknowledged, unless a replay
  failed since the cursor was reset (``_replay_failed``), when they are deleted by id;
- a replay that fails (or is unconfirmed) leaves its row in the spool, to be read again
  after the next degrade resets the cursor: a duplicate at worst, never a loss;
- a row Kafka refuses is moved to the spool's ``rejected`` table, and the replay goes on;
- the pace: at most ``replay_max_rate`` records a second, bursts of at most
  ``replay_batch``, and at most ``2 * replay_batch`` rows in flight.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, ClassVar

from confluent_kafka import KafkaError, KafkaException, Message

from logsdk.errors import SpoolError
from logsdk.producer import _client
from logsdk.producer._core import State
from logsdk.producer._custody import _Custody
from logsdk.producer._records import HEADER_SEQ, KHeaders, _seq_of
from logsdk.spool._spool import decode_headers

if TYPE_CHECKING:
    from logsdk.producer._producer import LogProducer

log = logging.getLogger("logsdk.producer")


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


class _Pace:
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


class _Replay(_Custody):
    """Spool -> Kafka after an outage (a part of :class:`LogProducer`)."""

    def _init_replay(self) -> None:
        self._replay_ack = type("_ReplayAck", (_ReplayAck,), {"__slots__": (), "_producer": self})
        self._replay_cursor = 0
        self._replay_inflight = {}
        self._acked_ids = []
        self._acked_kept = 0
        self._acked_seen = 0
        self._replay_failed = False
        self._reject_ids = []
        self._pace = _Pace(self.config.replay_max_rate, self.config.replay_batch)
        self._n_replayed = 0

    def _restart_replay(self) -> None:
        """Read the spool again from its first row (after a degrade, or to begin a
        recovery): unacknowledged replays are still in it."""
        self._replay_cursor = 0
        self._replay_failed = False

    def _replay_some(self) -> bool:
        self._pump_owner.check("replay the spool")
        cfg = self.config
        window = cfg.replay_batch * 2
        room = window - len(self._replay_inflight)
        if room <= 0 or self._client is None:
            return False
        room = self._pace.allow(room)
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
                self._errors.add("produce_error")
                self._request_degrade(f"replay produce failed: {exc}")
                break
            inflight[rid] = None
            cursor = rid
            sent += 1
        self._replay_cursor = cursor
        self._pace.spent(sent)
        return sent > 0

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
        if _client.possibly_persisted(err, self._answered):
            self._n_possible_dups += 1
        self._errors.add(err.name())
        self._request_degrade(f"replay delivery failed: {err.str()}")

    def _reject_replayed(self, rid: int, seq: object, why: str) -> None:
        """Kafka refused spool row ``rid`` (on produce or on delivery): count it, say so,
        and have the pump move it to the rejected table."""
        with self._lock:
            self._n_rejected += 1
        self._errors.add("rejected")
        log.error("record seq=%s rejected by Kafka (%s); set aside", seq, why)
        self._reject_ids.append((rid, why))

    def _settle_spool(self) -> None:
        """Delete acknowledged replays and set rejected ones aside; after a disk error,
        retried once a second (``_disk_retry_at``); their success clears an alarm they raised."""
        self._pump_owner.check("settle the spool")
        n = len(self._acked_ids)
        if n > self._acked_seen:
            # Replays acknowledged since the last step: the stall detector sees progress
            # (their rows are deleted once per replay batch, which may take longer).
            self._acked_seen = n
            self._last_ack = time.monotonic()
            self._answered = True
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
