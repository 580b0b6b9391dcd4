"""Whether librdkafka can resolve broker addresses in this process.

librdkafka resolves every broker address with ``getaddrinfo(AI_ADDRCONFIG)``. glibc runs
that flag's interface lookup (``__check_pf``) under a process-wide lock that ``fork()``
does not reset: a process forked while another thread of its parent held it (a
librdkafka broker thread connecting, or any thread resolving a name) can never take it.
There, every client's broker threads block for ever in their first connection, and
destroying such a client blocks its caller for ever (it joins those threads).

Invariants owned here:
- in a process that was not forked, the answer is always yes, at no cost;
- in a forked process, one probe thread (per process) asks getaddrinfo for "127.0.0.1"
  with ``AI_ADDRCONFIG | AI_NUMERICHOST`` (no DNS involved, so only that lock can hold
  it); the answer is no while it has not returned. A probe that returns late (a slow
  machine, not a held lock) turns the answer back to yes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading

from logsdk._fork import at_fork_in_child

log = logging.getLogger("logsdk")

#: How long the first check in a forked process waits for its probe (a healthy one
#: returns in well under a millisecond).
PROBE_WAIT_S = 2.0

_forked = False
_lock = threading.Lock()
_probe: threading.Event | None = None
_said = False


def _after_fork_in_child() -> None:
    global _forked, _lock, _probe, _said
    _forked = True
    _lock = threading.Lock()
    _probe = None
    _said = False


at_fork_in_child(_after_fork_in_child)


def _run_probe(done: threading.Event) -> None:
    with contextlib.suppress(OSError):  # an error is an answer too: the lock was free
        socket.getaddrinfo("127.0.0.1", None, flags=socket.AI_ADDRCONFIG | socket.AI_NUMERICHOST)
    done.set()
    if _said:
        log.warning(
            "logsdk: the resolver of process %d answered after all; Kafka clients are "
            "created here again",
            os.getpid(),
        )


def resolver_ready() -> bool:
    """True when librdkafka can resolve broker addresses in this process.

    Always True in a process that was not forked. In a forked process the first call
    (from whichever thread) starts the probe and waits up to ``PROBE_WAIT_S`` for it;
    later calls do not wait. The first False is logged as an error, with what to do.
    """
    global _probe, _said
    if not _forked:
        return True
    with _lock:
        probe = _probe
        first = probe is None
        if probe is None:
            probe = _probe = threading.Event()
            threading.Thread(
                target=_run_probe, args=(probe,), name="logsdk-resolver-check", daemon=True
            ).start()
    if probe.wait(PROBE_WAIT_S if first else 0):
        return True
    with _lock:
        say, _said = not _said, True
    if say:
        log.error(
            "logsdk: process %d was forked while a thread of its parent was inside "
            "getaddrinfo(); glibc's lock for it stays held here, so no Kafka client can "
            "connect from this process. Its records go to its spool slot, which the next "
            "producer on the same spool_dir delivers once this process has exited. Create "
            "producers after the fork (gunicorn: without --preload, or in post_fork) or "
            "fork before threads start.",
            os.getpid(),
        )
    return False
