"""Shared helpers for the test suite (the Kafka fixtures come from
logsdk.testing.pytest_plugin).

Every client or process a test starts is stopped at the end of the test, whether it
passed or failed: a client left running (its frame kept by a failure's traceback) goes
on reconnecting to a broker that is gone for the rest of the run. The factory fixtures
below (``make_producer``, ``make_consumer``, ``make_kafka_producer``,
``make_kafka_consumer``, ``spawn``) remember what they made and stop it at teardown,
before any fixture the test used (a broker, ``tmp_path``) is torn down; stopping twice is
harmless, so a test still closes what it made where closing is what it shows. Outside a
test function, use ``with`` or ``try``/``finally`` (``kafka_producer`` for a raw
producer). The raw confluent-kafka clients made here log through :data:`RDLOG`, so that
pytest captures librdkafka's lines instead of them going to the process's stderr.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from logsdk import LogConsumer, LogProducer
from logsdk.shm._segment import HEADER_SIZE, SHM_DIR, owner_alive, read_header
from logsdk.testing._settings import FAST_RECOVERY

#: Producer settings that make fault tests quick: probes and stalls on a short leash.
FAST: dict[str, Any] = FAST_RECOVERY

#: librdkafka's log lines of the raw clients the tests make (the library's own clients log
#: to ``logsdk.librdkafka``).
RDLOG = logging.getLogger("tests.librdkafka")

#: What a teardown gives a client the test left open: delivering to a broker that is
#: already gone cannot succeed, and a passing test closed it itself where that mattered.
TEARDOWN_TIMEOUT_S = 5.0


@pytest.fixture(autouse=True)
def _no_ring_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that has a ``tmp_path``: unlink the shared-memory rings whose spool dir
    is under it and whose writer is dead. A ring closed with records left is kept for the
    next producer or agent by design; a test that shows that leaves one (64 MiB of /dev/shm
    for an agent ring) behind it each run, on the developer's machine, for good."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    root = os.fsencode(request.getfixturevalue("tmp_path"))
    yield
    with contextlib.suppress(OSError), os.scandir(SHM_DIR) as entries:
        for e in entries:
            if not e.name.startswith("logsdk-"):
                continue
            # A segment may go between the listing and the look (another test unlinks it).
            with contextlib.suppress(OSError), open(e.path, "rb") as f:
                if os.fstat(f.fileno()).st_uid == os.geteuid():
                    header = f.read(HEADER_SIZE)
                    if len(header) < HEADER_SIZE:
                        continue
                    d = read_header(header).spool_dir
                    # Another test's segments are never locked, even for an instant.
                    if os.fsencode(d).startswith(root) and not owner_alive(f.fileno()):
                        os.unlink(e.path)


def wait_until(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> None:
    """Poll ``cond`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def exit_codes(pids: list[int], timeout: float) -> list[int | None]:
    """Wait for forked children: each one's exit code, None for one still running after
    ``timeout`` seconds in all (then killed), so that a child that hangs fails the test
    instead of hanging it."""
    codes: dict[int, int | None] = {}
    deadline = time.monotonic() + timeout
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    for pid in pids:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            codes[pid] = None
    return [codes[pid] for pid in pids]


class InterruptAfterProduce:
    """A producer client whose ``produce()`` hands the record to the real client, then
    raises KeyboardInterrupt: what a signal handler's exception does when it surfaces as
    the call returns. Every other attribute is the real client's."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def produce(self, *args: Any) -> None:
        self.client.produce(*args)
        raise KeyboardInterrupt

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


#: Tests of 15 s to 90 s each (`--durations`): collected first, so that the xdist workers
#: share them at the start and no worker is left alone with one at the end of a run.
_LONG_FIRST = (
    "tests/integration/test_producer_model.py::test_producer_model_long",
    "tests/fault/test_chaos.py",
    "tests/packaging/",
    "tests/integration/test_benchmarks.py",
    "tests/spark/",
)


def pytest_collection_modifyitems(items: list[Any]) -> None:
    def rank(item: Any) -> int:
        for i, prefix in enumerate(_LONG_FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(_LONG_FIRST)

    items.sort(key=rank)  # stable: the order inside each group is kept


def rdkafka_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with librdkafka's log lines routed to :data:`RDLOG` (unless it names a
    logger of its own)."""
    return {"logger": RDLOG, **config}


def close_kafka_producer(p: Producer, timeout: float = TEARDOWN_TIMEOUT_S) -> None:
    """Drop what ``p`` still holds and free its threads. ``close()`` alone waits for every
    record, up to ``message.timeout.ms``; a closed producer is left as it is."""
    with contextlib.suppress(RuntimeError):  # closed already
        # blocking=True is librdkafka's non-blocking purge (logsdk.producer._client).
        p.purge(in_queue=True, in_flight=True, blocking=True)
        p.flush(timeout)
        p.close()


@contextlib.contextmanager
def kafka_producer(config: Mapping[str, Any]) -> Iterator[Producer]:
    """A raw confluent-kafka producer, closed on the way out (also on an error)."""
    p = Producer(rdkafka_config(config))
    try:
        yield p
    finally:
        close_kafka_producer(p)


def reap(proc: subprocess.Popen[Any], group: bool = False) -> None:
    """Kill ``proc`` (and its process group with ``group``) if it still runs, wait for it
    and close its pipes."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


@pytest.fixture
def make_producer(request: pytest.FixtureRequest) -> Callable[..., LogProducer]:
    """Factory: ``make_producer(*args, **kw)`` is ``LogProducer(*args, **kw)``, closed at
    teardown (``close(TEARDOWN_TIMEOUT_S)``; one the test closed returns at once)."""

    def make(*args: Any, **kw: Any) -> LogProducer:
        p = LogProducer(*args, **kw)
        # The item's finalizers run before those of its fixtures: the broker is still up.
        request.node.addfinalizer(lambda: p.close(TEARDOWN_TIMEOUT_S))
        return p

    return make


@pytest.fixture
def make_consumer(request: pytest.FixtureRequest) -> Callable[..., LogConsumer]:
    """Factory: ``make_consumer(*args, **kw)`` is ``LogConsumer(*args, **kw)`` (not started),
    stopped at teardown (``stop()`` on a stopped consumer is harmless)."""

    def make(*args: Any, **kw: Any) -> LogConsumer:
        c = LogConsumer(*args, **kw)
        request.node.addfinalizer(lambda: c.stop(TEARDOWN_TIMEOUT_S))
        return c

    return make


@pytest.fixture
def make_kafka_producer(request: pytest.FixtureRequest) -> Callable[..., Producer]:
    """Factory of raw confluent-kafka producers (logging to :data:`RDLOG`), purged and
    closed at teardown."""

    def make(config: Mapping[str, Any]) -> Producer:
        p = Producer(rdkafka_config(config))
        request.node.addfinalizer(lambda: close_kafka_producer(p))
        return p

    return make


@pytest.fixture
def make_kafka_consumer(request: pytest.FixtureRequest) -> Callable[..., Consumer]:
    """Factory of raw confluent-kafka consumers (logging to :data:`RDLOG`), closed at
    teardown (a second close() is harmless)."""

    def make(config: Mapping[str, Any]) -> Consumer:
        c = Consumer(rdkafka_config(config))
        request.node.addfinalizer(c.close)
        return c

    return make


@pytest.fixture
def spawn(request: pytest.FixtureRequest) -> Callable[..., subprocess.Popen[Any]]:
    """Factory: ``spawn(args, **popen_kw)`` is ``subprocess.Popen(args, **popen_kw)``; the
    process (its group, with ``start_new_session=True``) is killed at teardown if it still
    runs, and its pipes closed."""

    def start(args: Any, **kw: Any) -> subprocess.Popen[Any]:
        proc: subprocess.Popen[Any] = subprocess.Popen(args, **kw)
        group = bool(kw.get("start_new_session"))
        request.node.addfinalizer(lambda: reap(proc, group))
        return proc

    return start


def assert_spool_sound(spool: Path) -> None:
    """``logsdk spool check`` finds no problem in the spool dir ``spool`` (the fault tests
    run it after each kill): integrity, rows against the gauges, no seq twice, every seq
    below the reservation, the identity in the database and in state.json agreeing."""
    from logsdk.spool._check import check_spool_dir

    result = check_spool_dir(spool)
    assert result.ok, "\n".join(result.problems)


def answered_get(port: int, rid: int, failures: list[str] | None = None) -> bool:
    """One GET of ``/?<rid>`` on a local server; True when it was answered 200 (False:
    the worker died under it). A failure is described in ``failures``: what, after how
    long, at what time.

    Waits up to 30 s for the answer (gunicorn's own worker timeout): when every worker
    recycles at once, a request waits in the listen queue while they deliver at exit
    (``close_timeout`` 5 s) and their replacements import the app; CI once saw 1 of 3000
    requests unanswered within 10 s, with all three workers recycled in the same second."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", f"/?{rid}")
        status = conn.getresponse().status
        what = f"status {status}"
    except (OSError, http.client.HTTPException) as exc:
        status, what = 0, repr(exc)
    finally:
        conn.close()
    if status != 200 and failures is not None:
        took = time.monotonic() - t0
        failures.append(f"rid {rid}: {what} after {took:.1f}s, at {time.strftime('%H:%M:%S')}")
    return status == 200


def docs_hook(name: str) -> ModuleType:
    """The MkDocs hook ``docs/hooks/<name>.py``, imported on its own (as mkdocs.yml loads it)."""
    path = Path(__file__).resolve().parents[1] / "docs" / "hooks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
