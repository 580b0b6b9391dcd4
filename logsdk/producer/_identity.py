"""The producer's identity: its id and the seqs its records carry.

Invariants owned here:
- ``producer_id`` is the spool slot's own (kept in the slot's ``state.json``): a restarted
  producer on the same slot continues under the same id;
- a seq is handed out only below ``_seq_limit``, and every seq below it is reserved on disk
  (``state.json`` and the database) before it is: a seq is never handed out twice for one
  id, even after a crash (a restart starts at the end of the last reservation: a gap,
  never a reuse);
- reservations are made by the thread that owns the spool, never by send(): the
  constructor reserves the first block, and the pump the next one ahead of need, once
  half of the current block is used (``_reserve_ahead``). send() only takes a number from
  memory; should it ever catch up with the reservation (the pump stalled, or the disk
  refused the reservation), it waits for the pump, at most ``max_block_s``, and that
  wait is counted (``seq_waits`` in stats()) and logged by the pump;
- a seq is taken under ``_lock`` (send()), and given back only when the record was refused
  and no later seq was taken meanwhile.

The block is ``_SEQ_BLOCK`` seqs; ``LOGSDK_TEST_SEQ_BLOCK`` (an environment variable read
when a producer starts, for tests only) makes it smaller, so that tests cross many
reservations.
"""

from __future__ import annotations

import logging
import os
import time

from logsdk.errors import ConfigError, ProducerClosedError, SpoolError
from logsdk.producer._core import _Core
from logsdk.producer._records import HEADER_PRODUCER

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


class _Identity(_Core):
    """Producer id and seq reservation (a part of :class:`LogProducer`)."""

    def _init_identity(self) -> None:
        """Read the id and reserve the first block (the thread that opened the spool)."""
        self.producer_id = self._spool.producer_id
        self._pid_bytes = self.producer_id.encode()
        self._pid_header = (HEADER_PRODUCER, self._pid_bytes)
        self._seq_block = seq_block()
        self._seq_next = self._spool.seq_reserved
        self._seq_limit = self._seq_next + self._seq_block
        self._spool.reserve_seq(self._seq_limit)
        self._seq_refill_at = self._seq_limit - self._seq_block // 2
        self._seq_retry_at = 0.0
        self._n_seq_waits = 0
        self._seq_waits_logged = 0
        self._seq_log_at = 0.0

    def _reserve_ahead(self) -> None:
        """Pump thread: once half of the reservation is used, reserve the next block, so
        that send() always finds a seq in memory. A failed write is retried a second later
        (send() waits meanwhile if it runs out); nothing is advanced before it is on disk."""
        waits = self._n_seq_waits
        if waits != self._seq_waits_logged:
            now = time.monotonic()
            if now >= self._seq_log_at:  # at most once per 10 s, with the count so far
                self._seq_log_at = now + 10.0
                self._seq_waits_logged = waits
                log.error(
                    "send() waited for sequence numbers %d time(s) so far (reserved up to "
                    "%d, %d a block): the pump did not reserve them in time",
                    waits,
                    self._seq_limit,
                    self._seq_block,
                )
        if self._seq_next < self._seq_refill_at:
            return
        now = time.monotonic()
        if now < self._seq_retry_at:
            return
        # At least a block ahead of the next seq, so that one reservation always suffices.
        limit = max(self._seq_limit, self._seq_next) + self._seq_block
        try:
            self._spool.reserve_seq(limit)
        except SpoolError as exc:
            self._seq_retry_at = now + 1.0
            self._errors.add("seq_reservation")
            log.error("sequence numbers not reserved (retried in 1s): %s", exc)
            return
        with self._lock:
            self._seq_limit = limit
            self._space.notify_all()  # a sender may be waiting for them
        self._seq_refill_at = limit - self._seq_block // 2
        self._seq_retry_at = 0.0

    def _wait_for_seq(self) -> int:
        """send() caught up with the reservation (caller holds ``_lock``): wait for the
        pump to reserve more, at most ``max_block_s``. Returns the seq to take."""
        self._n_seq_waits += 1
        deadline = time.monotonic() + self.config.max_block_s
        while self._seq_next >= self._seq_limit:
            if self._closing:
                raise ProducerClosedError("the producer is closed; it accepts no more records")
            left = deadline - time.monotonic()
            if left <= 0:
                raise SpoolError(
                    f"no sequence number reserved on disk within max_block_s="
                    f"{self.config.max_block_s} (reserved up to {self._seq_limit}; "
                    f"spool alarm: {self._alarm or 'none'})"
                )
            self._wake.set()
            self._space.wait(min(left, 0.05))
        return self._seq_next
