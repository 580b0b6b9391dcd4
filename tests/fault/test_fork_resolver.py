"""A process forked while a thread of its parent was inside getaddrinfo() inherits
glibc's lock for it held, for ever: no librdkafka client can connect from there, and
destroying one blocks for ever (seen in CI: a gunicorn --preload worker forked while the
master's producer was connecting hung until killed, its request unanswered).

These tests make that child for real: the parent runs a thread that resolves without
pause (as librdkafka's broker threads do when they connect) and forks until a child
finds the lock held (``logsdk._resolver``). In that child the producer must not hang the
application, close() must return within its timeout, and nothing may be lost: its
records stay in its spool slot and the next producer on the spool_dir delivers them."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Literal

import pytest

from logsdk import LogConsumer, LogProducer
from logsdk._resolver import resolver_ready
from logsdk.errors import ConsumerError
from logsdk.testing import check_delivery, read_topic
from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = [pytest.mark.fault]

_RETRY = 3  # the child found the lock free: fork again


@contextmanager
def _resolving_thread() -> Iterator[None]:
    """A thread of this process calls getaddrinfo(AI_ADDRCONFIG) without pause."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            socket.getaddrinfo("127.0.0.1", 9092, flags=socket.AI_ADDRCONFIG)

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(10)


def _rand_draw() -> Callable[[], None]:
    """A call that draws once from the random generator of the OpenSSL linked into
    librdkafka, on the calling thread (a SCRAM credential made without a salt gets a
    random one)."""
    with open("/proc/self/maps") as maps:
        path = next(ln.split()[-1] for ln in maps if "/librdkafka" in ln.split()[-1])
    lib = ctypes.CDLL(path)
    new = lib.rd_kafka_UserScramCredentialUpsertion_new
    new.restype = ctypes.c_void_p
    new.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int32, ctypes.c_char_p,
                    ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]  # fmt: skip
    destroy = lib.rd_kafka_UserScramCredentialAlteration_destroy
    destroy.argtypes = [ctypes.c_void_p]
    return lambda: destroy(new(b"test", 1, 4096, b"-", 1, None, 0))


@contextmanager
def _threads_starting(count: int = 8) -> Iterator[None]:
    """``count`` threads of this process start new threads without pause, each of which
    draws once from the random generator of librdkafka's OpenSSL, as every new librdkafka
    thread does: OpenSSL's locks for a new thread's generator are taken all the time."""
    stop = threading.Event()
    draw = _rand_draw()

    def spin() -> None:
        while not stop.is_set():
            t = threading.Thread(target=draw)
            t.start()
            t.join()

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(count)]
    for t in spinners:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in spinners:
            t.join(10)


def _fork_wedged(
    fn: Callable[[], dict[str, object]],
    attempts: int = 60,
    busy: Callable[[], AbstractContextManager[None]] = _resolving_thread,
) -> dict[str, object]:
    """Fork (while ``busy``: a thread resolving) until the child finds a lock held that
    no librdkafka client can work without; run ``fn`` there and return what it returned.
    A child hung past 60 s is a failure."""
    with busy():
        for _ in range(attempts):
            r, w = os.pipe()
            with warnings.catch_warnings():
                # Python 3.12+ warns on fork() with threads running: that is the case here.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                os.close(r)
                code = 1
                try:
                    signal.alarm(60)
                    if resolver_ready():
                        code = _RETRY
                    else:
                        os.write(w, json.dumps(fn()).encode())
                        code = 0
                except BaseException:
                    import traceback

                    traceback.print_exc()
                finally:
                    os._exit(code)
            os.close(w)
            out = b""
            while chunk := os.read(r, 65536):
                out += chunk
            os.close(r)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            if code == _RETRY:
                continue
            assert code == 0, f"the wedged child failed or hung (exit {code})"
            return dict(json.loads(out))
    raise AssertionError(f"no child of {attempts} found the lock held")


