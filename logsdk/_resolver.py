"""Whether librdkafka can work in this process: resolve broker addresses, start threads.

Two process-wide locks that ``fork()`` does not reset stop every librdkafka client of a
process forked while a thread of its parent held one of them:

- glibc's resolver lock. librdkafka resolves every broker address with
  ``getaddrinfo(AI_ADDRCONFIG)``, and glibc runs that flag's interface lookup
  (``__check_pf``) under a lock: held at the fork (a librdkafka broker thread connecting,
  or any thread resolving a name), every client's broker threads block for ever in their
  first connection;
- the lock OpenSSL (linked into librdkafka) takes when a thread first draws from its
  random generator, and again when such a thread ends: every librdkafka thread draws once,
  for its backoff jitter, so a parent whose clients start or stop threads (a probe's
  client, made and destroyed every few seconds while Kafka is down) holds it now and
  then. Held at the fork, every new librdkafka thread of the child blocks for ever at its
  first jitter (seen in a parent forking workers through an outage: 1 worker in 120-180).

Either way, destroying such a client blocks its caller for ever (it joins those threads):
a forked worker's close() waited for ever, or its pump did and the records it held in
memory were lost with the process.

Invariants owned here:
- in a process that was not forked, the answer is always yes, at no cost;
- in a forked process, one probe thread (per process) asks getaddrinfo for "127.0.0.1"
  with ``AI_ADDRCONFIG | AI_NUMERICHOST`` (no DNS involved, so only that lock can hold
  it), then draws from librdkafka's OpenSSL random generator on its own, fresh, thread
  (the one exported call that does so on its caller's thread: a SCRAM credential made
  without a salt gets a random one); the answer is no while it has not returned. A probe
  that returns late (a slow machine, not a held lock) turns the answer back to yes.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import socket
import threading
from collections.abc import Callable

from logsdk._fork import at_fork_in_child

log = logging.getLogger("logsdk")

#: How long the first check in a forked process waits for its probe (a healthy one
#: returns in well under a millisecond).
PROBE_WAIT_S = 2.0

_forked = False
_lock = threading.Lock()
_probe: threading.Event | None = None
_said = False
#: What the probe thread waits in now (published: for the error it logs).
_waiting_in = "getaddrinfo()"


def _rand_draw() -> Callable[[], None] | None:
    """A call that draws from the random generator of the OpenSSL linked into librdkafka,
    on the calling thread; None where there is none to call (a librdkafka without it).
    Made here, in the process that imports logsdk (not in a forked child: a library
    loaded there could wait on the loader's lock, held at the fork too)."""
    with contextlib.suppress(OSError, StopIteration, AttributeError):
        with open("/proc/self/maps") as maps:  # confluent-kafka has loaded it already
            # address perms offset dev inode path (a path may hold spaces)
            paths = (ln.split(maxsplit=5)[-1].rstrip("\n") for ln in maps)
            path = next(p for p in paths if os.path.basename(p).startswith("librdkafka"))
        lib = ctypes.CDLL(path)
        new = lib.rd_kafka_UserScramCredentialUpsertion_new
        new.restype = ctypes.c_void_p
        new.argtypes = [
            ctypes.c_char_p, ctypes.c_int, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t,
            ctypes.c_char_p, ctypes.c_size_t,
        ]  # fmt: skip
        destroy = lib.rd_kafka_UserScramCredentialAlteration_destroy
        destroy.restype = None
        destroy.argtypes = [ctypes.c_void_p]

        def draw() -> None:
            # SHA-256 (1), 4096 iterations, no salt: librdkafka draws a 64-byte one.
            destroy(new(b"logsdk", 1, 4096, b"-", 1, None, 0))

        return draw
    return None


_RAND_DRAW = _rand_draw()


def _after_fork_in_child() -> None:
    global _forked, _lock, _probe, _said, _waiting_in
    _forked = True
    _lock = threading.Lock()
    _probe = None
    _said = False
    _waiting_in = "getaddrinfo()"


at_fork_in_child(_after_fork_in_child)


def _run_probe(done: threading.Event) -> None:
    global _waiting_in
    with contextlib.suppress(OSError):  # an error is an answer too: the lock was free
        socket.getaddrinfo("127.0.0.1", None, flags=socket.AI_ADDRCONFIG | socket.AI_NUMERICHOST)
    if _RAND_DRAW is not None:
        _waiting_in = "OpenSSL's random generator in librdkafka"
        _RAND_DRAW()
    done.set()
    if _said:
        log.warning(
            "logsdk: the resolver of process %d answered after all; Kafka clients are "
            "created here again",
            os.getpid(),
        )


def resolver_ready() -> bool:
    """True when librdkafka can work in this process (see the module docstring).

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
            "logsdk: process %d was forked while a thread of its parent was inside %s; "
            "its lock stays held here, so no Kafka client can work from this process. Its "
            "records go to its spool slot, which the next producer on the same spool_dir "
            "delivers once this process has exited. Create producers after the fork "
            "(gunicorn: without --preload, or in post_fork) or fork before threads start.",
            os.getpid(),
            _waiting_in,
        )
    return False
