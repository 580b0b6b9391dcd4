"""The free slots of ``spool_dir`` that other processes left with records, and the drains
that deliver them.

Invariants owned here:
- a free slot that still holds records (its process died, was recycled, or closed before
  Kafka took everything) is delivered by a drain on that slot (an engine of its own:
  ``logsdk.producer._engine``), under the slot's own producer id and seqs, and flush()
  and close() of the producer that started it wait for it;
- drains exist only while Kafka answers the producer that runs them: none is started
  while it does not, and the health thread's next look closes those under way (their
  records stay in their slots, free for the next process to take or drain), so a
  long-lived process holds no more drains, slots, clients and threads through an outage
  than it did before it.

A drain is reached only through `Drain`, a handful of public methods; the drains
are made by the ``open_drain`` the wiring gives (this module imports no engine).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from logsdk._resolver import resolver_ready
from logsdk.errors import LogSDKError, SpoolLockedError
from logsdk.producer._config import ProducerConfig
from logsdk.producer._counters import Counters
from logsdk.shm import inspect, segment_name
from logsdk.spool._slots import orphans, slot_path, slot_shm_name, spooled_records

log = logging.getLogger("logsdk.producer")


class Drain(Protocol):
    """What `Drains` asks of a drain (an engine on a free slot)."""

    def undelivered(self) -> int:
        """Records it has not delivered yet."""

    def delivered(self) -> tuple[int, int]:
        """Records it got acknowledged, and set aside as refused by Kafka, so far."""

    def hurry(self, delta: int) -> None:
        """flush()/close() start (+1) or stop (-1) waiting: probe without backoff."""

    def close(self, timeout: float | None = ...) -> None:
        """Deliver for at most ``timeout`` seconds, then stop; the rest stays in its slot."""


class Drains:
    """The producers delivering what free slots of ``spool_dir`` hold (see the module
    docstring), for one producer, and what free slots hold that waits for Kafka.

    Owner: ``_lock``, taken by whoever looks at the slots or closes the drains (the
    producer's constructor, the health thread, flush(), close()); what they publish
    (``_pub``) is replaced whole, never changed in place, so any thread may read it.
    """

    def __init__(
        self,
        config: ProducerConfig,
        slot: int,
        *,
        open_drain: Callable[[int, Path], Drain],
        degraded: Callable[[], bool],
        answered: Callable[[], bool],
        probe: Callable[[float], bool],
        counters: Counters,
        enabled: bool = True,
    ) -> None:
        self._config = config
        self._slot = slot
        self._open_drain = open_drain
        self._degraded = degraded  # this producer is DEGRADED: Kafka is known to be down
        self._answered = answered  # Kafka answered this producer since its last degrade
        self._probe = probe  # a probe of the cluster within a timeout: True if it answers
        self._counters = counters
        self._enabled = enabled  # a drain drains no other slot
        self._lock = threading.Lock()
        #: The drains under way, what the finished ones had acknowledged and set aside, and
        #: the records of free slots left alone at the last look because Kafka did not
        #: answer (published: replaced whole, the four together).
        self._pub: tuple[list[Drain], int, int, int] = ([], 0, 0, 0)

    @property
    def drains(self) -> list[Drain]:
        """The drains under way (any thread)."""
        return self._pub[0]

    @property
    def waiting(self) -> int:
        """Records of free slots no drain delivers yet, because Kafka did not answer at the
        last look (any thread)."""
        return self._pub[3]

    def counts(self) -> tuple[int, int]:
        """Records the drains got acknowledged, and set aside as refused by Kafka: the
        finished ones and those under way (any thread; never less than a moment ago)."""
        drains, acked, rejected, _ = self._pub
        for d in drains:
            a, r = d.delivered()
            acked, rejected = acked + a, rejected + r
        return acked, rejected

    def look(self) -> None:
        """The constructor: count what free slots hold (``waiting``), starting no drain
        (whether Kafka answers is not known yet, and finding out would take a probe on the
        application's thread: the health thread's first scan, at its start, does)."""
        if not self._enabled:
            return
        with self._lock:
            if resolver_ready():
                self._publish(waiting=sum(n for _, _, n in self._orphans_with_records()))

    def scan(self, deadline: float | None = None, *, closing: bool = False) -> None:
        """Close the drains that are done; where Kafka answers, start one for each free
        slot with records; where it does not, leave those slots alone (``waiting``), and
        the health thread's scan (neither a deadline nor closing) stops the drains under
        way too, their records left in their slots.

        Kafka answers when it did since this producer's last degrade, or a probe made now
        says so (within ``deadline``; ``None``: the probe's own timeout). A drain started
        here lives on until its slot is empty, except one started by close()
        (``closing``), which closes it by ``deadline``. No drain while Kafka does not
        answer: a drain holds its slot, a client and threads, and the processes that start
        meanwhile open new slots beside the ones drained (a parent forking short-lived
        workers through an outage gathered a drain, a slot and their threads at every
        scan). A free slot left alone is taken by the next process to start, or drained at
        a later look."""
        if not self._enabled:
            return
        with self._lock:
            self._collect()
            if not resolver_ready():
                # A drain could not deliver from this process; a later producer will.
                self._publish(waiting=0)
                return
            found = self._orphans_with_records()
            if not found and not self.drains:
                self._publish(waiting=0)
                return
            periodic = deadline is None and not closing
            if deadline is None:
                deadline = time.monotonic() + self._config.probe_timeout_s
            if self._kafka_answers(deadline):
                self._start([(index, path) for index, path, _ in found])
                self._publish(waiting=0)
                return
            if periodic and self.drains:
                self._let_go(self.drains)
                found = self._orphans_with_records()
            self._publish(waiting=sum(n for _, _, n in found))

    def undelivered(self) -> int:
        """Records of free slots not delivered yet: the drains' and those waiting for
        Kafka (any thread)."""
        drains, _, _, waiting = self._pub
        return waiting + sum(d.undelivered() for d in drains)

    def hurry(self) -> list[Drain]:
        """flush()/close() begin to wait: the drains under way probe without backoff until
        `calm()` is given the list returned here."""
        hurried = self.drains
        for d in hurried:
            d.hurry(+1)
        return hurried

    def calm(self, hurried: list[Drain]) -> None:
        """The wait that `hurry()` began is over."""
        for d in hurried:
            d.hurry(-1)

    def close_all(self, deadline: float) -> None:
        """close(): close every drain by ``deadline``."""
        with self._lock:
            for d in self.drains:
                d.close(max(0.0, deadline - time.monotonic()))

    def forget(self) -> list[Drain]:
        """A forked child: the drains are the parent's. Returns them (to be buried)."""
        drains = self._pub[0]
        self._pub = ([], 0, 0, 0)
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        return drains

    def _publish(
        self,
        drains: list[Drain] | None = None,
        *,
        delivered: tuple[int, int] = (0, 0),
        waiting: int | None = None,
    ) -> None:
        """Replace what is published: ``drains`` (None: as they are), ``delivered`` added to
        the finished drains' counts, ``waiting`` (None: as it is). Caller holds ``_lock``."""
        old, acked, rejected, was = self._pub
        self._pub = (
            old if drains is None else drains,
            acked + delivered[0],
            rejected + delivered[1],
            was if waiting is None else waiting,
        )

    def _kafka_answers(self, deadline: float) -> bool:
        """True when Kafka answered this producer since its last degrade (an acknowledgement,
        a good probe), or a probe made now, within ``deadline``, says it answers (none with
        less than 0.2 s left). False while DEGRADED: Kafka is known to be down."""
        if self._degraded():
            return False
        if self._answered():
            return True
        timeout = min(self._config.probe_timeout_s, deadline - time.monotonic())
        if timeout < 0.2:
            return False
        return self._probe(timeout)

    def _orphans_with_records(self) -> list[tuple[int, Path, int]]:
        """The free slots of ``spool_dir`` (other than this producer's) that hold records,
        with how many."""
        cfg = self._config
        out = []
        for index in orphans(cfg.spool_dir, self._slot):
            path = slot_path(cfg.spool_dir, index)
            n = self._records_in(index, path)
            if n:
                out.append((index, path, n))
        return out

    def _start(self, found: list[tuple[int, Path]]) -> None:
        """Deliver what the free slots ``found`` hold (their producers died, were recycled,
        or closed before Kafka took everything). Each such slot is drained by a producer of
        its own on that slot, under the slot's producer id and seqs; this producer's
        flush() and close() wait for them, and it closes them once they are done
        (``_collect``). Caller holds ``_lock``."""
        for index, path in found:
            try:
                drain = self._open_drain(index, path)
            except SpoolLockedError:
                continue  # another process took the slot meanwhile
            except (LogSDKError, RuntimeError) as exc:
                # RuntimeError: Python 3.12.0 and 3.12.1 start no thread once the process
                # is leaving (a close() at exit).
                self._counters.error("slot_drain")
                log.warning("spool slot %s left by another process not drained: %s", path, exc)
                continue
            log.info(
                "spool slot %s: %d record(s) left by another process; delivering them",
                path,
                drain.undelivered(),
            )
            self._publish([*self.drains, drain])

    def _records_in(self, index: int, path: Path) -> int:
        """The records the slot's spool holds, and its shm ring (``buffer="shm"``)."""
        n = spooled_records(path)
        if self._config.buffer != "shm":
            return n
        try:
            seg = segment_name(slot_shm_name(self._config.shm_name, index), path)
            return n + inspect(seg).pending
        except LogSDKError:
            return n  # no segment (or not readable): nothing to resend from it

    def _collect(self) -> None:
        """Close the drains that delivered everything."""
        self._let_go([d for d in self.drains if d.undelivered() == 0])

    def _let_go(self, done: list[Drain]) -> None:
        """Close the drains ``done`` at once (what they still hold stays in their slots),
        keeping what they delivered in the counts. Caller holds ``_lock``."""
        if not done:
            return
        acked = rejected = 0
        for d in done:
            d.close(0)
            a, r = d.delivered()
            acked, rejected = acked + a, rejected + r
        self._publish([d for d in self.drains if d not in done], delivered=(acked, rejected))
