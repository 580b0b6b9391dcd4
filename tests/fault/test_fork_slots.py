"""A process forks a helper that never logs, then is SIGKILLed: its slot is free at once.

A slot's lock (and a shm segment's) is an ``flock`` on a descriptor, and ``fork()`` gives
the child a copy of that descriptor: kept open, the child held the dead parent's slot for
as long as it lived, so the next producer took another slot and the records stayed
behind. A forked child now closes its copies of those descriptors at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logsdk import LogProducer
from logsdk.shm import list_segments, segment_name
from logsdk.spool._check import check_spool_dir
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, free_port, read_topic
from tests.conftest import FAST

pytestmark = [pytest.mark.integration, pytest.mark.fault]

BrokerFactory = Callable[..., EmbeddedBroker]

# argv: bootstrap, topic, spool dir, buffer, records. Sends, makes sure the records are
# where the test wants them (memory buffer: in the spool; shm: in the ring, in flight to a
# paused broker), forks a helper that never logs, prints both pids, and waits to be killed.
_PARENT = textwrap.dedent(
    """
    import os, sys, time
    from logsdk import LogProducer
    bootstrap, topic, spool, buffer, n = sys.argv[1:6]
    p = LogProducer(bootstrap, topic, spool, buffer=buffer, stall_timeout_s=60.0,
                    probe_interval_s=0.2)
    for i in range(int(n)):
        p.send(b"%d" % i)
    if buffer == "memory":
        assert p.flush_durable(30) == 0
        assert p.stats()["spool_records"] == int(n)
    else:
        deadline = time.monotonic() + 30
        while p.stats()["in_flight"] < int(n) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.stats()["in_flight"] == int(n), p.stats()
    helper = os.fork()
    if helper == 0:
        time.sleep(300)  # a helper that never logs: a daemon, a worker
        os._exit(0)
    print(os.getpid(), helper, flush=True)
    time.sleep(300)
    """
)


def _kill_parent(spawn: Callable[..., subprocess.Popen[Any]], *args: str) -> tuple[int, int]:
    parent = spawn(
        [sys.executable, "-c", _PARENT, *args],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the helper is in its group: killed with it at teardown
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line, "the parent did not get as far as its fork"
    pid, helper = (int(x) for x in line.split())
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    return pid, helper


def test_a_dead_parents_slot_is_free_while_its_forked_helper_lives(
    broker_factory: BrokerFactory, tmp_path: Path, spawn: Callable[..., subprocess.Popen[Any]]
) -> None:
    """10 records spooled (Kafka unreachable), a helper forked, the parent SIGKILLed: the
    next producer on the spool_dir takes slot 0 itself and delivers the 10, while the
    helper still runs."""
    spool = tmp_path / "spool"
    _, helper = _kill_parent(
        spawn, f"127.0.0.1:{free_port()}", "forked", str(spool), "memory", "10"
    )
    assert check_spool_dir(spool).ok
    broker = broker_factory()
    topic = create_topic(broker.bootstrap_servers, "forked", 1)
    with LogProducer(broker.bootstrap_servers, topic, spool, **FAST) as p:
        assert p.stats()["slot"] == 0
        assert p.flush(30) == 0
    rep = check_delivery(read_topic(broker.bootstrap_servers, topic))
    assert rep.unique == 10
    assert Path(f"/proc/{helper}").exists(), "the helper was meant to outlive the parent"


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_a_dead_parents_ring_is_resent_while_its_forked_helper_lives(
    broker_factory: BrokerFactory, tmp_path: Path, spawn: Callable[..., subprocess.Popen[Any]]
) -> None:
    """buffer="shm": 500 records only in the ring (in flight to a paused broker), a helper
    forked, the parent SIGKILLed: the next producer takes slot 0 and its ring, and resends
    the 500 once the broker is back, while the helper still runs."""
    spool = tmp_path / "spool"
    broker = broker_factory()
    topic = create_topic(broker.bootstrap_servers, "forked", 1)
    broker.pause()
    try:
        _, helper = _kill_parent(spawn, broker.bootstrap_servers, topic, str(spool), "shm", "500")
    finally:
        broker.resume()
    try:
        with LogProducer(broker.bootstrap_servers, topic, spool, buffer="shm", **FAST) as p:
            assert p.stats()["slot"] == 0
            assert p.flush(60) == 0
        rep = check_delivery(read_topic(broker.bootstrap_servers, topic))
        assert rep.unique == 500
        assert Path(f"/proc/{helper}").exists(), "the helper was meant to outlive the parent"
    finally:
        name = segment_name(None, spool)
        if name in list_segments():
            from logsdk.shm import remove

            remove(name)


# argv: bootstrap, topic, spool dir, seconds. A long-lived parent with Kafka unreachable
# forks short-lived workers, 4 at a time, each sending 10 records through the inherited
# producer and closing it with close(0.2) (its records stay in its slot), for ``seconds``;
# it prints what it holds (threads, descriptors, drains, slot directories) after each
# round, then, once told Kafka is back (a line on stdin), closes with time to deliver.
_CHURN = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from logsdk import LogProducer

    bootstrap, topic, spool, seconds = sys.argv[1:5]
    p = LogProducer(bootstrap, topic, spool, stall_timeout_s=3.0, probe_interval_s=0.2,
                    probe_timeout_s=1.0, probe_backoff_max_s=0.5)
    for i in range(10):
        p.send(b"parent-%d" % i)
    deadline = time.monotonic() + 30  # degraded, its first client let go
    while time.monotonic() < deadline:
        s = p.stats()
        if s["state"] == "DEGRADED" and s["retired_clients"] == 0:
            break
        time.sleep(0.05)

    def held():
        slots = os.path.join(spool, "slots")
        return {
            "python_threads": threading.active_count(),
            "threads": len(os.listdir("/proc/self/task")),
            "fds": len(os.listdir("/proc/self/fd")),
            "draining": p.stats()["draining_slots"],
            "slot_dirs": len(os.listdir(slots)) if os.path.isdir(slots) else 0,
        }

    start, rounds, statuses, workers = held(), [], [], 0
    cpu0 = sum(os.times()[:2])
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        pids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    for i in range(10):
                        p.send(b"w%d-%d" % (workers, i))
                    p.close(0.2)
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
            workers += 1
        statuses += [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        rounds.append(held())
    print(json.dumps({"start": start, "rounds": rounds, "workers": workers,
                      "statuses": statuses, "cpu_s": sum(os.times()[:2]) - cpu0}), flush=True)
    sys.stdin.readline()
    p.close(60)
    print(json.dumps({"undelivered": p.stats()["undelivered"]}), flush=True)
    """
)


