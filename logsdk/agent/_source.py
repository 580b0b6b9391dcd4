"""One producer as the agent sees it: its ring (while it exists), its spool (while Kafka
could not take its records), and what of it is in librdkafka.

Invariants:
- a record read from the ring is settled there only once it is safe: acknowledged by
  Kafka (the delivery report), committed to this producer's spool, or set aside as
  refused (the spool's rejected table, or counted corrupt when it is not a record);
- the spool is ``<spool root>/agent/<producer id>/`` and carries the producer's own id
  in its ``state.json``: a replayed record carries the id and seq it was written with;
- while the spool holds rows, the ring's new records are appended behind them (never
  produced around them), so a key's records keep their order through an outage;
- a spool that could not be opened is never taken for empty (`Source.spool_unread`):
  the agent opens it again at each scan, and removes a producer's directory only once
  its spool was opened and found empty;
- the spool holds at most ``spool_max_bytes`` (counted as the producer's spool counts):
  past it, records wait in their ring (whose ``when_full`` then applies in the
  application);
- a record is checked before it is produced or spooled (`check_row()`): a topic
  Kafka would refuse or a header the SDK owns makes it refused, never sent.

Owner: the agent's thread (``logsdk-agent``), which made the source; nothing else calls
it. The spool's own ``Owner`` is that thread.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import struct
from pathlib import Path

from logsdk._owner import Owner
from logsdk.errors import ConfigError, LogSDKError, SpoolError, SpoolFullError
from logsdk.producer._config import check_topic
from logsdk.producer._records import HEADER_PRODUCER, KHeaders
from logsdk.shm._reader import RingReader
from logsdk.spool._codec import Row, decode_headers, row_size
from logsdk.spool._spool import Spool
from logsdk.spool._state import write_state

log = logging.getLogger("logsdk.agent")


#: Topics found valid (a set, bounded: names made up per record are checked each time).
_TOPICS_OK: set[str] = set()


def check_row(row: Row) -> KHeaders | None:
    """The user headers of ``row`` as librdkafka takes them, or None when the record must
    not be sent: a topic Kafka refuses, a headers blob that does not decode, a header
    named like the SDK's own (``logsdk.*``: the ids are the agent's to set)."""
    topic = row[0]
    if topic not in _TOPICS_OK:
        try:
            check_topic(topic)
        except ConfigError:
            return None
        if len(_TOPICS_OK) < 10_000:
            _TOPICS_OK.add(topic)
    if not row[3]:
        return []
    try:
        user = decode_headers(row[3])
    except (struct.error, UnicodeDecodeError, ValueError, IndexError):
        return None
    if any(name.startswith("logsdk.") for name, _ in user):
        return None
    return list(user)


class Source:
    """One producer id: its ring reader, its spool, its records in flight (see the module
    docstring)."""

    def __init__(
        self,
        producer_id: str,
        spool_dir: Path,
        reader: RingReader | None,
        *,
        synchronous: str,
        max_bytes: int | None,
    ) -> None:
        self.producer_id = producer_id
        self.owner = Owner(f"the agent's source {producer_id}")
        self.spool_dir = spool_dir
        self.reader = reader
        self.pid_header = (HEADER_PRODUCER, producer_id.encode())
        self._synchronous = synchronous
        self._max_bytes = max_bytes
        self.spool: Spool | None = None
        #: Ring records in librdkafka (fresh), and spool rows in librdkafka (replays).
        self.inflight = 0
        self.replaying = 0
        #: The last spool row id produced by the replay under way (0: from the first).
        self.replay_after = 0
        #: Filled by delivery reports, emptied after each poll (`after_poll()`).
        self.acked: list[int] = []
        self.failed: list[tuple[int, Row]] = []
        self.refused: list[tuple[int, Row, str]] = []
        self.replayed: list[int] = []
        self.replay_refused: list[tuple[int, str]] = []
        #: The writer was dead at the last look (it never comes back).
        self.writer_dead = reader is None
        #: A spool on disk not opened yet (at first, or its open failed: locked, a failing
        #: disk): what it holds is unknown, so it is never taken for empty.
        self.spool_unread = (spool_dir / "spool.db").exists()

    # -- the spool -----------------------------------------------------------------------

    def open_spool(self) -> Spool:
        """This producer's spool, opened (and made, with its id) at first need."""
        if self.spool is None:
            d = self.spool_dir
            if not d.exists():
                try:
                    d.mkdir(mode=0o700, parents=True)
                    write_state(d, {"producer_id": self.producer_id, "seq_reserved": 0})
                except OSError as exc:
                    raise SpoolError(f"cannot create the spool {d}: {exc}") from exc
            self.spool = Spool(d, synchronous=self._synchronous, max_bytes=self._max_bytes).open()
            self.spool_unread = False
        return self.spool

    @property
    def spooled(self) -> int:
        """Rows in the spool (0 when none was opened)."""
        return 0 if self.spool is None else self.spool.count

    def keep(self, taken: list[tuple[int, Row]]) -> int:
        """Commit ``taken`` (ring records) to the spool, then settle them in the ring."""
        self.owner.check("spool a ring's records")
        if not taken:
            return 0
        spool = self.open_spool()
        rows = [row for _, row in taken]
        room = spool.room()
        if room is not None and sum(row_size(r) for r in rows) > room:
            raise SpoolFullError(
                f"the agent's spool of producer {self.producer_id} is full "
                f"(spool_max_bytes={spool.max_bytes})"
            )
        spool.append(rows)
        if self.reader is not None:
            self.reader.settle([pos for pos, _ in taken])
        return len(taken)

    def set_aside(self, refused: list[tuple[int, Row, str]]) -> None:
        """Records Kafka (or the agent's checks) refused: into the spool's rejected table,
        then settled."""
        if not refused:
            return
        self.open_spool().reject([(row, why) for _, row, why in refused])
        if self.reader is not None:
            self.reader.settle([pos for pos, _, _ in refused])

    def after_poll(self) -> tuple[int, int, int, int]:
        """What the delivery reports of the last poll said, applied: failed records
        committed to the spool then settled, refused ones set aside, acknowledged ones
        settled, acknowledged replays deleted. Returns (acknowledged, replayed, spooled,
        refused). A spool that refuses a write raises (after the rest is applied); what
        it did not take stays in the ring, unsettled, and is tried again next time."""
        self.owner.check("apply delivery reports")
        acked, self.acked = self.acked, []
        replayed, self.replayed = self.replayed, []
        gone, self.replay_refused = self.replay_refused, []
        if acked and self.reader is not None:
            self.reader.settle(acked)
        failed, self.failed = self.failed, []
        refused, self.refused = self.refused, []
        error: LogSDKError | None = None
        try:
            if self.spool is not None and replayed:
                self.spool.delete(replayed)
            if self.spool is not None and gone:
                # A spooled record Kafka refused: set aside, not retried for ever.
                self.spool.move_to_rejected(gone)
        except LogSDKError as exc:
            error = exc
        try:
            self.keep(failed)
        except LogSDKError as exc:
            self.failed[:0], failed, error = failed, [], exc
        try:
            self.set_aside(refused)
        except LogSDKError as exc:
            self.refused[:0], refused, error = refused, [], exc
        if error is not None:
            raise error
        return len(acked), len(replayed), len(failed), len(refused) + len(gone)

    # -- the end -------------------------------------------------------------------------

    def let_ring_go(self) -> bool:
        """Unlink the ring once its writer is dead and every record in it is safe (read to
        the end, settled, none in librdkafka); True when it did. The spool may still hold
        rows: they are the agent's now."""
        r = self.reader
        if r is None or not (self.writer_dead and r.finished and r.open == 0):
            return False
        if self.inflight:
            return False
        r.unlink()
        r.close()
        self.reader = None
        return True

    def done(self) -> bool:
        """Nothing of this producer is left: no ring, its spool empty, nothing in flight.
        The spool's table is asked too, not only its gauges: `remove()` cannot be undone."""
        if self.reader is not None or self.replaying or self.spooled or self.spool_unread:
            return False
        return self.spool is None or not self.spool.holds_rows()

    def remove(self) -> None:
        """`done()`: close and remove the spool."""
        if self.spool is not None:
            self.spool.close()
            self.spool = None
        with contextlib.suppress(OSError):
            shutil.rmtree(self.spool_dir)

    def close(self) -> None:
        """The agent stops: unmap the ring, close the spool (both stay for the next one)."""
        if self.reader is not None:
            self.reader.close()
        if self.spool is not None:
            self.spool.close()
            self.spool = None
