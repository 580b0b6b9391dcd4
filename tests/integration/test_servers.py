"""Multi-process services, started as a user starts them: gunicorn (sync workers recycled
by --max-requests, with and without --preload), uvicorn --workers, a Celery prefork
worker, multiprocessing pools (fork and spawn). One logging configuration, one spool_dir
for every process (examples/servers/); every log line is counted in Kafka.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Message

from logsdk import LogProducer
from logsdk.spool._check import check_spool_dir
from logsdk.testing import EmbeddedBroker, create_topic, free_port, read_topic
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import answered_get, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVERS = Path(__file__).resolve().parents[2] / "examples" / "servers"
BIN = Path(sys.executable).parent


def _env(bootstrap: str, topic: str, spool: Path, buffer: str = "memory") -> dict[str, str]:
    return {
        **os.environ,
        "LOGSDK_BOOTSTRAP": bootstrap,
        "LOGSDK_TOPIC": topic,
        "LOGSDK_SPOOL_DIR": str(spool),
        "LOGSDK_BUFFER": buffer,
        "PYTHONPATH": str(SERVERS),
        # gunicorn 27's control socket goes here, not to one shared ~/.gunicorn/gunicorn.ctl
        # that the servers of tests running at once would take from each other.
        "XDG_RUNTIME_DIR": str(spool.parent),
    }


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited early: {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port} after {timeout}s")


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> float:
    """SIGTERM, wait; the seconds it took to exit (it must exit 0)."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"did not exit within {timeout}s of SIGTERM") from None
    assert code == 0, f"exit status {code}"
    return time.monotonic() - t0


def _rid(m: Message) -> str:
    """The rid of a request log line; '' for any other record."""
    doc = json.loads(m.value() or b"")
    if not doc.get("message", "").startswith("request "):
        return ""
    return str(doc["extra"]["rid"])


def _rids(bootstrap: str, topic: str) -> list[str]:
    """The rid of every request log line in the topic (duplicates kept)."""
    return [rid for m in read_topic(bootstrap, topic, timeout=60) if (rid := _rid(m))]


@pytest.fixture
def server() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, env=env, cwd=SERVERS, start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("preload", [False, True], ids=["workers", "preload"])
def test_gunicorn_recycled_workers_deliver_every_line(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    tmp_path: Path,
    server: Callable[..., subprocess.Popen[bytes]],
    preload: bool,
) -> None:
    """gunicorn, 3 sync workers recycled every ~150 requests, one dictConfig and one
    spool_dir: 3000 requests each log their id; after SIGTERM every id is in Kafka, and
    gunicorn exited well within its graceful timeout (20 s). A recycled worker lives about
    0.5 s here, less than its client takes to get its idempotent producer id from the
    embedded broker: most leave with every record still in flight (seen: acked 0 of
    ~160 at exit), so this is their exit delivering, about 20 times a run."""
    topic = fresh_topic(3)
    port = free_port()
    cmd = [str(BIN / "gunicorn"), "-w", "3", "--max-requests", "150",
           "--max-requests-jitter", "30", "--graceful-timeout", "20",
           "-b", f"127.0.0.1:{port}", "wsgi_app:app"]  # fmt: skip
    if preload:
        cmd.insert(1, "--preload")
    proc = server(cmd, _env(kafka_broker.bootstrap_servers, topic, tmp_path / "spool"))
    _wait_port(port, proc)
    failures: list[str] = []
    answered = [rid for rid in range(3000) if answered_get(port, rid, failures)]
    took = _stop(proc, 30)
    assert len(answered) == 3000, failures
    assert took < 10, took
    got = _rids(kafka_broker.bootstrap_servers, topic)
    assert set(got) == {str(r) for r in range(3000)}
    slots = os.listdir(tmp_path / "spool" / "slots")
    assert len(slots) <= 8, slots  # bounded by the peak of live processes, not by recycling


