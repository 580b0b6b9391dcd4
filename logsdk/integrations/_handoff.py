"""A hand-over queue: the application's thread puts an item, one logsdk thread works it.

An adapter in background mode (``KafkaHandler(background=True)``) keeps on the
application's thread only what must be taken at the call (the message, the exception
text, the trace context) and puts it here; the hand-over thread builds the JSON document
and sends it through the producer, in put order (so per logger, per key, per thread).

Owners:
- the queue is filled by any thread (`Handoff.put()`) and emptied by the hand-over
  thread alone (``_run``);
- `Handoff.drain()` and `Handoff.close()` may be called by any thread but the
  hand-over thread; ``_start_lock`` guards starting the thread and closing it.

Invariants:
- an item put before a drain's marker has been worked when the marker is reached (one
  FIFO queue, one thread): ``drain()`` returning True means every earlier item went to
  ``work``;
- memory is bounded: at ``bound`` items waiting, ``put`` waits for room at most
  ``max_block_s``, then refuses (the caller counts the item as dropped);
- a forked child starts with an empty queue and no thread (the parent's items are the
  parent's: it sends them); its first ``put`` starts a thread of its own;
- at exit, and at the end of a multiprocessing or billiard child, every live hand-over is
  closed (drained) before the producers are (``logsdk.producer._process``).
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from logsdk import _fork
from logsdk._owner import Owner

#: The item that ends the hand-over thread.
_STOP = object()


class _Marker:
    """Put by drain(): set when the hand-over thread reaches it."""

    __slots__ = ("reached",)

    def __init__(self) -> None:
        self.reached = threading.Event()


#: Every hand-over not yet closed (a forked child resets the ones it inherited).
_LIVE: weakref.WeakSet[Handoff] = weakref.WeakSet()


class Handoff:
    """Runs ``work(item)`` for each item put, in put order, on a thread of its own
    (``name``). ``work`` must not raise (an exception is counted in ``failed``)."""

    def __init__(
        self,
        work: Callable[[Any], None],
        *,
        bound: int,
        max_block_s: float,
        name: str,
        close_timeout: float = 5.0,
        on_left: Callable[[int], None] = lambda n: None,
    ) -> None:
        if bound < 1:
            raise ValueError("bound must be at least 1")
        self._work = work
        #: How long the exit's close() drains; what it reports left over at exit.
        self.close_timeout = close_timeout
        self.on_left = on_left
        self._bound = bound
        self._max_block_s = max_block_s
        self._name = name
        self._start_lock = threading.Lock()
        self._reset()
        self._closed = False
        #: Items close() left unworked.
        self._left = 0
        #: Items ``work`` raised on (a bug of the caller's: counted, never raised).
        self.failed = 0
        _LIVE.add(self)

    def _reset(self) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: The reader's: made by the thread that starts it, handed to it at once.
        self._owner: Owner | None = None
        #: Senders waiting for room (read without the lock by the hand-over thread).
        self._waiting = 0
        self._room = threading.Condition(threading.Lock())

    @property
    def pending(self) -> int:
        """Items put and not yet worked (about: markers count too)."""
        return self._q.qsize()

    def put(self, item: Any) -> bool:
        """Queue ``item`` (any thread). False when closed, or still full after
        ``max_block_s``: the item is not queued."""
        if self._thread is None:
            if not self._start():
                return False
        elif self._closed:
            return False
        q = self._q
        if q.qsize() >= self._bound and not self._wait_for_room():
            return False
        q.put(item)
        return True

    def _wait_for_room(self) -> bool:
        deadline = time.monotonic() + self._max_block_s
        with self._room:
            self._waiting += 1
            try:
                while self._q.qsize() >= self._bound:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._closed:
                        return False
                    self._room.wait(left)
            finally:
                self._waiting -= 1
        return not self._closed

    def _start(self) -> bool:
        with self._start_lock:
            if self._closed:
                return False
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                owner = Owner(f"hand-over {self._name}")
                owner.hand_to(thread)
                self._owner = owner
                self._thread = thread
                thread.start()
        return True

    def _run(self) -> None:
        owner = self._owner
        if owner is None:  # never started: no thread may work the queue
            raise RuntimeError("the hand-over was not started")
        owner.check("work the hand-over queue")
        get, work = self._q.get, self._work
        while True:
            item = get()
            if item is _STOP:
                return
            if type(item) is _Marker:
                item.reached.set()
                continue
            try:
                work(item)
            except Exception:
                self.failed += 1
            if self._waiting:
                with self._room:
                    self._room.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait until every item put before this call was worked (any thread but the
        hand-over thread). False when ``timeout`` seconds were not enough."""
        if self._closed:
            return self._left == 0
        thread = self._thread
        if thread is None:
            return self._q.empty()  # never started (or forked): nothing was put here
        if thread is threading.current_thread():
            return False  # called from work(): the items before it wait for it
        marker = _Marker()
        self._q.put(marker)
        return marker.reached.wait(timeout)

    def close(self, timeout: float) -> int:
        """Drain (at most ``timeout`` seconds), then stop the thread; later puts are
        refused. Returns how many items were left unworked (0: all went to ``work``)."""
        if self._closed:
            return 0
        drained = self.drain(timeout)
        with self._start_lock:
            self._closed = True
            thread = self._thread
        with self._room:
            self._room.notify_all()  # senders waiting for room give up
        if thread is None:
            return 0
        if drained:
            self._q.put(_STOP)
            thread.join(max(0.1, timeout))
        # What is still queued is never worked: not drained in time, or put by a call that
        # saw the hand-over open just before this close (behind the stop). Counted.
        left = 0
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP and type(item) is not _Marker:
                left += 1
        if not drained:
            self._q.put(_STOP)
        self._left = left
        return left

    def forked(self) -> None:
        """In a forked child: the parent's queue, thread and locks are left as they were
        (kept, never freed: a lock may have been held at the fork); a fresh start."""
        _fork.bury(self._q)
        _fork.bury(self._room)
        self._start_lock = threading.Lock()
        self._reset()


def _after_fork_in_child() -> None:
    for h in list(_LIVE):
        h.forked()


def close_all() -> None:
    """Close every live hand-over, each within its ``close_timeout`` (at exit, before the
    producers they feed are closed); what one could not hand on is counted by its
    ``on_left``."""
    for h in list(_LIVE):
        h.on_left(h.close(h.close_timeout))


_fork.at_fork_in_child(_after_fork_in_child)
