"""Counts kept by several threads at once: errors by kind, records dropped and rejected."""

from __future__ import annotations

import collections
import threading


class Tally(collections.Counter[str]):
    """Counts by kind, added to from any thread: the send path, the pump, the health thread,
    flush() and close() all add, sometimes to the same kind, so each addition takes a lock
    of its own (a leaf lock: nothing is called while it is held, so it may be taken with
    any other lock held). Read as a plain dict (``dict(tally)`` is one C call)."""

    def __init__(self) -> None:
        super().__init__()
        self._add_lock = threading.Lock()

    def add(self, kind: str, n: int = 1) -> None:
        """Count ``n`` more of ``kind``."""
        with self._add_lock:
            self[kind] += n
