"""A producer among processes: fork and exit.

Each engine (`logsdk.producer._engine`) handles its own fork and exit; this module
only keeps the registries that reach them, and runs the hooks.

Invariants owned here:
- every engine alive in this process is told when a child is forked (``Engine.forked``:
  it starts afresh there at its first use, and what it inherited from the parent is never
  used, closed or freed in the child: the parent's records stay the parent's);
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
import time
import weakref
from typing import Any, Protocol

from logsdk._fork import at_fork_in_child

log = logging.getLogger("logsdk.producer")


class Live(Protocol):
    """What the hooks ask of an engine alive in this process."""

    def forked(self) -> None:
        """A child was just forked (one thread runs): the parent's state is the parent's."""

    def left_open(self) -> bool:
        """It delivers a process's own records and no one closed it yet."""

    def close_left_open(self, deadline: float) -> None:
        """Close it at exit, by ``deadline``, saying so."""


class Closable(Protocol):
    """What an adapter hands over to be closed when the process leaves."""

    def close(self, timeout: float | None = ...) -> None:
        """Deliver within ``timeout`` seconds, then stop."""


#: Every engine not yet closed: a forked child tells each of them, and the exit closes
#: those left open.
_LIVE: weakref.WeakSet[Live] = weakref.WeakSet()
#: Seconds the producers still open at exit (none of an adapter's) share to deliver.
OPEN_AT_EXIT_TIMEOUT_S = 5.0
#: Producers closed when the process leaves, with the timeout each delivers within.
_AT_EXIT: weakref.WeakKeyDictionary[Closable, float] = weakref.WeakKeyDictionary()
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


def live(engine: Live) -> None:
    """``engine`` runs in this process until `gone()` (its start, and its new start in
    a forked child): told of forks, closed at exit if left open."""
    _LIVE.add(engine)
    hook_exit()


def gone(engine: Live) -> None:
    """``engine`` is closed: nothing to tell it any more."""
    _LIVE.discard(engine)


def _after_fork_in_child() -> None:
    for engine in list(_LIVE):
        engine.forked()


at_fork_in_child(_after_fork_in_child)


def leaving() -> bool:
    """True once this process's exit hook (`_close_all_at_exit()`) has begun: what is
    sent from then on is sent after logsdk closed its producers (another exit hook's)."""
    return _leaving_in == os.getpid()


def _close_all_at_exit() -> None:
    global _leaving_in
    _leaving_in = os.getpid()
    # What OpenTelemetry's global provider still holds goes to its exporters first.
    otel = sys.modules.get("logsdk.integrations.otel")
    if otel is not None:
        try:
            otel.flush_at_exit()
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
    # lost with the process. Closed within one shared budget, and said so.
    left = [e for e in list(_LIVE) if e.left_open()]
    if not left:
        return
    deadline = time.monotonic() + OPEN_AT_EXIT_TIMEOUT_S
    for e in left:
        try:
            e.close_left_open(deadline)
        except Exception:
            log.exception("logsdk: closing a producer at exit failed")


def hook_exit() -> None:
    """Run `_close_all_at_exit()` when this process leaves: at interpreter exit, and at
    the end of a multiprocessing or billiard child (every engine's start calls it, and
    again its new start in a forked child)."""
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


def close_at_exit(producer: Closable, timeout: float) -> None:
    """Close ``producer`` (delivering for at most ``timeout`` seconds) when the process
    leaves: at interpreter exit, and at the end of a process that multiprocessing or
    billiard (Celery's pool) started (the adapters hand their producers over here). Hooked
    again in a forked child at its first use."""
    _AT_EXIT[producer] = timeout
    hook_exit()
