"""The records handed back by a client, and the spool commits: what is not yet in Kafka.

Invariants owned here:
- a record accepted by send() and not in librdkafka's hands is in exactly one of: the
  intake (its backlog, or taken from it by the pump: ``Intake.held``), ``failed`` (handed
  back by a client), in transit to the spool (``in_transit``: counted until committed),
  the spool (committed), or ``Rejects`` (refused by Kafka, on its way to the spool's
  ``rejected`` table); or it was dropped by ``when_full`` and counted in ``dropped``;
- records go to the spool in send order: failed ones first (sorted by seq), then the
  backlog's head; when the spool takes only part of a batch, the rest goes back where it
  came from and nothing newer is written before it;
- the overflow policy never drops a spool row of a record a retired client may still
  deliver (``keep_through``): a broker may store such a request long after the client
  gave up on it, and the row's replay must reach Kafka before anything newer (the late
  original is then a duplicate, dropped by the reader; without the copy it would land
  after newer records, and a record counted as dropped would arrive);
- the spool holds at most ``spool_max_bytes``: ``when_full`` says what happens beyond
  (the intake is told whether the spool has room: block and raise wait for it);
- a spool write that fails keeps the records in memory (`logsdk.producer._alarm`);
- with ``buffer="shm"``, a record's ring frame is settled exactly when it leaves custody
  (spooled or dropped here).

Owner: the pump thread (``owner``: the pump's), for ``failed``, the spool commits,
``keep_through`` and ``spooled``; ``in_transit`` is published (flush() and stats() read it
under the send lock, which the pump holds as a batch leaves ``failed``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from logsdk._owner import Owner
from logsdk.errors import SpoolError
from logsdk.producer._alarm import DiskAlarm
from logsdk.producer._config import ProducerConfig
from logsdk.producer._counters import Counters
from logsdk.producer._intake import Intake
from logsdk.producer._records import Rec
from logsdk.shm._ring import ShmRing
from logsdk.spool._codec import Row, columns_bytes, encode_headers, row_size, transpose
from logsdk.spool._spool import Spool

log = logging.getLogger("logsdk.producer")

_SPOOL_BATCH = 5_000  # records per spool transaction


class Custody:
    """Failed records and the spool commits (see the module docstring)."""

    def __init__(
        self,
        config: ProducerConfig,
        intake: Intake,
        spool: Spool,
        ring: ShmRing | None,
        alarm: DiskAlarm,
        counters: Counters,
        owner: Owner,
    ) -> None:
        self._config = config
        self._intake = intake
        self._spool = spool
        self._ring = ring
        self._alarm = alarm
        self._counters = counters
        self._owner = owner
        #: Handed back by a client, for the spool (pump).
        self.failed: list[Rec] = []
        #: ``failed`` holds a record its client may have sent (see ``keep_through``).
        self._failed_may_arrive = False
        #: Spool rows up to this id hold records that a retired client was given and never
        #: confirmed: a broker may still store them. The overflow policy does not drop
        #: them; they leave the spool when their replay is acknowledged (pump).
        self.keep_through = 0
        #: Failed records between memory and the spool (a commit under way), counted until
        #: committed. Published.
        self.in_transit = 0
        self.spooled = 0  # records committed to the spool

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

    def room_changed(self) -> None:
        """The spool was rebuilt: its room is as its gauges say, no longer full."""
        self._intake.spool_has_room(True)

    def check_room(self) -> None:
        """Rows left the spool: if it was full and has room now, wake the senders."""
        if self._intake.spool_full and (self._spool.room() or 0) > 0:
            self._intake.spool_has_room(True)

    def spool_pending(self, cursor: int, limit: int | None = None) -> bool:
        """Commit failed records, then the backlog's head, to the spool. True if more left.
        ``cursor``: the replay's (rows up to it may be in flight: never dropped, nor those
        up to ``keep_through``)."""
        self._owner.check("commit records to the spool")
        if not self._alarm.ready():
            return False
        intake = self._intake
        if self.failed:
            self.failed.sort(key=lambda r: r[5])  # send order, whatever the partition
            # Under the send lock: flush() reads what is held under it, and must see the
            # batch in ``failed`` or in transit, never in neither.
            with intake.lock:
                batch, self.failed = self.failed, []
                self.in_transit = len(batch)
            rest: list[Rec] = []
            try:
                ok, rest = self._commit(batch, cursor)
            except BaseException:  # a bug: keep the records, let the pump report it
                ok = False
                raise
            finally:
                if not ok:
                    self.failed = batch + self.failed
                elif rest:
                    self.failed = rest + self.failed
                self.in_transit = 0
            if ok and self._failed_may_arrive:
                self.keep_through = self._spool.top_id
            if not self.failed:
                self._failed_may_arrive = False
            if not ok or self.failed:
                # Not written, or the spool took only part of them: nothing newer may go
                # in before the rest (a smaller backlog record could fit the room left).
                return False
        # Counted by the intake until put back, so flush() never sees them settled early.
        batch = intake.take(_SPOOL_BATCH if limit is None else limit)
        if not batch:
            return False
        ok, rest = False, []
        try:
            ok, rest = self._commit(batch, cursor)
        finally:
            # Not written: all of it back; else the tail the spool had no room for.
            more = intake.put_back(rest if ok else batch)
        return ok and more

    def _commit(self, recs: list[Rec], cursor: int) -> tuple[bool, list[Rec]]:
        """Write records to the spool under the cap policy: (False, []) not written, keep
        them; (True, rest) written, except ``rest``, a tail the full spool had no room for
        (``block``/``raise``), which goes back where ``recs`` came from."""
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
                        return False, []
                    if dropped:
                        self._counters.drop(dropped)
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
                        self._counters.drop(n - fit)
                        log.warning("spool full: dropped %d newest record(s)", n - fit)
                    else:
                        # block / raise: keep the rest in memory; send() applies the policy.
                        self._intake.spool_has_room(False)
                        if fit == 0:
                            return False, []
                        rest = recs[fit:]
                    cols, total = transpose(rows[:fit]), used
                else:
                    self._intake.spool_has_room(True)
            else:
                self._intake.spool_has_room(True)
        try:
            self._spool.append_columns(cols, total)
        except SpoolError as exc:
            self._alarm.failed(exc, "write")
            return False, []
        self.spooled += len(cols[5])
        self._release_seqs(cols[5])
        self._alarm.ok("write")
        return True, rest

    def held(self) -> int:
        """Records in custody's memory: ``failed`` and those on their way from it to the
        spool. The caller holds the send lock (a batch leaves ``failed`` under it)."""
        return self.in_transit + len(self.failed)