def test_a_long_lived_parent_forking_workers_while_kafka_is_down_holds_no_drains(
    broker_factory: BrokerFactory, tmp_path: Path, spawn: Callable[..., subprocess.Popen[Any]]
) -> None:
    """Kafka unreachable for 21 s while a parent forks workers 4 at a time (10 records
    each, close(0.2)): the parent drains no free slot meanwhile, and what it holds stays
    flat (Python threads as at the start, native threads and descriptors within a probe's
    of it, at most 4 slot directories: one per live worker); every worker exits 0; once
    Kafka is back, the parent's close() delivers every record, the workers' included.
    (Each scan, every 10 s, started a drain of every free slot with records and kept it;
    each drain held its slot, so new workers opened new ones: after 160 workers the
    parent held 17-23 drains, 55-73 Python threads, 162-211 descriptors against 16.)"""
    broker = broker_factory(proxy=True)
    topic = create_topic(broker.bootstrap_servers, "churn", 2)
    broker.cut()
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        app = spawn(
            [sys.executable, "-c", _CHURN, broker.bootstrap_servers, topic, str(tmp_path / "s"),
             "21"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    assert app.stdin is not None
    assert app.stdout is not None
    line = app.stdout.readline()
    assert line, f"the app died during the churn: {err_path.read_text()[-3000:]}"
    churn = json.loads(line)
    start, rounds = churn["start"], churn["rounds"]
    most = {k: max(r[k] for r in rounds) for k in start}
    print("start", start, "most", most, "workers", churn["workers"], "cpu_s", churn["cpu_s"])
    assert churn["statuses"] == [0] * churn["workers"], err_path.read_text()[-3000:]
    assert churn["workers"] >= 40  # two scans' worth of workers at least
    assert most["draining"] == 0, (start, most)
    assert most["slot_dirs"] <= 4, (start, most)
    assert most["python_threads"] == start["python_threads"], (start, most)
    # A probe of the parent's health thread has a client of its own while it runs (4
    # threads and 5 descriptors, measured); a drain costs 3 Python threads and more.
    assert most["threads"] <= start["threads"] + 8, (start, most)
    assert most["fds"] <= start["fds"] + 8, (start, most)
    broker.heal()
    app.stdin.write("healed\n")
    app.stdin.flush()
    line = app.stdout.readline()
    assert line, f"the app died in close(): {err_path.read_text()[-3000:]}"
    assert json.loads(line)["undelivered"] == 0
    assert app.wait(30) == 0
    values = {m.value() for m in read_topic(broker.bootstrap_servers, topic, timeout=120)}
    want = {b"parent-%d" % i for i in range(10)}
    want |= {b"w%d-%d" % (w, i) for w in range(churn["workers"]) for i in range(10)}
    assert want - values == set()
    assert "double free" not in err_path.read_text()
