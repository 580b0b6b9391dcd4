"""The records not yet in Kafka: the backlog, the spool commits, the overflow policy.

Invariants owned here:
- a record accepted by send() and not in librdkafka's hands is in exactly one of: the
  backlog (memory, in send order: ``Gate.backlog``), ``failed`` (handed back by a client),
  in transit to the spool (``in_transit``: counted until committed) or to librdkafka
  (``feeding``: counted until in the in-flight table), the spool
  (committed), or ``rejects`` (refused by Kafka, on its way to the spool's ``rejected``
  table); or it was dropped by ``when_full`` and counted in ``dropped``;
- records go to the spool in send order: failed ones first (sorted by seq), then the
  backlog's head; when the spool takes only part of a batch, the rest goes back where it
  came from and nothing newer is written before it;
- the overflow policy never drops a spool row of a record a retired client may still
  deliver (``keep_through``): a broker may store such a request long after the client
  gave up on it, and the row's replay must reach Kafka before anything newer (the late
  original is then a duplicate, dropped by the reader; without the copy it would land
  after newer records, and a record counted as dropped would arrive);
- memory is bounded: the backlog holds at most ``buffer_max_records`` (``when_full`` says
  what happens beyond), and the spool at most ``spool_max_bytes``;
- a spool write that fails keeps the records in memory (:mod:`logsdk.producer._alarm`);
- with ``buffer="shm"``, a record's ring frame is settled exactly when it leaves custody
  (acknowledged, spooled, dropped or refused): :meth:`Custody.release`.

Owner: the pump thread (``owner``: the pump's), for ``failed``, ``rejects``, the spool
commits, ``keep_through`` and ``spooled``; the send path calls :meth:`accept_in_turn` and
:meth:`release` with the send lock held. ``spool_full`` and ``shm_pressure`` are published
flags: the pump writes ``spool_full``, send() raises ``shm_pressure`` and the pump lowers it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from logsdk._owner import Owner
from logsdk.errors import BufferFullError, ProducerClosedError, SpoolError, SpoolFullError
from logsdk.producer._alarm import DiskAlarm
from logsdk.producer._config import ProducerConfig
from logsdk.producer._gate import Gate
from logsdk.producer._records import Rec, _row
from logsdk.producer._tally import Tally
from logsdk.shm._ring import ShmRing
from logsdk.spool._codec import Row, columns_bytes, encode_headers, row_size, transpose
from logsdk.spool._spool import Spool

log = logging.getLogger("logsdk.producer")

_SPOOL_BATCH = 5_000  # records per spool transaction


class Custody:
    """Memory buffer, spool commits, overflow (see the module docstring)."""

    def __init__(
        self,
        config: ProducerConfig,
        gate: Gate,
        spool: Spool,
        ring: ShmRing | None,
        alarm: DiskAlarm,
        errors: Tally,
        counts: Tally,
        wake: threading.Event,
        owner: Owner,
    ) -> None:
        self._config = config
        self._gate = gate
        self._spool = spool
        self._ring = ring
        self._alarm = alarm
        self._errors = errors
        self._counts = counts
        self._wake = wake
        self._owner = owner
        self.backlog_max = config.buffer_max_records
        #: Handed back by a client, for the spool (pump).
        self.failed: list[Rec] = []
        #: ``failed`` holds a record its client may have sent (see ``keep_through``).
        self._failed_may_arrive = False
        #: Spool rows up to this id hold records that a retired client was given and never
        #: confirmed: a broker may still store them. The overflow policy does not drop
        #: them; they leave the spool when their replay is acknowledged (pump).
        self.keep_through = 0
        #: Records between memory and the spool (a commit under way), counted until
        #: committed. Published.
        self.in_transit = 0
        #: Records the pump took from the backlog's head to hand to librdkafka, counted
        #: until they are in the in-flight table (``Pump._feed_backlog``). Published.
        self.feeding = 0
        #: Refused by Kafka, for the rejected table (pump).
        self.rejects: list[tuple[Row, str]] = []
        self.spooled = 0  # records committed to the spool
        #: The spool has no room (block/raise wait for it). Published.
        self.spool_full = False
        #: A sender waits for room in the shm ring. Published.
        self.shm_pressure = False

    # -- the send path (caller holds the send lock) ------------------------------------

    def accept_in_turn(self, rec: Rec, need_ring: bool) -> bool:
        """send()'s slow path (the send lock held): the ring, the backlog or the spool has
        no room, or other senders wait for room. ``need_ring``: ``rec`` is not in the shm
        ring yet (the ring was full, or others wait). Applies ``when_full``.

        True: ``rec`` is in the ring (if there is one), nobody waits before it, and there
        is room: the caller goes on as any sender (produces directly, or appends to the
        backlog). False: done here: appended to the backlog, or dropped (counted in
        ``sent`` and ``dropped``). Raises when the policy refuses it.

        ``drop_newest`` and ``raise`` never wait, nor does ``drop_oldest`` on a full
        backlog (it drops the oldest record); ``block``, and ``drop_oldest`` on a full
        ring, wait up to ``max_block_s`` while the pump makes room. A sender that waits
        takes its turn in seq order (``Gate.waiters``): every later sender queues behind
        it, and the pump does not turn on direct sends while anyone waits, so records
        reach Kafka in send order (waiters appended in the order they woke up, a sender
        arriving meanwhile went ahead of them, and a waiter's record could stay in the
        backlog behind direct sends for good)."""
        cfg, gate, ring = self._config, self._gate, self._ring
        policy = cfg.when_full
        need_ring = need_ring and ring is not None
        if policy in ("drop_newest", "raise") or (policy == "drop_oldest" and not need_ring):
            return self._at_once(rec, need_ring)
        backlog, waiters, seq = gate.backlog, gate.waiters, rec[5]
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
                if gate.closing:
                    if need_ring:
                        raise ProducerClosedError(
                            "the producer is closed; it accepts no more records"
                        )
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
                gate.space.wait(min(left, 0.05))
        except BaseException:
            waiters.remove(seq)
            gate.space.notify_all()  # the next in line may go
            if not need_ring:
                self.release(rec)  # in the ring, and refused: not in custody
            raise
        waiters.remove(seq)  # the first (or, when closing, anywhere)
        gate.space.notify_all()  # the next in line may go
        self._wake.set()
        if go_on and (len(backlog) < cfg.buffer_max_records and not self.spool_full):
            return True
        if len(backlog) >= cfg.buffer_max_records and policy == "drop_oldest":
            self.release(backlog.popleft())
            self._counts.add("dropped")
        backlog.append(rec)
        gate.sent += 1
        return False

    def _at_once(self, rec: Rec, need_ring: bool) -> bool:
        """``when_full`` for a policy that does not wait (see :meth:`accept_in_turn`)."""
        cfg, gate = self._config, self._gate
        policy = cfg.when_full
        if need_ring:  # the ring is full (and nobody waits: these policies never do)
            self.shm_pressure = True
            self._wake.set()
            if policy == "raise":
                raise BufferFullError(f"shm ring full (shm_bytes={self._ring.capacity})")  # type: ignore[union-attr]
            gate.sent += 1  # drop_newest: accepted, then dropped
            self._counts.add("dropped")
            return False
        backlog = gate.backlog
        memory_full = len(backlog) >= cfg.buffer_max_records
        if not memory_full and not self.spool_full:
            return True  # room after all: the caller appends
        if policy == "raise":
            self.release(rec)  # refused: not in custody
            # The spool at its cap is SpoolFullError; memory full alone, its parent.
            raise (SpoolFullError if self.spool_full else BufferFullError)(self._full_reason())
        if policy == "drop_newest":
            self.release(rec)
            self._counts.add("dropped")
        else:  # drop_oldest: the spool's cap is applied when the backlog is committed
            if memory_full:
                self.release(backlog.popleft())
                self._counts.add("dropped")
            backlog.append(rec)
        gate.sent += 1
        return False

    def _full_reason(self) -> str:
        if self.spool_full:
            return (
                f"Kafka is unavailable and the spool is full (spool_max_bytes="
                f"{self._config.spool_max_bytes})"
            )
        return f"memory buffer full (buffer_max_records={self._config.buffer_max_records})"

    def release(self, rec: Rec) -> None:
        """``rec`` left custody (acknowledged, spooled, dropped or refused): free its slot."""
        if self._ring is not None:
            self._ring.settle(rec[5])

    def _release_seqs(self, seqs: Iterable[int]) -> None:
        """The records with these seqs left custody: free their ring slots."""
        if self._ring is not None:
            for seq in seqs:
                self._ring.settle(seq)

    # -- the pump ------------------------------------------------------------------------

    def take_back(self, rec: Rec, may_arrive: bool = False) -> None:
        """A client handed ``rec`` back: it goes to the spool, and is resent from there.
        ``may_arrive``: the client may have sent it (purged in flight, timed out), so a
        broker may still store it: its row is kept until replayed (``keep_through``)."""
        self.failed.append(rec)
        if may_arrive:
            self._failed_may_arrive = True

    def keep_rows(self, through: int) -> None:
        """Spool rows up to ``through`` were handed to a client retired without confirming
        them all (the replay's, at a degrade): kept as ``keep_through`` says."""
        self.keep_through = max(self.keep_through, through)

    def reject(self, rec: Rec, why: str) -> None:
        """Kafka refused ``rec``: set aside in the spool's rejected table (next settle)."""
        self.rejects.append((_row(rec), why))

    def settle_rejects(self) -> bool:
        """Write the refused records to the rejected table. True if it wrote. Left in
        ``rejects`` until committed (flush() counts them): on an error they stay there and
        are retried. Raises SpoolError."""
        if not self.rejects:
            return False
        rejects = self.rejects[:]
        self._spool.reject(rejects)
        del self.rejects[: len(rejects)]
        self._release_seqs([r[5] for r, _ in rejects])
        return True

    def relieved(self) -> None:
        """The pump woke the senders waiting for ring room (they raise it again if not)."""
        self.shm_pressure = False

    def room_changed(self) -> None:
        """The spool was rebuilt: its room is as its gauges say, no longer full."""
        self.spool_full = False

    def check_room(self) -> None:
        """Rows left the spool: if it was full and has room now, wake the senders."""
        if self.spool_full and (self._spool.room() or 0) > 0:
            self.spool_full = False
            with self._gate.lock:
                self._gate.space.notify_all()

    def spool_pending(self, cursor: int, limit: int | None = None) -> bool:
        """Commit failed records, then the backlog's head, to the spool. True if more left.
        ``cursor``: the replay's (rows up to it may be in flight: never dropped, nor those
        up to ``keep_through``)."""
        self._owner.check("commit records to the spool")
        if not self._alarm.ready():
            return False
        gate = self._gate
        if self.failed:
            self.failed.sort(key=lambda r: r[5])  # send order, whatever the partition
            with gate.lock:
                batch, self.failed = self.failed, []
                self.in_transit = len(batch)
            try:
                ok = self._commit(batch, cursor, from_backlog=False)
            except BaseException:  # a bug: keep the records, let the pump report it
                ok = False
                raise
            finally:
                if not ok:
                    self.failed = batch + self.failed
                self.in_transit = 0
            if ok and self._failed_may_arrive:
                self.keep_through = self._spool.top_id
            if not self.failed:
                self._failed_may_arrive = False
            if not ok or self.failed:
                # Not written, or the spool took only part of them: nothing newer may go
                # in before the rest (a smaller backlog record could fit the room left).
                return False
        with gate.lock:
            backlog = gate.backlog
            n = min(len(backlog), _SPOOL_BATCH if limit is None else limit)
            if n == len(backlog):  # all of it (the usual case): copied in C, under the lock
                batch = list(backlog)
                backlog.clear()
            else:
                batch = [backlog.popleft() for _ in range(n)]
            # Counted until committed, so flush() never sees them as settled too early.
            self.in_transit = n
        if not batch:
            return False
        try:
            ok = self._commit(batch, cursor, from_backlog=True)
        except BaseException:
            ok = False
            raise
        finally:
            if not ok:
                with gate.lock:
                    gate.backlog.extendleft(reversed(batch))
            self.in_transit = 0
        if not ok:
            return False
        with gate.lock:
            gate.space.notify_all()
            return bool(gate.backlog)

    def _commit(self, recs: list[Rec], cursor: int, from_backlog: bool) -> bool:
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
                policy = self._config.when_full
                if policy == "drop_oldest":
                    try:
                        # Rows already handed to Kafka, for replay (up to the cursor) or by a
                        # retired client (``keep_through``), are not dropped: they may
                        # arrive, and a record counted as dropped must not.
                        keep = max(cursor, self.keep_through)
                        dropped = self._spool.drop_oldest(need - room, keep)
                    except SpoolError as exc:
                        self._alarm.failed(exc, "write")
                        return False
                    if dropped:
                        self._counts.add("dropped", dropped)
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
                        self._counts.add("dropped", n - fit)
                        log.warning("spool full: dropped %d newest record(s)", n - fit)
                    else:
                        # block / raise: keep the rest in memory; send() applies the policy.
                        self.spool_full = True
                        if fit == 0:
                            return False
                        rest = recs[fit:]
                    cols, total = transpose(rows[:fit]), used
                else:
                    self.spool_full = False
            else:
                self.spool_full = False
        try:
            self._spool.append_columns(cols, total)
        except SpoolError as exc:
            self._alarm.failed(exc, "write")
            return False
        self.spooled += len(cols[5])
        self._release_seqs(cols[5])
        if rest:
            if from_backlog:
                with self._gate.lock:
                    self._gate.backlog.extendleft(reversed(rest))
            else:
                self.failed = rest + self.failed
        self._alarm.ok("write")
        return True

    def held(self) -> int:
        """Records in custody's memory: neither in librdkafka, nor committed to the spool,
        nor dropped, nor refused by Kafka (``rejects``: see :meth:`unsettled`). The caller
        holds the send lock (a batch moves between the backlog, ``in_transit`` and the
        client under it)."""
        return len(self._gate.backlog) + self.in_transit + self.feeding + len(self.failed)

    def unsettled(self) -> int:
        """:meth:`held`, and Kafka's refusals waiting in ``rejects`` until the rejected
        table holds them (the caller holds the send lock)."""
        return self.held() + len(self.rejects)
