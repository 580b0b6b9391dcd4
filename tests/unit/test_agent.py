"""The agent's parts without a broker: one agent per spool root, the checks a ring's
record must pass, and the spooling of rings' records while Kafka does not answer."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.agent._agent import Agent, AgentConfig
from logsdk.agent._lock import AgentLock, agent_dir, agent_running
from logsdk.agent._source import check_row
from logsdk.cli import main
from logsdk.errors import AgentLockedError, ShmError
from logsdk.shm import ShmRing
from logsdk.shm._reader import ring_name, ring_names
from logsdk.spool._codec import encode_headers
from logsdk.spool._slots import spooled_records
from tests.conftest import wait_until


@pytest.fixture(autouse=True)
def _collect_within_the_test() -> Iterator[None]:
    """A connection left unclosed warns when collected: here, in the test that left it."""
    yield
    gc.collect()


# Nothing listens here: the agent's probes fail, so Kafka stays down.
NOWHERE = "127.0.0.1:1"


def agent(root: Path) -> Agent:
    return Agent(AgentConfig(spool_root=root, bootstrap_servers=NOWHERE, probe_timeout_s=0.3))


def test_a_second_agent_on_a_spool_root_says_who_holds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lock names the holder's pid; the command exits 1 with that message."""
    assert not agent_running(tmp_path)
    lock = AgentLock.take(tmp_path)
    try:
        assert agent_running(tmp_path)
        with pytest.raises(AgentLockedError, match=r"another logsdk agent \(pid \d+\)"):
            AgentLock.take(tmp_path)
        code = main(["agent", "--spool-root", str(tmp_path), "-b", NOWHERE])
        assert code == 1
        assert "another logsdk agent (pid" in capsys.readouterr().err
    finally:
        lock.release()
    assert not agent_running(tmp_path)


def test_a_record_is_checked_before_it_is_sent() -> None:
    """A topic Kafka refuses, an SDK header, a headers blob that does not decode: refused."""
    good = ("logs", b"k", b"v", encode_headers([("h", b"1")]), 1, 0)
    assert check_row(good) == [("h", b"1")]
    assert check_row(("bad topic!", None, b"v", None, 1, 0)) is None
    assert check_row(("logs", None, b"v", encode_headers([("logsdk.seq", b"9")]), 1, 0)) is None
    assert check_row(("logs", None, b"v", b"\x00\x05ab", 1, 0)) is None


def test_while_kafka_does_not_answer_the_rings_records_go_to_the_producers_spool(
    tmp_path: Path,
) -> None:
    """Kafka down: each record is committed to the spool of its producer id (that id in
    its state.json), the ring's tail moves (the application's flush() returns 0), and a
    record with a topic Kafka would refuse is counted corrupt, not spooled."""
    p = LogProducer(NOWHERE, "logs", tmp_path, delivery="agent")
    a = agent(tmp_path).start()
    try:
        for i in range(500):
            p.send(b"%d" % i, key=b"k")
        assert p.flush(10) == 0
        spool = agent_dir(tmp_path) / p.producer_id
        assert spooled_records(spool) == 500
        state = json.loads((spool / "state.json").read_text())
        assert state["producer_id"] == p.producer_id
        # A foreign writer's frame naming a topic Kafka refuses.
        name = ring_name(tmp_path, "f" * 32)
        bad = ShmRing.attach(name, 64 * 1024, "f" * 32, tmp_path, drained_elsewhere=True)
        try:
            bad.put(("not a topic!", None, b"x", None, 1, 0))
            bad.put(("logs", None, b"y", None, 1, 1))
            bad.publish_head()
            wait_until(lambda: a.stats()["corrupt"] == 1, 10, "the bad frame counted")
            wait_until(
                lambda: spooled_records(agent_dir(tmp_path) / ("f" * 32)) == 1,
                10,
                "the good frame spooled",
            )
            wait_until(lambda: bad.pending == 0, 10, "both frames settled")
        finally:
            bad.close(unlink=True)
        assert a.stats()["spooled"] == 501
    finally:
        p.close(1)
        assert a.stop(5)


