"""A process forks a helper that never logs, then is SIGKILLed: its slot is free at once.

A slot's lock (and a shm segment's) is an ``flock`` on a descriptor, and ``fork()`` gives
the child a copy of that descriptor: kept open, the child held the dead parent's slot for
as long as it lived, so the next producer took another slot and the records stayed
behind. A forked child now closes its copies of those descriptors at once.
"""

from __future__ import annotations

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
