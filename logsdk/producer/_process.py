"""A producer among processes: fork, the slots of ``spool_dir``, exit.

Invariants owned here:
- a producer used in a forked child starts afresh there at its first use (its own slot,
  producer id, seqs, spool, ring, client and threads); what it inherited from the parent
  (a client whose threads did not survive the fork, the parent's SQLite connections,
  lock and ring) is never used, closed or freed in the child (``bury``; the clients by
  ``logsdk._fork``): the parent's records stay the parent's;
- every live process holds its own slot of ``spool_dir``; a free slot that still holds
  records (its process died, was recycled, or closed before Kafka took everything) is
  delivered by a drain producer on that slot, under the slot's own producer id and seqs,
  and flush()/close() of the producer that started it wait for it;
- drains exist only while Kafka answers the producer that runs them: none is started
  while it does not, and the health thread's next look closes those under way (their
  records stay in their slots, free for the next process to take or drain), so a
  long-lived process holds no more drains, slots, clients and threads through an outage
  than it did before it;
- a producer an adapter owns is closed when its process leaves, at interpreter exit and
  at the end of a multiprocessing or billiard (Celery) child, which leaves through
  ``os._exit`` after running its ``Finalize`` callbacks only; one the application left
  open is closed then too (within ``OPEN_AT_EXIT_TIMEOUT_S``, with a warning): a record
  send() accepted is never dropped with the process's memory;
- the exit hook runs wherever Python puts it among other exit hooks (last-registered
  first: no library chooses that order), so it relies on none: it first has what the
  adapters' hand-overs and OpenTelemetry's global provider hold given to their producers,
  and what another exit hook sends after it is the sender's to deliver (``leaving``: an
  OpenTelemetry exporter makes its producer again, logsdk.integrations.otel).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logsdk._fork import at_fork_in_child
from logsdk._resolver import resolver_ready
from logsdk.errors import LogSDKError, SpoolLockedError
from logsdk.producer import _client
from logsdk.producer._config import ProducerConfig
from logsdk.producer._pump import Pump, State
from logsdk.producer._tally import Tally
from logsdk.shm import inspect, segment_name
from logsdk.spool._slots import orphans, slot_path, slot_shm_name, spooled_records

if TYPE_CHECKING:
    from logsdk.producer._producer import LogProducer

log = logging.getLogger("logsdk.producer")

#: Every producer not yet closed, so a forked child can mark the ones it inherited.
_LIVE: weakref.WeakSet[LogProducer] = weakref.WeakSet()
#: Seconds the producers still open at exit (none of an adapter's) share to deliver.
OPEN_AT_EXIT_TIMEOUT_S = 5.0
#: Producers closed when the process leaves, with the timeout each delivers within.
_AT_EXIT: weakref.WeakKeyDictionary[LogProducer, float] = weakref.WeakKeyDictionary()
#: The pid in which a Finalize callback is registered, per pool module (a Finalize only
#: runs in the process that registered it); and whether atexit has the hook (a forked
#: child inherits it).
_pool_hooked: dict[str, int] = {}
_atexit_hooked = False
#: The pid of the process whose exit hook has begun (see ``leaving``).
_leaving_in: int | None = None


class _Rehook:
    """The object a pool module's after-fork registry holds (weakly) for us."""


#: Kept alive for the after-fork registries; which modules have it registered (a forked
#: child inherits both the registration and this set; a spawned one starts without).
_REHOOK = _Rehook()
_rehook_registered: set[str] = set()


def _after_fork_in_child() -> None:
    for p in list(_LIVE):
        p._forked()


at_fork_in_child(_after_fork_in_child)


def leaving() -> bool:
    """True once this process's exit hook (:func:`_close_all_at_exit`) has begun: what is
    sent from then on is sent after logsdk closed its producers (another exit hook's)."""
    return _leaving_in == os.getpid()


def _close_all_at_exit() -> None:
    global _leaving_in
    _leaving_in = os.getpid()
    # What OpenTelemetry's global provider still holds goes to its exporters first.
    otel = sys.modules.get("logsdk.integrations.otel")
    if otel is not None:
        try:
            otel._flush_at_exit()
        except Exception:
            log.exception("logsdk: flushing OpenTelemetry's logs at exit failed")
    # What adapters handed to a thread of theirs goes to its producer first.
    handoff = sys.modules.get("logsdk.integrations._handoff")
    if handoff is not None:
        try:
            handoff.close_all()
        except Exception:
            log.exception("logsdk: closing a hand-over at exit failed")
    for p, timeout in list(_AT_EXIT.items()):
        try:
            p.close(timeout)
        except Exception:  # the others are closed all the same
            log.exception("logsdk: closing a producer at exit failed")
    # Producers the application made and left open: their records in memory would be
    # lost with the process. Closed within one shared budget, and said so. (One put in
    # _AT_EXIT meanwhile, by another thread, has an owner that closes it.)
    left = [
        p
        for p in list(_LIVE)
        if p._drain_at is None and not p._closed.is_set() and p not in _AT_EXIT
    ]
    if not left:
        return
    deadline = time.monotonic() + OPEN_AT_EXIT_TIMEOUT_S
    for p in left:
        if p._stale:  # a forked child's inherited producer, never used here: the parent's
            p.close(0)
            continue
        log.warning(
            "logsdk: a LogProducer (topic %r, spool_dir %s) was still open at exit; closing "
            "it (at most %gs: what Kafka cannot take by then stays in the spool). Call "
            "close() (or use it as a context manager) to choose how long",
            p.config.topic,
            p.config.spool_dir,
            OPEN_AT_EXIT_TIMEOUT_S,
        )
        try:
            p.close(max(0.0, deadline - time.monotonic()))
        except Exception:
            log.exception("logsdk: closing a producer at exit failed")


