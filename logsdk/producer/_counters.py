"""What every thread of a producer counts: records dropped and rejected, errors by kind.

The send path, the pump, the health thread, flush() and close() all count, sometimes the
same thing at once, so each addition takes a lock of its own (a leaf lock: nothing is
called while it is held, so it may be taken with any other lock held). The figures are
published: any thread reads them without the lock (``stats()``).
"""

from __future__ import annotations

import collections
import threading


class Tally(collections.Counter[str]):
    """Counts by kind, added to from any thread under a lock of its own. Read as a plain
    dict (``dict(tally)`` is one C call)."""

    def __init__(self) -> None:
        super().__init__()
        self._add_lock = threading.Lock()

    def add(self, kind: str, n: int = 1) -> None:
        """Count ``n`` more of ``kind``."""
        with self._add_lock:
            self[kind] += n


class Counters:
    """A producer's counts (see the module docstring): one object, handed to every part
    that counts."""

    __slots__ = ("_lock", "dropped", "errors", "rejected")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Records removed by the ``when_full`` policy. Published.
        self.dropped = 0
        #: Records refused as bad data (by send(), librdkafka or Kafka). Published.
        self.rejected = 0
        #: Errors by kind (``stats()["errors"]``).
        self.errors = Tally()

    def error(self, kind: str, n: int = 1) -> None:
        """Count ``n`` errors of ``kind``."""
        self.errors.add(kind, n)

    def drop(self, n: int = 1) -> None:
        """``n`` records were dropped by the ``when_full`` policy."""
        with self._lock:
            self.dropped += n

    def reject(self, kind: str) -> None:
        """One record was refused as bad data, an error of ``kind``."""
        with self._lock:
            self.rejected += 1
        self.errors.add(kind)
