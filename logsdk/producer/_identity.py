"""The producer's identity: its id and the seqs its records carry.

Invariants owned here:
- ``producer_id`` is the spool slot's own (kept in the slot's ``state.json``): a restarted
  producer on the same slot continues under the same id;
- a seq is handed out only below ``Intake.seq_limit``, and every seq below it is reserved on
  disk (``state.json`` and the database) before it is: a seq is never handed out twice for
  one id, even after a crash (a restart starts at the end of the last reservation: a gap,
  never a reuse);
- reservations are made by the thread that owns the spool, never by send(): the
  constructor reserves the first block, and the pump the next one ahead of need, once
  half of the current block is used (`SeqReserver.reserve_ahead()`). send() only
  takes a number from memory; should it ever catch up with the reservation (the pump
  stalled, or the disk refused the reservation), it waits for the pump, at most
  ``max_block_s`` (``Intake.send``), and that wait is counted (``seq_waits`` in stats())
  and logged by the pump;
- a seq is taken under the send lock, and given back only when the record was refused
  and no later seq was taken meanwhile.

The block is ``_SEQ_BLOCK`` seqs; ``LOGSDK_TEST_SEQ_BLOCK`` (an environment variable read
when a producer starts, for tests only) makes it smaller, so that tests cross many
reservations.
"""

from __future__ import annotations

import logging
import os
import time

from logsdk._owner import Owner
from logsdk.errors import ConfigError, SpoolError
from logsdk.producer._counters import Counters
from logsdk.producer._intake import Intake
from logsdk.spool._spool import Spool

log = logging.getLogger("logsdk.producer")

_SEQ_BLOCK = 1 << 20  # sequence numbers reserved on disk at a time
#: For tests only: a smaller block, so that a test crosses many reservations.
ENV_SEQ_BLOCK = "LOGSDK_TEST_SEQ_BLOCK"


def seq_block() -> int:
    """The reservation block of a producer starting now (``_SEQ_BLOCK``, or the test
    setting ``LOGSDK_TEST_SEQ_BLOCK``)."""
    raw = os.environ.get(ENV_SEQ_BLOCK, "").strip()
    if not raw:
        return _SEQ_BLOCK
    try:
        block = int(raw)
    except ValueError:
        block = 0
    if block < 2:
        raise ConfigError(f"{ENV_SEQ_BLOCK} must be an integer >= 2, got {raw!r}")
    return block


class SeqReserver:
    """Keeps the seqs reserved on disk ahead of the send path.

    Owner: the thread that owns the spool: the constructor's (the first block, before the
    intake is shared), then the pump (`reserve_ahead()`, each step), handed over with
    the spool. It reads the intake's ``seq_next`` and ``seq_waits`` as published values and
    raises its ``seq_limit`` (``Intake.extend_seqs``).
    """

    def __init__(self, spool: Spool, counters: Counters) -> None:
        self._spool = spool
        self._counters = counters
        self.block = seq_block()
        self.owner = Owner(f"the seq reservations of {spool.directory}")
        first = spool.seq_reserved
        spool.reserve_seq(first + self.block)  # on disk first: nothing used before it
        self.first = first
        self._refill_at = first + self.block - self.block // 2
        self._retry_at = 0.0
        self._waits_logged = 0
        self._log_at = 0.0

    def span(self) -> tuple[int, int]:
        """The first seq to hand out, and the limit reserved on disk for it."""
        return self.first, self.first + self.block

    def reserve_ahead(self, intake: Intake) -> None:
        """Pump thread: once half of the reservation is used, reserve the next block, so
        that send() always finds a seq in memory. A failed write is retried a second later
        (send() waits meanwhile if it runs out); nothing is advanced before it is on disk."""
        self.owner.check("reserve seqs")
        waits = intake.seq_waits
        if waits != self._waits_logged:
            now = time.monotonic()
            if now >= self._log_at:  # at most once per 10 s, with the count so far
                self._log_at = now + 10.0
                self._waits_logged = waits
                log.error(
                    "send() waited for sequence numbers %d time(s) so far (reserved up to "
                    "%d, %d a block): the pump did not reserve them in time",
                    waits,
                    intake.seq_limit,
                    self.block,
                )
        seq_next = intake.seq_next
        if seq_next < self._refill_at:
            return
        now = time.monotonic()
        if now < self._retry_at:
            return
        # At least a block ahead of the next seq, so that one reservation always suffices.
        limit = max(intake.seq_limit, seq_next) + self.block
        try:
            self._spool.reserve_seq(limit)
        except SpoolError as exc:
            self._retry_at = now + 1.0
            self._counters.error("seq_reservation")
            log.error("sequence numbers not reserved (retried in 1s): %s", exc)
            return
        intake.extend_seqs(limit)  # a sender may be waiting for them
        self._refill_at = limit - self.block // 2
        self._retry_at = 0.0