def hook_exit() -> None:
    """Run :func:`_close_all_at_exit` when this process leaves: at interpreter exit, and at
    the end of a multiprocessing or billiard child (every producer calls it, and again at
    its first use in a forked child)."""
    global _atexit_hooked
    if not _atexit_hooked:
        _atexit_hooked = True
        atexit.register(_close_all_at_exit)
    _hook_pool_exit()


def _hook_pool_exit() -> None:
    """Have multiprocessing's and billiard's exit run ``_close_all_at_exit`` in this
    process (their children leave through ``os._exit``: no atexit).

    A child's bootstrap empties the Finalize registry after a spawned or forkserver child
    has imported the main module (where a handler configured at import registered its
    hook) and then runs the after-fork callbacks: ours registers the hook again there."""
    pid = os.getpid()
    for name, util in _pool_modules():
        if _pool_hooked.get(name) != pid:
            _pool_hooked[name] = pid
            util.Finalize(None, _close_all_at_exit, exitpriority=10)
        register = getattr(util, "register_after_fork", None)
        if register is not None and name not in _rehook_registered:
            _rehook_registered.add(name)
            register(_REHOOK, functools.partial(_rehook_after_bootstrap, name))


def _pool_modules() -> list[tuple[str, Any]]:
    """multiprocessing's util module and billiard's, where loaded; billiard's only if it
    keeps registries of its own (billiard 4 uses multiprocessing's)."""
    out: list[tuple[str, Any]] = []
    for name in ("multiprocessing.util", "billiard.util"):
        util = sys.modules.get(name)
        finalize = getattr(util, "Finalize", None)
        if finalize is not None and all(u.Finalize is not finalize for _, u in out):
            out.append((name, util))
    return out


def _rehook_after_bootstrap(name: str, _obj: _Rehook) -> None:
    """In a pool module's child, right after its bootstrap emptied the Finalize registry."""
    _pool_hooked.pop(name, None)
    if len(_AT_EXIT) or len(_LIVE):  # every producer is closed at exit (hook_exit)
        _hook_pool_exit()


def close_at_exit(producer: LogProducer, timeout: float) -> None:
    """Close ``producer`` (delivering for at most ``timeout`` seconds) when the process
    leaves: at interpreter exit, and at the end of a process that multiprocessing or
    billiard (Celery's pool) started. Hooked again in a forked child at its first use."""
    _AT_EXIT[producer] = timeout
    hook_exit()


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
        pump: Pump,
        answered: Callable[[], bool],
        errors: Tally,
        stop: threading.Event,
        enabled: bool = True,
    ) -> None:
        self._config = config
        self._slot = slot
        self._pump = pump
        self._answered = answered
        self._errors = errors
        self._stop = stop
        self._enabled = enabled  # a drain drains no other slot
        self._lock = threading.Lock()
        #: The drains under way, what the finished ones had acknowledged and set aside, and
        #: the records of free slots left alone at the last look because Kafka did not
        #: answer (published: replaced whole, the four together).
        self._pub: tuple[list[LogProducer], int, int, int] = ([], 0, 0, 0)

    @property
    def drains(self) -> list[LogProducer]:
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
            a, r = d._delivered_counts()
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
        return waiting + sum(d._undelivered() for d in drains)

    def hurry(self, delta: int) -> None:
        """flush()/close() wait: the drains' health threads probe without backoff."""
        for d in self.drains:
            d._hurry(delta)

    def close_all(self, deadline: float) -> None:
        """close(): close every drain by ``deadline``."""
        with self._lock:
            for d in self.drains:
                d.close(max(0.0, deadline - time.monotonic()))

    def forget(self) -> list[LogProducer]:
        """A forked child: the drains are the parent's. Returns them (to be buried)."""
        drains = self._pub[0]
        self._pub = ([], 0, 0, 0)
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        return drains

    def _publish(
        self,
        drains: list[LogProducer] | None = None,
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
        if self._pump.state is State.DEGRADED:
            return False
        if self._answered():
            return True
        timeout = min(self._config.probe_timeout_s, deadline - time.monotonic())
        if timeout < 0.2:
            return False
        return _client.probe(self._config.probe_config(), self._config.topic, timeout, self._stop)

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
        from logsdk.producer._producer import LogProducer

        cfg = self._config
        for index, path in found:
            try:
                drain = LogProducer._for_slot(cfg, index, path)
            except SpoolLockedError:
                continue  # another process took the slot meanwhile
            except (LogSDKError, RuntimeError) as exc:
                # RuntimeError: Python 3.12.0 and 3.12.1 start no thread once the process
                # is leaving (a close() at exit).
                self._errors.add("slot_drain")
                log.warning("spool slot %s left by another process not drained: %s", path, exc)
                continue
            log.info(
                "spool slot %s: %d record(s) left by another process; delivering them",
                path,
                drain._undelivered(),
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
        self._let_go([d for d in self.drains if d._undelivered() == 0])

    def _let_go(self, done: list[LogProducer]) -> None:
        """Close the drains ``done`` at once (what they still hold stays in their slots),
        keeping what they delivered in the counts. Caller holds ``_lock``."""
        if not done:
            return
        acked = rejected = 0
        for d in done:
            d.close(0)
            a, r = d._delivered_counts()
            acked, rejected = acked + a, rejected + r
        self._publish([d for d in self.drains if d not in done], delivered=(acked, rejected))