def test_a_dead_writers_ring_is_removed_once_its_records_are_spooled(tmp_path: Path) -> None:
    """The application gone (its ring closed with records left): the agent spools them and
    unlinks the ring; the spool keeps them for Kafka."""
    p = LogProducer(NOWHERE, "logs", tmp_path, delivery="agent")
    for i in range(50):
        p.send(b"%d" % i)
    p.close(0)
    pid = p.producer_id
    assert len(ring_names(tmp_path)) == 1
    a = agent(tmp_path).start()
    try:
        wait_until(lambda: ring_names(tmp_path) == [], 10, "the dead ring removed")
        assert spooled_records(agent_dir(tmp_path) / pid) == 50
    finally:
        assert a.stop(5)


def test_a_spool_the_agent_cannot_open_is_kept_and_opened_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent's spool it cannot open at start (here locked by an operator's command) is
    kept with its records, not taken for an empty one and removed; the agent opens it once
    it can, and the ring of that producer waits behind it meanwhile."""
    from logsdk.spool._spool import Spool

    caplog.set_level(logging.WARNING, "logsdk.agent")
    p = LogProducer(NOWHERE, "logs", tmp_path, delivery="agent")
    for i in range(50):
        p.send(b"%d" % i)
    p.close(0)
    spool_dir = agent_dir(tmp_path) / p.producer_id
    first = agent(tmp_path).start()
    try:
        wait_until(lambda: ring_names(tmp_path) == [], 10, "the records spooled")
    finally:
        assert first.stop(5)
    assert spooled_records(spool_dir) == 50
    held = Spool(spool_dir).open()  # as `logsdk spool replay` would hold it
    second = agent(tmp_path).start()
    try:
        wait_until(lambda: "not opened" in caplog.text, 10, "the failed open said")
        time.sleep(3 * second.config.scan_interval_s)  # scans that once removed it
        assert spool_dir.is_dir()
        held.close()
        wait_until(lambda: "opened at last" in caplog.text, 10, "the spool opened")
        assert spooled_records(spool_dir) == 50
    finally:
        held.close()  # a second close does nothing; a failure above leaves it open
        assert second.stop(5)


def test_sigterm_stops_the_agent_cleanly(tmp_path: Path) -> None:
    """`logsdk agent` in the foreground: SIGTERM ends it with status 0 and frees the lock."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "logsdk.cli", "agent", "--spool-root", str(tmp_path), "-b", NOWHERE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "draining" in proc.stdout.readline()
        assert agent_running(tmp_path)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert time.monotonic() - start < 10
        assert not agent_running(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_a_ring_of_another_logsdk_version_is_left_alone_and_the_others_are_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ring whose layout version is not this agent's: an error naming it, nothing read
    from it, and the other rings of the root still drained."""
    caplog.set_level(logging.ERROR, "logsdk.agent")
    name = ring_name(tmp_path, "e" * 32)
    old = ShmRing.attach(name, 64 * 1024, "e" * 32, tmp_path, drained_elsewhere=True)
    old.put(("logs", None, b"x", None, 1, 0))
    poke(name, 8, (99).to_bytes(4, "little"))  # the layout version
    p = LogProducer(NOWHERE, "logs", tmp_path, delivery="agent")
    a = agent(tmp_path).start()
    try:
        p.send(b"fine")
        assert p.flush(10) == 0
        wait_until(lambda: "another logsdk" in caplog.text, 10, "the refusal logged")
        assert not (agent_dir(tmp_path) / ("e" * 32)).exists()
        assert old.pending == 1
    finally:
        p.close(1)
        assert a.stop(5)
        old.close(unlink=True)


@pytest.mark.parametrize("sent", [1000, 300])
def test_a_full_spool_leaves_the_records_in_the_ring_and_the_agent_going(
    tmp_path: Path, sent: int
) -> None:
    """Kafka down and the agent's spool at spool_max_bytes: what does not fit stays in the
    ring (the application's flush() says how many), counted as spool errors; nothing is
    lost: spooled + left in the ring = sent. (300 records are too few for the writer to
    publish its head before flush() does: the agent's tail then moves only if it looks
    for that head while the spool keeps refusing; it did not, and flush() said 300.)"""
    p = LogProducer(NOWHERE, "logs", tmp_path, delivery="agent")
    a = Agent(
        AgentConfig(
            spool_root=tmp_path,
            bootstrap_servers=NOWHERE,
            probe_timeout_s=0.3,
            spool_max_bytes=50_000,
            batch=50,
        )
    ).start()
    try:
        for i in range(sent):
            p.send(b"%0200d" % i)
        wait_until(lambda: a.stats()["spool_errors"] > 0, 10, "the spool full")
        left = p.flush(0.5)
        spooled = spooled_records(agent_dir(tmp_path) / p.producer_id)
        assert 0 < spooled < sent
        assert left == sent - spooled
        assert a.stats()["spooled"] == spooled
        assert a.running
    finally:
        p.close(0)
        assert a.stop(5)
    _cleanup_rings(tmp_path)


def poke(name: str, offset: int, data: bytes) -> None:
    """Overwrite bytes of the segment ``name`` at ``offset``, as another process would."""
    import mmap

    import posix_ipc

    seg = posix_ipc.SharedMemory(name, 0)
    try:
        with mmap.mmap(seg.fd, offset + len(data)) as mm:
            mm[offset : offset + len(data)] = data
    finally:
        seg.close_fd()


def _cleanup_rings(root: Path) -> None:
    from logsdk.shm._reader import RingReader

    for name in ring_names(root):
        r = RingReader(name)
        r.close()
        r.unlink()


def test_random_damage_in_rings_never_stops_or_wedges_the_agent(tmp_path: Path) -> None:
    """Fuzz: 30 dead applications' rings, each damaged at random places (frames, indexes,
    lengths); the agent takes every ring to its end and removes it, stays up, and spools
    only records that were written (never one made of damaged bytes)."""
    import random

    rnd = random.Random(4646)
    written: set[bytes] = set()
    for k in range(30):
        pid = "%032x" % (k + 1)
        ring = ShmRing.attach(
            ring_name(tmp_path, pid), 64 * 1024, pid, tmp_path, drained_elsewhere=True
        )
        for i in range(rnd.randrange(1, 80)):
            v = b"%d-%d|" % (k, i) + rnd.randbytes(rnd.randrange(0, 500))
            written.add(v)
            ring.put(("logs", None, v, None, 1, i))
        ring.close(unlink=False)  # the application is gone
        for _ in range(rnd.randrange(1, 6)):
            at = rnd.choice([512, 544, 4096 + rnd.randrange(0, 64 * 1024 - 64)])
            poke(ring_name(tmp_path, pid), at, rnd.randbytes(rnd.randrange(1, 48)))
    a = agent(tmp_path).start()
    try:
        wait_until(lambda: ring_names(tmp_path) == [], 30, "every ring taken and removed")
        assert a.running
    finally:
        assert a.stop(5)
    spooled = 0
    for db in agent_dir(tmp_path).glob("*/spool.db"):
        with contextlib.closing(sqlite3.connect(db)) as conn:
            for (value,) in conn.execute("SELECT value FROM records"):
                assert value in written
                spooled += 1
    assert spooled > len(written) // 2  # most frames were not damaged


def agents_on(root: Path) -> list[int]:
    """The pids of the ``logsdk agent`` processes whose spool root is ``root``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            if b"agent" in args and str(root).encode() in args:
                found.append(int(cmdline.parent.name))
    return found


def test_a_producer_starts_an_agent_when_none_runs(tmp_path: Path) -> None:
    """start_agent=True: the constructor starts one agent (in a session of its own, its
    log in the spool root), which takes the records; a second producer starts none."""
    import os

    p = LogProducer(NOWHERE, "logs", tmp_path, delivery="agent", start_agent=True)
    pid = 0
    try:
        wait_until(lambda: agent_running(tmp_path), 20, "the agent started")
        pid = int((agent_dir(tmp_path) / "LOCK").read_text())
        assert os.getsid(pid) != os.getsid(0)  # a session of its own
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert ppid != os.getpid()  # nobody's child here: it outlives this process
        q = LogProducer(NOWHERE, "logs", tmp_path, delivery="agent", start_agent=True)
        for i in range(100):
            p.send(b"%d" % i)
            q.send(b"%d" % i)
        assert p.flush(20) == 0
        assert q.flush(20) == 0
        q.close(1)
        assert int((agent_dir(tmp_path) / "LOCK").read_text()) == pid
        assert (agent_dir(tmp_path) / "agent.log").exists()
    finally:
        p.close(1)
        # Every agent on this root, also one that started after a failed wait: a
        # detached agent outlives the test otherwise.
        for agent_pid in {pid, *agents_on(tmp_path)} - {0}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent_pid, signal.SIGTERM)
        wait_until(lambda: not agents_on(tmp_path), 20, "the agent stopped")


