"""The records not yet in Kafka: the backlog, the spool commits, the overflow policy and
the disk alarm.

Invariants owned here:
- a record accepted by send() and not in librdkafka's hands is in exactly one of: the
  backlog (memory, in send order), ``_failed`` (handed back by a client), in transit to
  the spool (``_in_transit``: counted until committed), the spool (committed), or
  ``_rejects`` (refused by Kafka, on its way to the spool's ``rejected`` table); or it was
  dropped by ``when_full`` and counted in ``dropped``;
- records go to the spool in send order: failed ones first (sorted by seq), then the
  backlog's head; when the spool takes only part of a batch, the rest goes back where it
  came from and nothing newer is written before it;
- memory is bounded: the backlog holds at most ``buffer_max_records`` (``when_full`` says
  what happens beyond), and the spool at most ``spool_max_bytes``;
- a spool write that fails raises the disk alarm and keeps the records in memory; the
  same kind of operation succeeding clears it (retried once a second);
- with ``buffer="shm"``, a record's ring frame is settled exactly when it leaves custody
  (acknowledged, spooled, dropped or refused): ``_release``/``_release_seqs``.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable

from confluent_kafka import KafkaException

from logsdk.errors import BufferFullError, ProducerClosedError, SpoolError, SpoolFullError
from logsdk.producer._core import State
from logsdk.producer._inflight import _InFlight
from logsdk.producer._records import Rec, _row
from logsdk.spool._spool import Row, columns_bytes, encode_headers, row_size, transpose

log = logging.getLogger("logsdk.producer")

_SPOOL_BATCH = 5_000  # records per spool transaction


class _Custody(_InFlight):
    """Memory buffer, spool commits, overflow, disk alarm (a part of :class:`LogProducer`)."""

    def _init_custody(self) -> None:
        self._backlog = collections.deque()
        self._backlog_max = self.config.buffer_max_records
        self._failed = []
        self._in_transit = 0
        self._rejects = []
        self._n_spooled = 0
        self._spool_full = False
        self._shm_pressure = False
        self._alarm = None
        self._alarm_op = ""
        self._disk_retry_at = 0.0
        self._rebuilt_at = -60.0

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

    def _release(self, rec: Rec) -> None:
        """``rec`` left custody (acknowledged, spooled, dropped or refused): free its slot."""
        if self._shm is not None:
            self._shm.settle(rec[5])

    def _release_seqs(self, seqs: Iterable[int]) -> None:
        """The records with these seqs left custody: free their ring slots."""
        if self._shm is not None:
            for seq in seqs:
                self._shm.settle(seq)

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

    def _produce_backlog_rec(self, rec: Rec) -> bool:
        """Hand an already accepted record to the client; one Kafka refuses is set aside."""
        try:
            return self._produce_rec(rec)
        except (KafkaException, ValueError, TypeError) as exc:
            self._errors.add("rejected")
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
        self._pump_owner.check("commit records to the spool")
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

    def _disk_alarm(self, exc: SpoolError, op: str) -> None:
        """The spool failed ``op``; the same kind of operation succeeding clears it. A
        damaged database is set aside and the spool rebuilt from what can be read (at most
        once a minute), and ``op`` is then simply tried again."""
        if exc.corrupt and self._rebuild_spool(exc):
            return
        if self._alarm is None:
            log.error("spool unusable, records kept in memory until it recovers: %s", exc)
        self._alarm = str(exc)
        self._alarm_op = op
        self._errors.add("spool_io")
        self._disk_retry_at = time.monotonic() + 1.0

    def _rebuild_spool(self, exc: SpoolError) -> bool:
        """Pump thread: the spool's database is damaged. True when it was rebuilt."""
        now = time.monotonic()
        if now - self._rebuilt_at < 60.0:
            return False  # damaged again so soon: the disk itself fails; raise the alarm
        self._rebuilt_at = now
        self._errors.add("spool_rebuilt")
        try:
            self._spool.rebuild(str(exc))
        except SpoolError as again:
            log.error("spool damaged and could not be rebuilt: %s", again)
            return False
        # The rows keep their ids: the replay's cursor, rows in flight and acknowledged
        # ids stay valid; rows that could not be read are no longer there to delete.
        self._spool_full = False
        return True

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
