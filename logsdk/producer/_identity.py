"""The producer's identity: its id and the seqs its records carry.

Invariants owned here:
- ``producer_id`` is the spool slot's own (kept in the slot's ``state.json``): a restarted
  producer on the same slot continues under the same id;
- a seq is handed out only below ``Gate.seq_limit``, and every seq below it is reserved on
  disk (``state.json`` and the database) before it is: a seq is never handed out twice for
  one id, even after a crash (a restart starts at the end of the last reservation: a gap,
  never a reuse);
- reservations are made by the thread that owns the spool, never by send(): the
  constructor reserves the first block, and the pump the next one ahead of need, once
  half of the current block is used (:meth:`SeqReserver.reserve_ahead`). send() only
  takes a number from memory; should it ever catch up with the reservation (the pump
  stalled, or the disk refused the reservation), it waits for the pump, at most
  ``max_block_s`` (:func:`wait_for_seq`), and that wait is counted (``seq_waits`` in
  stats()) and logged by the pump;
- a seq is taken under the send lock, and given back only when the record was refused
  and no later seq was taken meanwhile.

The block is ``_SEQ_BLOCK`` seqs; ``LOGSDK_TEST_SEQ_BLOCK`` (an environment variable read
when a producer starts, for tests only) makes it smaller, so that tests cross many
reservations.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from logsdk._owner import Owner
from logsdk.errors import ConfigError, ProducerClosedError, SpoolError
from logsdk.producer._gate import Gate
from logsdk.producer._tally import Tally
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
    gate is shared), then the pump (:meth:`reserve_ahead`, each step), handed over with the
    spool. It reads the gate's ``seq_next`` and ``seq_waits`` as published values and
    raises ``seq_limit`` under the gate's lock.
    """

    def __init__(self, spool: Spool, errors: Tally) -> None:
        self._spool = spool
        self._errors = errors
        self.block = seq_block()
        self.owner = Owner(f"the seq reservations of {spool.directory}")
        first = spool.seq_reserved
        spool.reserve_seq(first + self.block)  # on disk first: nothing used before it
        self.first = first
        self._refill_at = first + self.block - self.block // 2
        self._retry_at = 0.0
        self._waits_logged = 0
        self._log_at = 0.0

    def gate(self) -> Gate:
        """The send path's gate, starting at the first reserved seq."""
        return Gate(self.first, self.first + self.block)

    def reserve_ahead(self, gate: Gate) -> None:
        """Pump thread: once half of the reservation is used, reserve the next block, so
        that send() always finds a seq in memory. A failed write is retried a second later
        (send() waits meanwhile if it runs out); nothing is advanced before it is on disk."""
        self.owner.check("reserve seqs")
        waits = gate.seq_waits
        if waits != self._waits_logged:
            now = time.monotonic()
            if now >= self._log_at:  # at most once per 10 s, with the count so far
                self._log_at = now + 10.0
                self._waits_logged = waits
                log.error(
                    "send() waited for sequence numbers %d time(s) so far (reserved up to "
                    "%d, %d a block): the pump did not reserve them in time",
                    waits,
                    gate.seq_limit,
                    self.block,
                )
        seq_next = gate.seq_next
        if seq_next < self._refill_at:
            return
        now = time.monotonic()
        if now < self._retry_at:
            return
        # At least a block ahead of the next seq, so that one reservation always suffices.
        limit = max(gate.seq_limit, seq_next) + self.block
        try:
            self._spool.reserve_seq(limit)
        except SpoolError as exc:
            self._retry_at = now + 1.0
            self._errors.add("seq_reservation")
            log.error("sequence numbers not reserved (retried in 1s): %s", exc)
            return
        with gate.lock:
            gate.seq_limit = limit
            gate.space.notify_all()  # a sender may be waiting for them
        self._refill_at = limit - self.block // 2
        self._retry_at = 0.0


def wait_for_seq(
    gate: Gate, wake: threading.Event, max_block_s: float, alarm: Callable[[], str | None]
) -> int:
    """send() caught up with the reservation (caller holds ``gate.lock``): wait for the
    pump to reserve more, at most ``max_block_s``. Returns the seq to take."""
    gate.seq_waits += 1
    deadline = time.monotonic() + max_block_s
    while gate.seq_next >= gate.seq_limit:
        if gate.closing:
            raise ProducerClosedError("the producer is closed; it accepts no more records")
        left = deadline - time.monotonic()
        if left <= 0:
            raise SpoolError(
                f"no sequence number reserved on disk within max_block_s={max_block_s} "
                f"(reserved up to {gate.seq_limit}; spool alarm: {alarm() or 'none'})"
            )
        wake.set()
        gate.space.wait(min(left, 0.05))
    return gate.seq_next
