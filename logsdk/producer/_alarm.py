"""The disk alarm: the spool failed an operation; records wait in memory until it works.

Invariants owned here:
- a spool operation that fails raises the alarm (logged once, counted in ``spool_io``);
  the same kind of operation succeeding clears it; failed operations are retried once a
  second (`DiskAlarm.ready()`);
- a damaged database (``SpoolError.corrupt``) does not raise the alarm: the spool is set
  aside and rebuilt from every row that can still be read, under the same ids (at most once
  a minute: damaged again so soon means the disk itself fails, and the alarm goes up).

Owner: the pump thread (and close() once the pump has ended), with the spool. ``reason``
is published: any thread may read it (``stats()``).
"""

from __future__ import annotations

import logging
import time

from logsdk._owner import Owner
from logsdk.errors import SpoolError
from logsdk.producer._counters import Counters
from logsdk.spool._spool import Spool

log = logging.getLogger("logsdk.producer")


class DiskAlarm:
    """Whether the spool can be used now (see the module docstring)."""

    def __init__(self, spool: Spool, counters: Counters, owner: Owner) -> None:
        self._spool = spool
        self._counters = counters
        self._owner = owner
        #: Why the disk cannot be used, or None. Published.
        self.reason: str | None = None
        self._op = ""  # the kind of operation that raised it: "write", "settle" or "read"
        self._retry_at = 0.0
        self._rebuilt_at = -60.0
        self._rebuilt = False  # a rebuild since take_rebuilt(): the spool's room changed

    def ready(self) -> bool:
        """True when a spool operation may be tried now (no alarm, or its retry is due)."""
        return self.reason is None or time.monotonic() >= self._retry_at

    def retry_now(self) -> None:
        """close(): try the disk at once, whatever the alarm says (a last chance)."""
        self._retry_at = 0.0

    def ok(self, op: str) -> None:
        """``op`` succeeded: clear the alarm if that kind of operation raised it."""
        if self.reason is not None and op == self._op:
            log.warning("spool usable again (%s): %s cleared", op, self.reason)
            self.reason = None

    def failed(self, exc: SpoolError, op: str) -> None:
        """The spool failed ``op``. A damaged database is rebuilt (and ``op`` is then simply
        tried again); anything else raises the alarm, retried a second later."""
        self._owner.check("raise the disk alarm")
        if exc.corrupt and self._rebuild(exc):
            return
        if self.reason is None:
            log.error("spool unusable, records kept in memory until it recovers: %s", exc)
        self.reason = str(exc)
        self._op = op
        self._counters.error("spool_io")
        self._retry_at = time.monotonic() + 1.0

    def _rebuild(self, exc: SpoolError) -> bool:
        now = time.monotonic()
        if now - self._rebuilt_at < 60.0:
            return False  # damaged again so soon: the disk itself fails; raise the alarm
        self._rebuilt_at = now
        self._counters.error("spool_rebuilt")
        try:
            self._spool.rebuild(str(exc))
        except SpoolError as again:
            log.error("spool damaged and could not be rebuilt: %s", again)
            return False
        # The rows keep their ids: the replay's cursor, rows in flight and acknowledged
        # ids stay valid; rows that could not be read are no longer there to delete.
        self._rebuilt = True
        return True

    def take_rebuilt(self) -> bool:
        """True once after each rebuild (the pump looks at the spool's room again)."""
        rebuilt, self._rebuilt = self._rebuilt, False
        return rebuilt
