"""One owner per piece of mutable state: a thread, checked while tests run.

An object whose state one thread owns holds an `Owner` and calls
`Owner.check()` at the top of every method another thread must not call. With the
debug switch on (``LOGSDK_CHECK_OWNERS=1`` in the environment, or `enable()`), a call
from any other thread raises [`OwnershipError`][logsdk.errors.OwnershipError] at once, naming both
threads, and is kept in `violations()` (a violation on a background thread, whose
exception that thread may catch and log, still fails the test that caused it: the pytest
plugin looks at the list after each test). With it off (production), ``check`` is one
function call and a test of a module global.

Ownership moves only by `Owner.hand_to()`, called by the owner itself (the thread
that built an object hands it to the thread that will run it), or by
`Owner.take()` once the owner has ended (``close()`` takes the spool after it joined
the pump). The model is Chromium's ``SEQUENCE_CHECKER``: free in production, an immediate
failure naming both threads in tests.

The switch is read once, at import, from the environment (so that child processes started
by a test inherit it); `enable()` turns it on in this process and its children later.
A forked child gets a lock of its own for the list of violations (a thread of the parent
may have held the parent's at the fork).
"""

from __future__ import annotations

import logging
import os
import threading
import traceback

from logsdk import _fork
from logsdk.errors import OwnershipError

__all__ = ["ENV", "Owner", "checking", "enable", "violations"]

#: The environment variable that turns the checks on ("1"); off when unset, "" or "0".
ENV = "LOGSDK_CHECK_OWNERS"

log = logging.getLogger("logsdk.owner")

_checking = os.environ.get(ENV, "") not in ("", "0")
_violations: list[str] = []
_violations_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _violations_lock
    _violations_lock = threading.Lock()


_fork.at_fork_in_child(_after_fork_in_child)


def checking() -> bool:
    """True when ownership is checked in this process."""
    return _checking


def enable(on: bool = True) -> None:
    """Turn the checks on (or off) in this process and in the processes it starts."""
    global _checking
    _checking = on
    if on:
        os.environ[ENV] = "1"
    else:
        os.environ.pop(ENV, None)


def violations(clear: bool = False) -> list[str]:
    """The violations seen in this process so far (oldest first); ``clear`` empties the list."""
    with _violations_lock:
        out = list(_violations)
        if clear:
            _violations.clear()
    return out


def _name(thread: threading.Thread) -> str:
    return f"{thread.name!r} (ident {thread.ident})"


class Owner:
    """The thread that owns one piece of state (see the module docstring).

    ``what`` names the state in messages (``"spool /path/slots/1"``). The owner is the
    thread that builds the Owner, until it hands it on.
    """

    __slots__ = ("_thread", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self._thread = threading.current_thread()

    @property
    def thread(self) -> threading.Thread:
        """The owning thread."""
        return self._thread

    def check(self, op: str) -> None:
        """Raise [`OwnershipError`][logsdk.errors.OwnershipError] when checking is on and the
        calling thread does not own this state; ``op`` names what it tried."""
        if _checking:
            current = threading.current_thread()
            if current is not self._thread:
                self._violation(current, op)

    def hand_to(self, thread: threading.Thread) -> None:
        """Make ``thread`` the owner. Only the owner may hand its state on (or any thread,
        once the owner has ended: see `take()`)."""
        if _checking:
            current = threading.current_thread()
            if current is not self._thread and self._thread.is_alive():
                self._violation(current, f"hand it to {_name(thread)}")
        self._thread = thread

    def take(self) -> None:
        """Make the calling thread the owner: the owner must have ended (or be it)."""
        self.hand_to(threading.current_thread())

    def _violation(self, current: threading.Thread, op: str) -> None:
        # The calls that led here: the caller of check() first, then its callers.
        where = " <- ".join(
            f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})"
            for f in reversed(traceback.extract_stack(limit=5)[:-2])
        )
        text = (
            f"{self.what}: thread {_name(current)} tried to {op}, but it is owned by thread "
            f"{_name(self._thread)}{'' if self._thread.is_alive() else ' (ended)'}; at {where}"
        )
        with _violations_lock:
            _violations.append(text)
        log.error("ownership violation: %s", text)
        raise OwnershipError(text)

    def __repr__(self) -> str:
        return f"Owner({self.what!r}, thread={_name(self._thread)})"
