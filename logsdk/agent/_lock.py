"""One ``logsdk agent`` per spool root: an exclusive ``flock`` on ``<root>/agent/LOCK``,
which holds the pid of the agent that took it.

Invariants:
- the lock goes with the process (a crash, a SIGKILL free it for the next agent);
- the pid in the file only names the holder in messages; the ``flock`` is the lock;
- `agent_running()` answers for a moment, without taking the lock for longer than
  the question (a shared lock tried and dropped at once): applications use it to warn
  when no agent drains their ring.

Owner: an `AgentLock` belongs to the thread that took it (the agent's main
thread); the functions are for any thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from logsdk._fork import fork_guard
from logsdk.errors import AgentLockedError, SpoolError

AGENT_DIR = "agent"
LOCK_NAME = "LOCK"


def agent_dir(root: str | os.PathLike[str]) -> Path:
    """The agent's own directory under a spool root (its lock and its spools)."""
    return Path(root) / AGENT_DIR


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return "unknown"


class AgentLock:
    """This process's lock on a spool root's agent directory (see the module docstring)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def take(cls, root: str | os.PathLike[str], *, shared: bool = False) -> AgentLock:
        """Take the lock of ``root`` (creating ``root/agent``, mode 0700) and write this
        pid in it. Raises `AgentLockedError` naming the live holder.

        ``shared``: for applications of other users (an agent run as root with trusted
        uids), who must see that an agent runs: the directory is 0711 (entered, not
        listed) and the lock 0644 (it holds a pid); the spools in it stay 0700."""
        d = agent_dir(root)
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(d, 0o711 if shared else 0o700)
        except OSError as exc:
            raise SpoolError(f"cannot create {d}: {exc}") from exc
        with fork_guard:
            try:
                fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError as exc:
                raise SpoolError(f"cannot open the agent lock {d / LOCK_NAME}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _holder(fd)
                os.close(fd)
                raise AgentLockedError(
                    f"another logsdk agent (pid {pid}) already drains spool root {root}; "
                    "one agent per spool root"
                ) from None
        os.fchmod(fd, 0o644 if shared else 0o600)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return cls(fd)

    def release(self) -> None:
        """Drop the lock (once)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def agent_running(root: str | os.PathLike[str]) -> bool:
    """True while a live agent holds the lock of ``root`` (a moment's answer)."""
    with fork_guard:
        try:
            fd = os.open(agent_dir(root) / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False
