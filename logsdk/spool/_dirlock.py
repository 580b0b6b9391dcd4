"""A spool dir's lock and its files' ownership: one live producer per directory, and only
this user's files in it.

Invariants:
- a live producer holds its directory through an exclusive ``flock`` on ``LOCK``
  (`DirLock`): the kernel drops it when the process ends (a crash, a SIGKILL), so a
  dead producer never blocks the next one; ``LOCK`` holds the pid of the last process
  that took it (what ``logsdk spool status`` shows), never trusted as the lock itself;
- a forked child closes its copies of the descriptors that hold its parent's locks
  (`_leave_locks_to_parent()`), so a parent's slot is freed when the parent dies, for
  as long as the child lives; the descriptor is opened and registered under
  ``logsdk._fork.fork_guard``, so no child is made in between;
- a spool dir and the files in it are this user's and not writable by anyone else
  (`check_private()`): records in them are sent to Kafka with this process's
  credentials.

Owner: a `DirLock` belongs to the spool that took it (its owning thread takes and
releases it); the registry of held locks is read and cleared only in a forked child,
before any other thread exists there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import weakref
from pathlib import Path

from logsdk._fork import at_fork_in_child, fork_guard
from logsdk.errors import SpoolError, SpoolLockedError

LOCK_NAME = "LOCK"


class DirLock:
    """This process's exclusive ``flock`` on a spool dir's ``LOCK`` (see the module
    docstring). Take it with `take()`; `release()` drops it."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def take(cls, directory: Path) -> DirLock:
        """Lock ``directory`` for this process and write its pid in ``LOCK``. Raises
        `SpoolLockedError` while another live process holds it."""
        path = directory / LOCK_NAME
        with fork_guard:  # no child may copy the descriptor before _HELD knows it
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError as exc:
                raise SpoolError(f"cannot open the spool lock {path}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                finally:
                    os.close(fd)
                raise SpoolLockedError(
                    f"spool dir {directory} is in use by another LogProducer (pid "
                    f"{owner}); give each producer its own spool_dir"
                ) from None
            lock = cls(fd)
            _HELD.add(lock)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return lock

    def release(self) -> None:
        """Drop the lock (once; later calls do nothing)."""
        _HELD.discard(self)
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def forget_in_child(self) -> None:
        """In a forked child: close this process's copy of the descriptor, which leaves
        the lock to the parent (see `_leave_locks_to_parent()`)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def lock_pid(directory: Path) -> int | None:
    """The pid the producer that last took the lock of ``directory`` wrote in ``LOCK``
    (None: none, or not readable). The lock itself is never tried: a producer starting in
    that instant would fail to take it."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        pid = int(os.read(fd, 32).decode(errors="replace").strip() or "0")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return pid if pid > 0 else None


#: Every spool dir lock held in this process.
_HELD: weakref.WeakSet[DirLock] = weakref.WeakSet()


def _leave_locks_to_parent() -> None:
    """In a forked child: close this process's copies of the descriptors that hold the
    parent's spool locks. A ``flock`` belongs to the open file, which fork shares with the
    child: left open here, the parent's slot stays locked after the parent dies, for as
    long as the child lives (a helper that never logs); unlocked here, it would be freed
    under the live parent. Closing the child's copy does neither: the lock ends with the
    parent. The child's inherited spools are never used again (a producer starts afresh
    in a child, on a slot of its own)."""
    for lock in list(_HELD):
        lock.forget_in_child()
    _HELD.clear()


at_fork_in_child(_leave_locks_to_parent)


def check_private(path: Path, missing_ok: bool = False, *, directory: bool = False) -> None:
    """Refuse a spool dir or file another user could have written: owned by someone else,
    writable by group or others, or (a file inside) a symbolic link or not a regular file.
    Records in it are sent to Kafka with this process's credentials. The spool dir itself
    may be a symbolic link (to a volume): what it points to is checked."""
    try:
        st = os.stat(path) if directory else os.lstat(path)
    except FileNotFoundError:
        if missing_ok:
            return
        raise SpoolError(f"{path} does not exist") from None
    except OSError as exc:
        raise SpoolError(f"cannot look at {path}: {exc}") from exc
    if directory and not stat.S_ISDIR(st.st_mode):
        raise SpoolError(f"spool dir {path} is not a directory")
    if not directory and not stat.S_ISREG(st.st_mode):
        raise SpoolError(
            f"{path} is a symbolic link or not a regular file: logsdk never follows links "
            "inside a spool dir; remove it"
        )
    if st.st_uid != os.geteuid():
        raise SpoolError(
            f"{path} is owned by uid {st.st_uid}, not by this process (uid {os.geteuid()}): "
            "another user could have written the records it would send; use a directory "
            "of your own (logsdk creates it, mode 0700)"
        )
    if st.st_mode & 0o022:
        raise SpoolError(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"another user could plant records in it; chmod go-w {path}, or let logsdk "
            "create a directory of its own (mode 0700)"
        )