def test_the_agents_kafka_properties_from_the_environment_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """$LOGSDK_AGENT_KAFKA_CONFIG must be a JSON object (exit 2 otherwise), and a property
    that would weaken delivery is refused (exit 1)."""
    monkeypatch.setenv("LOGSDK_AGENT_KAFKA_CONFIG", "not json")
    assert main(["agent", "--spool-root", str(tmp_path), "-b", NOWHERE]) == 2
    assert "LOGSDK_AGENT_KAFKA_CONFIG" in capsys.readouterr().err
    monkeypatch.setenv("LOGSDK_AGENT_KAFKA_CONFIG", '{"acks": "1"}')
    assert main(["agent", "--spool-root", str(tmp_path), "-b", NOWHERE]) == 1
    assert "acks" in capsys.readouterr().err


def test_a_ring_named_with_dots_is_never_taken_for_a_directory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ring whose producer id is ".." (a bug, or another process of the same user) is
    refused and left alone: the agent's spools are named after producer ids, and the
    spool root stays whole; the other rings are drained."""
    import posix_ipc

    caplog.set_level(logging.ERROR, "logsdk.agent")
    name = ring_name(tmp_path, "..")
    ring = ShmRing.attach(name, 64 * 1024, "..", tmp_path, drained_elsewhere=True)
    ring.put(("logs", None, b"x", None, 1, 0))
    ring.close(unlink=False)
    (tmp_path / "keep").write_text("x")
    a = agent(tmp_path).start()
    try:
        p = LogProducer(NOWHERE, "logs", tmp_path, delivery="agent")
        p.send(b"y")
        assert p.flush(10) == 0  # the agent is up and taking the other rings
        p.close(1)
        wait_until(lambda: "is not a producer id" in caplog.text, 10, "the refusal logged")
        assert name in ring_names(tmp_path)
    finally:
        assert a.stop(5)
        posix_ipc.unlink_shared_memory(name)
    assert (tmp_path / "keep").read_text() == "x"


def test_a_ring_seen_while_its_writer_makes_it_is_read_once_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer creates its segment empty, sizes it, then writes the header and the magic
    last: a scan between those steps finds a 0-byte or blank segment. The agent opens it
    again at the next scan (it was once refused for good, and a gunicorn worker's records
    waited in its ring for ever); one left half-made is said once, and left alone."""
    import posix_ipc

    from logsdk.agent import _agent

    monkeypatch.setattr(_agent, "UNREADY_WARN_S", 0.5)
    caplog.set_level(logging.WARNING, "logsdk.agent")
    making = ring_name(tmp_path, "f" * 32)
    posix_ipc.SharedMemory(making, posix_ipc.O_CREX, mode=0o600).close_fd()  # 0 bytes
    blank = ring_name(tmp_path, "d" * 32)
    posix_ipc.SharedMemory(blank, posix_ipc.O_CREX, mode=0o600, size=1 << 17).close_fd()
    a = agent(tmp_path).start()
    try:
        p = LogProducer(NOWHERE, "logs", tmp_path, delivery="agent")
        p.send(b"y")
        assert p.flush(10) == 0  # a scan that listed the two half-made ones has passed
        p.close(1)
        wait_until(lambda: f"ring {blank} has been half-made" in caplog.text, 10, "said")
        ring = ShmRing.attach(making, 64 * 1024, "f" * 32, tmp_path, drained_elsewhere=True)
        for i in range(50):
            assert ring.put(("logs", None, b"%d" % i, None, 1, i))
        ring.close(unlink=False)
        wait_until(lambda: making not in ring_names(tmp_path), 10, "the made ring read, removed")
        assert spooled_records(agent_dir(tmp_path) / ("f" * 32)) == 50
        assert "not read" not in caplog.text
        assert caplog.text.count(f"ring {blank} has been half-made") == 1
        assert blank in ring_names(tmp_path)
    finally:
        assert a.stop(5)
        posix_ipc.unlink_shared_memory(blank)
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(making)


