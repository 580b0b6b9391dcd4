"""SQLite and ``fork()``: no thread of logsdk is inside SQLite when the process forks.

SQLite keeps process-wide mutexes: its allocator's (taken by every ``sqlite3_malloc``), its
unix VFS's list of open files. A thread inside SQLite holds one for a moment; ``fork()``
copies it, held, into the child, where no thread will ever release it, and the child's
first SQLite call (a forked producer opening its own slot) waits forever. Python's
`sqlite3` releases the GIL for every call that does such work (open, prepare, step,
reset, finalize, close), so the GIL held by the forking thread is no protection; the calls
that keep the GIL cannot be running at the fork, since the forking thread holds it.

Invariants owned here:

- every SQLite connection logsdk opens comes from `connect()` (a
  `GatedConnection`, whose cursors are `GatedCursor`); each of their methods
  that may release the GIL inside SQLite runs inside `GATE`, and so does freeing
  one that was left open (``__del__``);
- the fork hook (`logsdk._fork`) closes `GATE` and waits until no thread is
  inside before ``fork()`` (at most `FORK_WAIT_S`: past that it warns and forks);
  threads that want in meanwhile wait outside, holding no SQLite mutex; the gate opens
  again after the fork in the parent, and starts afresh in the child;
- a thread kept out waits for the fork's own wait (bounded), then at most
  `ENTRY_WAIT_S` more: after its hook the forking thread runs the other before-fork
  hooks (``logging`` takes its module lock, ``fork()`` the import lock), and a thread kept
  out may hold one of those locks (a handler closed inside ``dictConfig``); it goes in
  then (counted in ``barged``), the fork takes its lock and goes on, rather than both
  waiting for ever.

The gate's counters are shared by every thread that uses SQLite and guarded by its own
lock (a re-entrant one: a ``__del__`` run by the garbage collector inside the gate's own
code enters it again on the same thread). A thread already inside passes again without
waiting (its depth is per thread), so a nested use never waits for a fork that waits for
it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

log = logging.getLogger("logsdk")

#: How long a fork waits for the threads inside SQLite to leave it.
FORK_WAIT_S = 10.0
#: How long a thread kept out waits for the fork once the threads inside have left.
ENTRY_WAIT_S = 2.0

T = TypeVar("T")


class _Gate:
    """Shared entry for SQLite calls, exclusive for ``fork()`` (module docstring)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._inside = 0  # threads inside (each counted once, whatever its depth)
        self._forking = False
        self._drained_at: float | None = None  # when the fork's own wait ended
        self._local = threading.local()
        self.waited_out = 0  # forks that went ahead with a thread still inside
        self.barged = 0  # threads that went in while a fork was pending (ENTRY_WAIT_S)

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` inside the gate."""
        local = self._local
        with self._cond:
            depth = getattr(local, "depth", 0)
            if not depth:
                while self._forking:
                    if self._drained_at is None:
                        self._cond.wait()  # the fork's wait is bounded and notifies
                        continue
                    left = self._drained_at + ENTRY_WAIT_S - time.monotonic()
                    if left <= 0:
                        self.barged += 1
                        break
                    self._cond.wait(left)
                self._inside += 1
            local.depth = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            with self._cond:
                local.depth -= 1
                if not local.depth:
                    self._inside -= 1
                    if self._forking and not self._inside:
                        self._cond.notify_all()

    def close_for_fork(self, timeout: float = FORK_WAIT_S) -> None:
        """Stop new entries and wait until no other thread is inside (the forking thread
        itself may be: its own depth does not count)."""
        stuck = 0
        with self._cond:
            self._forking = True
            self._drained_at = None
            mine = 1 if getattr(self._local, "depth", 0) else 0
            deadline = time.monotonic() + timeout
            while self._inside > mine:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.waited_out += 1
                    stuck = self._inside - mine
                    break
                self._cond.wait(left)
            self._drained_at = time.monotonic()
            self._cond.notify_all()  # those kept out now wait ENTRY_WAIT_S at most
        if stuck:  # said outside the gate's lock: a handler may take locks of its own
            log.warning(
                "logsdk: fork() after %.0fs with %d thread(s) still inside SQLite: the "
                "child may hang at its first SQLite call",
                timeout,
                stuck,
            )

    def open_after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking = False
            self._drained_at = None
            self._cond.notify_all()

    def reset_in_child(self) -> None:
        """The child has one thread, the forking one: nobody else is inside."""
        depth = getattr(self._local, "depth", 0)
        self._reset()
        if depth:
            self._inside = 1
            self._local.depth = depth

    @property
    def inside(self) -> int:
        """Threads inside now (a moment's answer, for tests)."""
        return self._inside


GATE = _Gate()


class GatedCursor(sqlite3.Cursor):
    """A cursor whose calls into SQLite run inside `GATE`."""

    def execute(self, sql: str, parameters: Any = (), /) -> GatedCursor:
        GATE.run(super().execute, sql, parameters)
        return self

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> GatedCursor:
        GATE.run(super().executemany, sql, seq_of_parameters)
        return self

    def executescript(self, sql_script: str, /) -> GatedCursor:
        GATE.run(super().executescript, sql_script)
        return self

    def fetchone(self) -> Any:
        return GATE.run(super().fetchone)

    def fetchmany(self, size: int | None = None) -> list[Any]:
        if size is None:
            return GATE.run(super().fetchmany)
        return GATE.run(super().fetchmany, size)

    def fetchall(self) -> list[Any]:
        return GATE.run(super().fetchall)

    def __next__(self) -> Any:
        return GATE.run(super().__next__)

    def close(self) -> None:
        GATE.run(super().close)

    def __del__(self) -> None:
        # Freeing a cursor left mid-result resets its statement, in SQLite, without the GIL.
        try:  # noqa: SIM105 - no module global here: it may be gone at interpreter exit
            self.close()
        except Exception:  # a finaliser has nowhere to raise to
            pass


class GatedConnection(sqlite3.Connection):
    """A connection whose calls into SQLite run inside `GATE`; its cursors are
    `GatedCursor`."""

    def cursor(self, factory: Any = GatedCursor) -> Any:
        return super().cursor(factory)

    # What sqlite3.Connection.execute does, through a GatedCursor (since 3.11 its own
    # makes a plain Cursor, whose fetches would run outside the gate).
    def execute(self, sql: str, parameters: Any = (), /) -> GatedCursor:
        cur: GatedCursor = self.cursor()
        return cur.execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> GatedCursor:
        cur: GatedCursor = self.cursor()
        return cur.executemany(sql, parameters)

    def executescript(self, sql_script: str, /) -> GatedCursor:
        cur: GatedCursor = self.cursor()
        return cur.executescript(sql_script)

    def commit(self) -> None:
        GATE.run(super().commit)

    def rollback(self) -> None:
        GATE.run(super().rollback)

    def close(self) -> None:
        GATE.run(super().close)

    def __exit__(self, *exc: Any) -> Any:
        return GATE.run(super().__exit__, *exc)

    def backup(self, target: sqlite3.Connection, **kwargs: Any) -> None:
        GATE.run(super().backup, target, **kwargs)

    def __del__(self) -> None:
        # Freeing an open connection closes it, in SQLite, without the GIL.
        try:  # noqa: SIM105 - no module global here: it may be gone at interpreter exit
            self.close()
        except Exception:  # a finaliser has nowhere to raise to
            pass


def connect(database: str | bytes | Any, **kwargs: Any) -> GatedConnection:
    """`sqlite3.connect()` for logsdk: a `GatedConnection` (same arguments)."""
    conn = GATE.run(sqlite3.connect, database, factory=GatedConnection, **kwargs)
    assert isinstance(conn, GatedConnection)
    return conn


__all__ = ["ENTRY_WAIT_S", "FORK_WAIT_S", "GATE", "GatedConnection", "GatedCursor", "connect"]
