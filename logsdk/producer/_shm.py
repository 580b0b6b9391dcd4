"""The producer's shm ring (``buffer="shm"``): attached for its slot, what a dead owner
left in it moved to the slot's spool first.

Invariants:
- a record a dead owner left unsettled in the ring is committed to the spool (one
  transaction, with its original seq) before the ring forgets it: until that commit the
  ring is its only copy (`logsdk.shm.ShmRing.hand_over()`); the ordinary replay path
  then resends it, oldest first, with the same ``logsdk.producer``/``logsdk.seq`` headers;
- a ring whose records could not be committed is closed without being unlinked: they stay
  in it for the next producer on the slot.

Owner: none (a function). The producer's constructor calls it on its own thread, while
that thread owns the spool.
"""

from __future__ import annotations

import logging

from logsdk.shm import ShmRing, segment_name
from logsdk.spool import Spool

log = logging.getLogger("logsdk.shm")


def open_for_producer(spool: Spool, name: str | None, capacity: int) -> ShmRing:
    """Attach the ring of the producer that holds ``spool`` (``name``: its ``shm_name``,
    None to derive one from the spool dir). Records a dead owner left unsettled are
    committed to the spool first, so they are resent before anything newer."""
    seg = segment_name(name, spool.directory)
    ring = ShmRing.attach(seg, capacity, spool.producer_id, spool.directory)
    try:
        moved = ring.hand_over(spool.append)
    except BaseException:
        ring.close(unlink=False)
        raise
    if moved:
        log.warning(
            "shm %s: %d unacknowledged record(s) left by a dead producer moved to the spool; "
            "they are resent first",
            seg,
            moved,
        )
    return ring
