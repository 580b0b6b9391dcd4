"""Fork: the librdkafka clients logsdk makes, and what a forked child does first.

A librdkafka client runs threads of its own; ``fork()`` copies the client's memory into the
child but none of its threads. Destroying such a copy (what confluent-kafka does when the
Python object is freed) joins threads that do not exist in the child: the child crashes
(SIGSEGV inside ``pthread_join``) or hangs. The object need not be in use to be freed
there: a client that the parent no longer reached, waiting in a reference cycle for the
garbage collector, is freed by the child's first collection.

Invariants owned here:
- every librdkafka client logsdk makes is one of the classes below, and is known (weakly)
  while it lives;
- in a forked child, every such client alive at the fork is kept for the life of the
  process (``bury``): never destroyed, so never joined;
- the garbage collector does not run between the fork and the end of the child's hooks
  (this step, then the ones registered with ``at_fork_in_child``, in order): it is paused
  across ``fork()`` and resumed as it was, in parent and child. A producer's hook buries
  its SQLite connections and shm mapping, which a collection must not free first;
- no thread of logsdk is inside SQLite at the fork (`logsdk._sqlite`): the fork
  waits for those inside to leave and keeps the others out until it is done.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import confluent_kafka
import confluent_kafka.admin

from logsdk import _sqlite

log = logging.getLogger("logsdk")

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
#: What a forked child inherited and may never free, kept until the process ends
#: (interpreter finalisation included).
_GRAVE: list[object] = []
_gc_was_enabled = False
_CHILD_HOOKS: list[Callable[[], None]] = []
#: Objects alive that are told of a fork in the child: object -> its method's function.
_CHILD_METHODS: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def bury(obj: object) -> None:
    """Keep ``obj`` alive for the life of the process, finalisation included."""
    if obj is None:
        return
    _GRAVE.append(obj)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


class Producer(confluent_kafka.Producer):
    """confluent-kafka's Producer, known to the fork rule above."""

    __slots__ = ("__weakref__",)

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        _LIVE.add(self)


class Consumer(confluent_kafka.Consumer):
    """confluent-kafka's Consumer, known to the fork rule above."""

    __slots__ = ("__weakref__",)

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        _LIVE.add(self)


class AdminClient(confluent_kafka.admin.AdminClient):
    """confluent-kafka's AdminClient, known to the fork rule above."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        _LIVE.add(self)


#: Held while a descriptor that carries an ``flock`` is being opened and registered (a
#: spool's LOCK, a shm segment): ``fork()`` waits for it, so that no child is made between
#: the open and the registration that lets the child close its copy (see
#: ``logsdk.spool._dirlock._leave_locks_to_parent``). A flock belongs to the open file, so a
#: copy made at any instant would hold the lock the parent takes a moment later.
fork_guard = threading.Lock()


def _before_fork() -> None:
    global _gc_was_enabled
    fork_guard.acquire()
    _gc_was_enabled = gc.isenabled()
    gc.disable()
    # After the fork guard: no thread inside the gate waits for that guard, and a holder
    # of the guard that enters the gate (a finaliser) finds it open.
    _sqlite.GATE.close_for_fork()


def _after_fork_in_parent() -> None:
    _sqlite.GATE.open_after_fork_in_parent()
    fork_guard.release()
    if _gc_was_enabled:
        gc.enable()


def at_fork_in_child(fn: Callable[[], None]) -> None:
    """Run ``fn`` in every forked child, after the clients are buried and before the
    garbage collector runs again."""
    _CHILD_HOOKS.append(fn)


def call_in_child(method: Callable[[], None]) -> None:
    """Call ``method`` (an object's own bound method) in every forked child, while the
    object lives (it is not kept alive for this), after the at_fork_in_child hooks."""
    _CHILD_METHODS[method.__self__] = method.__func__  # type: ignore[attr-defined]


def _after_fork_in_child() -> None:
    _sqlite.GATE.reset_in_child()
    fork_guard.release()  # taken by _before_fork, on the thread that is this child's own
    try:
        for client in list(_LIVE):
            bury(client)
        _LIVE.clear()
        for fn in _CHILD_HOOKS:
            try:
                fn()
            except Exception:  # a bug in one hook: the others still run
                log.exception("logsdk: an after-fork hook failed")
        for obj, method in list(_CHILD_METHODS.items()):
            try:
                method(obj)
            except Exception:
                log.exception("logsdk: an after-fork hook failed")
    finally:
        if _gc_was_enabled:
            gc.enable()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
