"""The send path's state: what ``send()`` reads and changes per record, under one lock.

Owner: the lock (:attr:`Gate.lock`), not a thread. ``send()`` runs on any number of
application threads; each holds the lock while it takes a seq and hands its record over.
The pump holds it only for what must change at once with the send path (a state flip,
``direct``, raising ``seq_limit``, taking a batch from the backlog's head or putting one
back), never while it does I/O, purges a client or hands records to librdkafka; the
health thread never takes it. A sender thus waits on the pump for at most one such hold.
Every field is read and written with the lock held, except where a field says "published"
(one attribute read, a stale value harmless).

This is the one part whose fields other parts write (under the lock): it is the send
path's shared state, and ``send()`` reads and writes it inline, one record at a time,
without a call per field.
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from logsdk.producer._records import Rec


class Gate:
    """The send lock and what it guards (see the module docstring)."""

    __slots__ = (
        "backlog",
        "closing",
        "direct",
        "lock",
        "sent",
        "seq_limit",
        "seq_next",
        "seq_waits",
        "space",
        "waiters",
    )

    def __init__(self, seq_next: int, seq_limit: int) -> None:
        self.lock = threading.Lock()
        #: On ``lock``: senders waiting for room (backlog, ring, seqs) wait here; whoever
        #: makes room notifies.
        self.space = threading.Condition(self.lock)
        #: close() began: send() refuses. Published (read by the health thread).
        self.closing = False
        #: send() may hand records straight to librdkafka (ONLINE, nothing queued). Only
        #: send() (turning it off when the client refuses a record) and the pump change it.
        #: Published to the pump, which reads it without the lock between its steps.
        self.direct = False
        #: Records accepted and not handed to librdkafka, in send order: send() appends,
        #: the pump takes from the head (into the client, or into the spool).
        self.backlog: collections.deque[Rec] = collections.deque()
        #: The seqs of senders waiting for room (ring, backlog, spool), in seq order: each
        #: takes its turn in that order, every later sender queues behind them, and
        #: ``direct`` stays off while any waits (``Custody.accept_in_turn``).
        self.waiters: collections.deque[int] = collections.deque()
        #: The next record's seq; seqs below ``seq_limit`` are reserved on disk (the pump
        #: raises it ahead of need: logsdk.producer._identity).
        self.seq_next = seq_next
        self.seq_limit = seq_limit
        #: send() calls that had to wait for a reservation (0 unless the pump stalls).
        self.seq_waits = 0
        #: Records accepted by send().
        self.sent = 0
