"""The producer's identity: its id and the seqs its records carry.

Invariants owned here:
- ``producer_id`` is the spool slot's own (kept in the slot's ``state.json``): a restarted
  producer on the same slot continues under the same id;
- seqs are reserved on disk in blocks of ``_SEQ_BLOCK`` before any of them is used, so a
  seq is never handed out twice for one id, even after a crash (a restart starts at the
  end of the last reserved block: a gap, never a reuse);
- a seq is taken under ``_lock`` (send()), and given back only when the record was refused
  and no later seq was taken meanwhile.
"""

from __future__ import annotations

from logsdk.producer._core import _Core
from logsdk.producer._records import HEADER_PRODUCER

_SEQ_BLOCK = 1 << 20  # sequence numbers reserved on disk at a time


class _Identity(_Core):
    """Producer id and seq reservation (a part of :class:`LogProducer`)."""

    def _init_identity(self) -> None:
        self.producer_id = self._spool.producer_id
        self._pid_bytes = self.producer_id.encode()
        self._pid_header = (HEADER_PRODUCER, self._pid_bytes)
        self._seq_next = self._spool.seq_reserved
        self._seq_limit = self._seq_next + _SEQ_BLOCK
        self._spool.reserve_seq(self._seq_limit)

    def _reserve_seq(self) -> None:
        # On disk first: a failed write raises with nothing advanced, so no seq is ever
        # used that a restart could hand out again.
        limit = self._seq_limit + _SEQ_BLOCK
        self._spool.reserve_seq(limit)
        self._seq_limit = limit
