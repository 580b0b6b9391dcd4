"""Records refused as bad data: what a rejection does, in one place.

A record Kafka (or librdkafka) refuses for itself (too large, invalid, a topic it may not
write to) can never be delivered: resending it would fail again and hold up the records
behind it. Whoever finds one (a delivery report, the backlog's feed, the replay) calls
`Rejects.reject()`, which counts it (``rejected``, and the error ``rejected``), says so
(one log line) and sets it aside: a fresh record goes to the spool's ``rejected`` table, a
spooled one (a replay's row) is moved there, at the pump's next settle. A record that
send() refuses before accepting it is only counted (`Rejects.refused()`): send()
raises, and the record never was in custody.

Invariants owned here:
- a rejected record is counted once, however many times writing it aside is retried;
- a fresh record waits in ``records`` until the rejected table holds it (flush() counts
  it as not settled meanwhile: `pending()`), then its shm frame is settled;
- a spooled row waits in ``rows`` until moved; the replay's watermark delete never passes
  the lowest of them (`lowest_row()`).

Owner: the pump thread (delivery reports, the backlog's feed and the replay all run
there; close() once it has ended), for what waits to be set aside; `refused()` is the
send path's (any thread: it only counts).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from logsdk.errors import SpoolError
from logsdk.producer._counters import Counters
from logsdk.producer._records import Rec, _row
from logsdk.shm._ring import ShmRing
from logsdk.spool._codec import Row
from logsdk.spool._spool import Spool

log = logging.getLogger("logsdk.producer")


class SpooledRow(NamedTuple):
    """A record Kafka refused on its replay: its spool row, and its seq as the header says."""

    rid: int
    seq: object


class Rejects:
    """Counts, says and sets aside refused records (see the module docstring)."""

    def __init__(self, spool: Spool, ring: ShmRing | None, counters: Counters) -> None:
        self._spool = spool
        self._ring = ring
        self._counters = counters
        #: Fresh records refused, for the rejected table (pump).
        self._records: list[tuple[Row, str]] = []
        #: Spool rows refused on their replay, to move there (pump).
        self._rows: list[tuple[int, str]] = []

    def refused(self, kind: str) -> None:
        """send() refuses a record before accepting it (too large, fields librdkafka will
        not take): counted as rejected, an error of ``kind``; send() raises. Any thread."""
        self._counters.reject(kind)

    def reject(self, record: Rec | SpooledRow, why: str) -> None:
        """Kafka (or librdkafka) refused an accepted ``record`` for itself: count it, say
        so, and set it aside in the spool's rejected table at the next settle."""
        self._counters.reject("rejected")
        if type(record) is SpooledRow:
            rid, seq = record
            self._rows.append((rid, why))
        else:
            rec: Rec = record  # type: ignore[assignment]
            seq = rec[5]
            self._records.append((_row(rec), why))
        log.error("record seq=%s rejected by Kafka (%s); set aside in the spool", seq, why)

    def pending(self) -> int:
        """Fresh records refused and not yet in the rejected table (flush() waits for them:
        they are in no other place). Any thread (a size)."""
        return len(self._records)

    def rows_waiting(self) -> bool:
        """Spool rows refused and not yet moved (the replay is not done with them)."""
        return bool(self._rows)

    def lowest_row(self) -> int | None:
        """The lowest spool row refused and not yet moved, or None."""
        return min(r for r, _ in self._rows) if self._rows else None

    def set_aside_records(self) -> bool:
        """Write the fresh records refused to the rejected table (pump). True if it wrote.
        They stay here until committed: on an error they are retried. Raises SpoolError."""
        if not self._records:
            return False
        batch = self._records[:]
        self._spool.reject(batch)
        del self._records[: len(batch)]
        if self._ring is not None:
            for row, _ in batch:
                self._ring.settle(row[5])
        return True

    def set_aside_rows(self) -> bool:
        """Move the spool rows refused to the rejected table (pump). True if it moved some.
        On an error they stay, and are moved at a later settle. Raises SpoolError."""
        if not self._rows:
            return False
        pairs, self._rows = self._rows, []
        try:
            self._spool.move_to_rejected(pairs)
        except SpoolError:
            self._rows = pairs + self._rows
            raise
        return True