def test_gunicorn_worker_sigkilled_with_shm_loses_no_answered_line(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    tmp_path: Path,
    server: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """buffer="shm": one worker SIGKILLed mid-run; the worker gunicorn starts in its place
    (or another producer on the spool dir) takes its slot over and delivers what its ring
    held. Every line whose request was answered is in Kafka."""
    topic = fresh_topic(3)
    port = free_port()
    cmd = [str(BIN / "gunicorn"), "-w", "3", "--graceful-timeout", "20",
           "-b", f"127.0.0.1:{port}", "wsgi_app:app"]  # fmt: skip
    proc = server(cmd, _env(kafka_broker.bootstrap_servers, topic, tmp_path / "spool", "shm"))
    _wait_port(port, proc)
    answered = []

    def children() -> list[str]:
        found = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        return found.stdout.split()

    # gunicorn listens before it forks its workers: wait for all three.
    wait_until(lambda: len(children()) == 3, 30, "gunicorn's three workers")
    workers = children()
    for rid in range(2000):
        if rid == 1000:
            os.kill(int(workers[0]), signal.SIGKILL)
        if answered_get(port, rid):
            answered.append(rid)
    _stop(proc, 30)
    assert len(answered) >= 1990
    got = set(_rids(kafka_broker.bootstrap_servers, topic))
    missing = [r for r in answered if str(r) not in got]
    assert missing == []


def test_uvicorn_workers_deliver_every_line(
    broker_factory: Callable[..., EmbeddedBroker],
    tmp_path: Path,
    server: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """uvicorn --workers 2 (spawned processes, each configuring logging at import): 1000
    requests, then 200 more while the broker is paused (their lines wait in the workers'
    memory); uvicorn gets SIGTERM, the broker resumes 1 s later: the workers' lifespan
    shutdown delivers, and every line is in Kafka."""
    broker = broker_factory()
    topic = create_topic(broker.bootstrap_servers, "uvicorn", 2)
    port = free_port()
    cmd = [str(BIN / "uvicorn"), "--workers", "2", "--port", str(port), "--log-level",
           "warning", "--timeout-graceful-shutdown", "20", "asgi_app:app"]  # fmt: skip
    proc = server(cmd, _env(broker.bootstrap_servers, topic, tmp_path / "spool"))
    _wait_port(port, proc)
    failures: list[str] = []
    answered = [rid for rid in range(1000) if answered_get(port, rid, failures)]
    broker.pause()
    try:
        answered += [rid for rid in range(1000, 1200) if answered_get(port, rid, failures)]
        # SIGTERM while their lines wait; the broker is back 1 s later, while the
        # workers' shutdown (the handler's close) still waits for Kafka.
        threading.Timer(1.0, broker.resume).start()
        took = _stop(proc, 30)
    finally:
        if broker.is_paused:
            broker.resume()
    assert len(answered) == 1200, failures
    assert took < 10, took
    assert set(_rids(broker.bootstrap_servers, topic)) == {str(r) for r in range(1200)}


def _run_pool_script(
    kafka: KafkaTarget, topic: str, tmp_path: Path, method: str, *pool: int, sleep: float
) -> int:
    """Run ``_POOL`` as a user's script: start ``method``; ``pool`` is processes, tasks,
    chunksize, maxtasksperchild (0: none); each task logs its line, then sleeps ``sleep``
    seconds. It must exit 0. Returns how many worker processes ran tasks."""
    script = tmp_path / "pool_app.py"
    script.write_text(_POOL)
    env = {
        **_env(kafka.bootstrap_servers, topic, tmp_path / "spool"),
        "SERVERS": str(SERVERS),
        "TASK_SLEEP": str(sleep),
    }
    out = subprocess.run(
        [sys.executable, str(script), method, *map(str, pool)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    _POOL_RUN[tmp_path] = (out.stderr, json.loads(out.stdout))
    return len(set(_POOL_RUN[tmp_path][1]))


#: The pool script's run by test dir: its stderr (logsdk's own warnings and each worker's
#: figures at its exit, of every process of it) and the pid that ran each task.
_POOL_RUN: dict[Path, tuple[str, list[int]]] = {}


def _missing_lines(bootstrap: str, topic: str, tmp_path: Path, n: int) -> str:
    """'' when lines 0..n-1 are all in the topic; else which are not, and what tells where
    they went: the worker that logged each, what each worker's producer counted at its
    exit, the offsets read (a hole is a batch the broker acknowledged and does not serve),
    whether a second read finds them, and what the spool dir holds."""
    want = {str(r) for r in range(n)}
    messages = read_topic(bootstrap, topic, timeout=60)
    missing = sorted(want - {_rid(m) for m in messages}, key=int)
    if not missing:
        return ""
    stderr, pids = _POOL_RUN.get(tmp_path, ("", []))
    by_worker: dict[int, list[int]] = {}
    for rid in map(int, missing):
        by_worker.setdefault(pids[rid] if rid < len(pids) else -1, []).append(rid)
    offsets: dict[int, list[int]] = {}
    for m in messages:
        offsets.setdefault(m.partition() or 0, []).append(m.offset() or 0)
    holes = {}
    for p, o in offsets.items():
        o.sort()
        holes[p] = [(a, b) for a, b in itertools.pairwise(o) if b != a + 1][:10]
    time.sleep(2)  # not a wait for anything: does a later read find them?
    try:
        again: object = len(set(missing) - {_rid(m) for m in read_topic(bootstrap, topic)})
    except Exception as exc:  # the diagnosis must not hide the failure
        again = f"(not read: {exc})"
    held = {s.slot: s.records for s in check_spool_dir(tmp_path / "spool").slots}
    return (
        f"{len(missing)} line(s) not in Kafka: {missing[:50]}; by the worker that logged "
        f"them: { {w: (len(r), r[:5]) for w, r in by_worker.items()} }; offsets read per "
        f"partition: { {p: (len(o), min(o), max(o)) for p, o in offsets.items()} }, holes: "
        f"{holes}; still missing 2 s later: {again}; spool slots' records: {held}; "
        f"the script's stderr (workers' figures at exit, logsdk's warnings):\n{stderr[-6000:]}"
    )


_POOL = textwrap.dedent(
    """
    import json, logging, multiprocessing, multiprocessing.util, os, sys, time
    sys.path.insert(0, os.environ["SERVERS"])
    from logging_setup import configure
    configure()  # module level: the parent, and each spawned child as it imports this
    log = logging.getLogger("task")
    SLEEP = float(os.environ["TASK_SLEEP"])

    def figures():
        # After logsdk's own exit hook (priority 10) has closed the handler's producer:
        # what it counted, for a failure's diagnosis.
        for h in logging.getLogger().handlers:
            if hasattr(h, "producer"):
                s = h.producer.stats()
                keep = ("producer_id", "slot", "state", "sent", "acked", "spooled",
                        "replayed", "dropped", "buffered", "spool_records", "unconfirmed_acks",
                        "possible_duplicates", "transitions", "drained", "errors")
                line = json.dumps({k: s.get(k) for k in keep}, default=str)
                # one write: the workers share the stderr pipe
                who = "parent" if multiprocessing.parent_process() is None else "worker"
                os.write(2, f"{who} {os.getpid()} handler dropped {h.dropped} {line}\\n".encode())

    def init():
        multiprocessing.util.Finalize(None, figures, exitpriority=5)

    def task(i):
        log.info("request %d", i, extra={"rid": str(i)})
        time.sleep(SLEEP)
        return os.getpid()

    if __name__ == "__main__":
        method, processes, tasks, chunksize, per_child = sys.argv[1:]
        init()  # the parent's figures too (its producer drains slots workers left)
        ctx = multiprocessing.get_context(method)
        pool = ctx.Pool(int(processes), init, maxtasksperchild=int(per_child) or None)
        pids = pool.map(task, range(int(tasks)), chunksize=int(chunksize))
        pool.close()
        pool.join()
        print(json.dumps(pids))
    """
)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_pool_delivers_every_task_line(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path, method: str
) -> None:
    """multiprocessing.Pool(4) with fork, spawn and forkserver (the default on Linux from
    Python 3.14), tasks logging through a handler set up at module level: every one of
    1000 task lines arrives. A forkserver child leaves through ``os._exit`` (no atexit
    before Python 3.13)."""
    topic = fresh_topic(2)
    # 3 ms a task: long enough that every worker of the pool gets tasks
    workers = _run_pool_script(kafka_broker, topic, tmp_path, method, 4, 1000, 10, 0, sleep=0.003)
    assert workers >= 2  # the tasks really ran in several processes
    problem = _missing_lines(kafka_broker.bootstrap_servers, topic, tmp_path, 1000)
    assert not problem, problem


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_pool_worker_that_leaves_right_after_its_task_delivers_its_line(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path, method: str
) -> None:
    """Pool workers that each run one task (``maxtasksperchild=1``) and leave at once, the
    task's line still in flight: each worker's exit delivers it. A spawned or forkserver
    child imports the module (the handler registers its exit hook) before its bootstrap
    empties multiprocessing's exit registry; forkserver children then leave through
    ``os._exit`` (before the fix, 0 of 40 lines arrived on Python 3.10 and 3.12)."""
    topic = fresh_topic(2)
    # each worker's line is still in flight as it leaves
    workers = _run_pool_script(kafka_broker, topic, tmp_path, method, 3, 6, 1, 1, sleep=0)
    assert workers == 6  # a process for each task
    problem = _missing_lines(kafka_broker.bootstrap_servers, topic, tmp_path, 6)
    assert not problem, problem


def test_celery_prefork_worker_delivers_every_task_line(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    tmp_path: Path,
    server: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """A Celery prefork worker (2 children; kombu's filesystem transport) runs 500 tasks
    that log; after a warm shutdown (SIGTERM) every task's line is in Kafka."""
    topic = fresh_topic(2)
    data = tmp_path / "celery"
    (data / "done").mkdir(parents=True)
    env = {
        **_env(kafka_broker.bootstrap_servers, topic, tmp_path / "spool"),
        "CELERY_DATA": str(data),
    }
    send = subprocess.run(
        [sys.executable, "-c", "from celery_app import work\nfor i in range(500): work.delay(i)"],
        env=env, cwd=SERVERS, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert send.returncode == 0, send.stderr
    cmd = [str(BIN / "celery"), "-A", "celery_app", "worker", "--pool", "prefork", "-c", "2",
           "--loglevel", "WARNING", "--without-gossip", "--without-mingle"]  # fmt: skip
    proc = server(cmd, env)
    deadline = time.monotonic() + 120
    while len(os.listdir(data / "done")) < 500:
        assert proc.poll() is None, f"the worker exited: {proc.returncode}"
        assert time.monotonic() < deadline, f"{len(os.listdir(data / 'done'))} of 500 tasks ran"
        time.sleep(0.1)
    _stop(proc, 60)
    got = set(_rids(kafka_broker.bootstrap_servers, topic))
    if sys.version_info[:3] in ((3, 12, 0), (3, 12, 1)) and len(got) < 500:
        # A child forked while a parent thread was inside getaddrinfo() keeps its lines in
        # its spool slot (logsdk._resolver); the parent's exit drains such a slot, except
        # on 3.12.0/3.12.1, where no thread starts at interpreter shutdown ("not drained:
        # can't create new thread", seen in nox). The documented way then: the next
        # producer on the spool_dir delivers them; every line must be there after it.
        LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path / "spool").close(60)
        got = set(_rids(kafka_broker.bootstrap_servers, topic))
    assert got == {str(r) for r in range(500)}