#: The user of the application in the test below (Debian's "nobody").
OTHER_UID = 65534

_OTHER_USERS_APP = """
import os, sys
from logsdk import LogProducer
from logsdk.agent._lock import agent_running
# Everything the producer needs is imported while this is still root (Python's own
# files may not be readable by the other user).
LogProducer("127.0.0.1:1", "logs", sys.argv[2], delivery="agent").close(0)
os.setgid(int(sys.argv[3]))
os.setuid(int(sys.argv[3]))
root = sys.argv[1]
p = LogProducer("127.0.0.1:1", "logs", root, delivery="agent")
for i in range(100):
    p.send(b"%d" % i)
print(p.producer_id, flush=True)
sys.stdin.readline()
print(agent_running(root), p.flush(20), flush=True)
p.close(0)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs an application as another user")
def test_an_agent_run_as_root_reads_the_rings_of_the_users_it_trusts() -> None:
    """An application of another user writes its ring (mode 0600, that user's): root's agent
    does not take it by default; with the user trusted (``--trust-uid``) it spools the
    records (Kafka down), and the application sees the agent and its flush() returns 0."""
    import shutil
    import stat
    import tempfile

    from logsdk.shm._reader import RingReader, readable_uids

    base = Path(tempfile.mkdtemp(dir="/tmp"))  # not under pytest's 0700 root
    base.chmod(0o755)
    root = base / "spool"
    root.mkdir()
    os.chown(root, OTHER_UID, OTHER_UID)
    app = subprocess.Popen(
        [sys.executable, "-c", _OTHER_USERS_APP, str(root), str(base / "warm"), str(OTHER_UID)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    a = None
    try:
        assert app.stdout is not None
        assert app.stdin is not None
        pid = app.stdout.readline().strip()
        [name] = ring_names(root, readable_uids([OTHER_UID]))
        st = os.stat("/dev/shm" + name)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (OTHER_UID, 0o600)
        assert ring_names(root) == []  # root's own rings only, by default
        with pytest.raises(ShmError, match=f"belongs to uid {OTHER_UID}"):
            RingReader(name)
        a = Agent(
            AgentConfig(
                spool_root=root, bootstrap_servers=NOWHERE, probe_timeout_s=0.3,
                trusted_uids=(OTHER_UID,),
            )
        ).start()  # fmt: skip
        wait_until(
            lambda: spooled_records(agent_dir(root) / pid) == 100, 20, "the ring's 100 spooled"
        )
        app.stdin.write("go\n")
        app.stdin.flush()
        assert app.stdout.readline().split() == ["True", "0"]
        assert app.wait(30) == 0
    finally:
        if app.poll() is None:
            app.kill()
        app.communicate()  # its pipes closed
        if a is not None:
            assert a.stop(5)
        for name in ring_names(root, readable_uids([OTHER_UID])):
            with contextlib.suppress(OSError):
                os.unlink("/dev/shm" + name)
        shutil.rmtree(base, ignore_errors=True)
