"""Child processes of the test brokers: started from one long-lived thread, killed with
the process that started them, their output kept in a file for a failing test's report.

Invariants:
- every child gets SIGKILL when this process dies (Linux ``PR_SET_PDEATHSIG``, armed in
  the child before exec), and is started from `_spawner`'s long-lived thread, so the
  death signal is tied to the process and not to the thread that asked for the child;
- a child runs in a process group of its own, its stdout and stderr in one log file.

Used by the embedded broker (Tansu and its S3 store), Apache Kafka's nodes and the Spark
standalone cluster.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any, TypeVar

from logsdk.errors import BrokerStartError

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask the kernel to SIGKILL this child when its parent dies."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.setpgid(0, 0)


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1, chosen by the kernel (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:port (TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def port_open(port: int) -> bool:
    """True when something accepts a connection on 127.0.0.1:port within 0.5 s."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            return False
        return True


class _Spawner:
    """Starts every child from one long-lived daemon thread.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits, not
    the process: a broker restarted from a ``threading.Timer`` would be killed the
    moment the timer thread ended. Forking from a thread that lives as long as the
    process keeps the death signal tied to the process.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="logsdk-broker-spawner", daemon=True
                )
                self._thread.start()
        fut: Future[T] = Future()
        self._jobs.put((fn, fut))
        return fut.result(60)

    def _loop(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)


_spawner = _Spawner()


def spawn_logged(cmd: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with its stdout and stderr in ``log``: in a process group of its own,
    SIGKILLed by the kernel if this process dies first (forked from `_spawner`'s
    long-lived thread, so that the death signal is tied to the process)."""
    return _spawner.run(
        lambda: subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            close_fds=True,
        )
    )


class ChildProcess:
    """One child process with its output in a file, for the log tail on errors."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in wait_dead()
        self.proc = spawn_logged(cmd, env, self._log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                last = deque(f, maxlen=lines)
        except OSError:
            return ""
        return b"".join(last).decode("utf-8", "replace").rstrip()

    def terminate(self, timeout: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.alive():
            self.signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.wait_dead()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait_dead()

    def wait_dead(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._log.close()


def start_s3_server(
    port: int, bucket: str, env: dict[str, str], log_path: Path, timeout: float
) -> ChildProcess:
    """moto's S3 server on ``127.0.0.1:port`` in a child process that dies with this one,
    returned once it has created ``bucket``; `BrokerStartError` with its log's tail
    if it exits or does not answer within ``timeout`` seconds."""
    cmd = [
        sys.executable,
        "-c",
        "from moto.server import main; main()",
        "-H",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    child = ChildProcess("s3", cmd, env, log_path)
    url = f"http://127.0.0.1:{port}/{bucket}"
    deadline = time.monotonic() + timeout
    while True:
        if not child.alive():
            child.wait_dead()
            raise BrokerStartError(
                f"the S3 server (moto) exited with status {child.proc.returncode}", child.tail()
            )
        try:
            req = urllib.request.Request(url, method="PUT")
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return child
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            tail = child.tail()
            child.kill()
            raise BrokerStartError(f"the S3 server did not answer within {timeout}s", tail)
        time.sleep(0.1)