@pytest.mark.parametrize("buffer", ["memory", "shm"])
def test_wedged_child_spools_closes_in_time_and_the_next_producer_delivers(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
    buffer: Literal["memory", "shm"],
) -> None:
    """A producer made in the parent (as a gunicorn --preload master's dictConfig does)
    and used in a wedged child: its 500 sends return, close(10) returns within its
    timeout with every record in the child's spool slot, and the parent's producer
    (the next on that spool_dir) delivers them: all 500 once, with the parent's own."""
    topic = fresh_topic(2)
    p = make_producer(
        kafka_broker.bootstrap_servers, topic, tmp_path, buffer=buffer, shm_bytes=1 << 20
    )
    for i in range(50):
        p.send(b"parent-%d" % i)
    assert p.flush(30) == 0

    def child() -> dict[str, object]:
        for i in range(500):
            p.send(b"child-%d" % i)
        s = p.stats()
        t0 = time.monotonic()
        p.close(10)
        return {
            "close_s": time.monotonic() - t0,
            "state": str(s["state"]),
            "id": p.producer_id,
            "slot": p.stats()["slot"],
            "spooled": p.stats()["spool_records"],
        }

    got = _fork_wedged(child)
    assert got["state"] == "DEGRADED"
    assert float(str(got["close_s"])) < 10
    assert got["spooled"] == 500
    # The child has exited: its slot is free, and the parent's flush() delivers it.
    assert p.flush(60) == 0
    p.close()
    msgs = read_topic(kafka_broker.bootstrap_servers, topic)
    rep = check_delivery(msgs)
    assert rep.missing(str(got["id"]), range(500)) == []
    assert rep.duplicates == 0
    values = [m.value() or b"" for m in msgs]
    assert sorted(values) == sorted(
        [b"parent-%d" % i for i in range(50)] + [b"child-%d" % i for i in range(500)]
    )


def test_a_child_forked_while_openssl_starts_a_thread_spools_and_closes_in_time(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
) -> None:
    """Forked while a thread of the parent held a lock of the OpenSSL linked into
    librdkafka (a new thread drawing from its random generator, as each librdkafka thread
    does once: a parent whose probes start clients while Kafka is down, say), a child's
    librdkafka threads block for ever at their first draw, and destroying its client
    blocks too. There the producer makes no client: its 500 sends return, close(10)
    returns within its timeout with every record in its slot, and the parent's producer
    delivers them. (Such a worker of a parent forking through an outage waited for ever
    in its close(), or its pump did and the records it held in memory were lost.)"""
    topic = fresh_topic(2)
    p = make_producer(kafka_broker.bootstrap_servers, topic, tmp_path)
    p.send(b"parent")
    assert p.flush(30) == 0

    def child() -> dict[str, object]:
        for i in range(500):
            p.send(b"child-%d" % i)
        s = p.stats()
        t0 = time.monotonic()
        p.close(10)
        return {
            "close_s": time.monotonic() - t0,
            "state": str(s["state"]),
            "id": p.producer_id,
            "spooled": p.stats()["spool_records"],
        }

    got = _fork_wedged(child, attempts=1000, busy=_threads_starting)
    assert got["state"] == "DEGRADED"
    assert float(str(got["close_s"])) < 10
    assert got["spooled"] == 500
    assert p.flush(60) == 0  # the child has exited: the parent delivers its slot
    p.close()
    rep = check_delivery(read_topic(kafka_broker.bootstrap_servers, topic))
    assert rep.missing(str(got["id"]), range(500)) == []


def test_wedged_child_refuses_a_consumer_with_a_clear_error(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """A consumer cannot work from a wedged process: start() says so at once rather than
    leave a client whose close() would never return."""
    topic = fresh_topic(1)

    def child() -> dict[str, object]:
        try:
            LogConsumer(kafka_broker.bootstrap_servers, "g-wedged", [topic], lambda r: None).start()
        except ConsumerError as exc:
            return {"error": str(exc)}
        return {"error": None}

    got = _fork_wedged(child)
    assert "forked while a thread of its parent was inside getaddrinfo()" in str(got["error"])


def test_a_process_not_forked_needs_no_probe() -> None:
    """The check costs nothing where no lock can have been inherited."""
    assert resolver_ready()
