"""LogProducer(buffer="shm") with a live producer: delivery, spill, ownership, the CLI."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logsdk import LogProducer
from logsdk.errors import ShmInUseError
from logsdk.shm import ShmRing, inspect, list_segments, segment_name
from logsdk.testing import check_delivery, free_port, producer_hooks, read_topic
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import FAST, InterruptAfterProduce

pytestmark = [pytest.mark.integration, pytest.mark.each_broker]


@pytest.mark.parametrize("after", ["put", "produce"])
def test_an_interrupt_inside_send_leaves_no_frame_open(
    after: str, kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A signal handler's exception (KeyboardInterrupt) surfaces in send() when a call
    returns: right after the ring put (the record never reaches the client) or right after
    produce() (it did). Either way send() raises, no seq serves two records, and the frame
    does not stay open: an open frame the tail cannot pass would fill the ring for the
    producer's life and keep a clean close() from unlinking the segment. Injected at those
    instants by wrappers around the real ring and client."""
    topic = fresh_topic(3)  # ~5.5 MB: more than the mock cluster keeps of one partition
    name = segment_name(None, tmp_path)
    with LogProducer(
        kafka.bootstrap_servers, topic, tmp_path, buffer="shm", shm_bytes=1 << 20
    ) as p:
        p.send(b"before")
        assert p.flush(30) == 0
        hooks = producer_hooks(p)
        ring = hooks.ring
        assert ring is not None

        def put_then_interrupt(*args: Any) -> bool:
            ring.put_fields = real_put  # type: ignore[method-assign]
            real_put(*args)
            raise KeyboardInterrupt

        real_put = ring.put_fields
        with contextlib.ExitStack() as stack:
            if after == "put":
                ring.put_fields = put_then_interrupt  # type: ignore[method-assign]
            else:
                stack.enter_context(hooks.client_wrapped(InterruptAfterProduce))
            with pytest.raises(KeyboardInterrupt):
                p.send(b"interrupted")
        for i in range(20_000):  # ~ 4 laps of the 1 MiB ring
            p.send(b"after-%d" % i + b"." * 200)
        assert p.flush(60) == 0
        assert ring.pending == 0
        assert p.stats()["spooled"] == 0
    assert name not in list_segments()
    got = read_topic(kafka.bootstrap_servers, topic)
    seqs = [dict(m.headers() or [])["logsdk.seq"] for m in got]
    assert len(seqs) == len(set(seqs))
    values = {m.value() for m in got}
    assert (b"interrupted" in values) == (after == "produce")
    assert len(values) == 20_002 - (after == "put")


def test_shm_delivers_everything_and_clean_close_unlinks(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Every record arrives with its headers; the segment is private (0600) while open,
    empty once acknowledged, and gone after close()."""
    topic = fresh_topic(3)
    name = segment_name(None, tmp_path)
    with LogProducer(
        kafka.bootstrap_servers, topic, tmp_path, buffer="shm", shm_bytes=1 << 20
    ) as p:
        assert stat.S_IMODE(os.stat(f"/dev/shm{name}").st_mode) == 0o600
        for i in range(20_000):  # ~ 4 laps of the 1 MiB ring
            p.send(b"value-%d" % i + b"." * 200, key=b"%d" % (i % 7), headers={"app": "t"})
        assert p.flush(60) == 0
        s = p.stats()
        assert (s["acked"], s["shm_records"], s["shm_name"]) == (20_000, 0, name)
        pid = p.producer_id
    assert name not in list_segments()
    rep = check_delivery(read_topic(kafka.bootstrap_servers, topic))
    assert rep.missing(pid, range(20_000)) == []
    assert rep.order_violations == 0


def test_full_ring_spills_to_the_spool(tmp_path: Path) -> None:
    """Kafka down, 5 MB sent through a 64 KiB ring: nothing refused, all in the spool."""
    dead = f"127.0.0.1:{free_port()}"
    p = LogProducer(dead, "t", tmp_path, buffer="shm", shm_bytes=64 * 1024, **FAST)
    try:
        for i in range(20_000):
            p.send(b"%d" % i + b"." * 250)
        assert p.flush_durable(60) == 0
        s = p.stats()
        assert (s["sent"], s["spooled"], s["dropped"], s["shm_records"]) == (20_000, 20_000, 0, 0)
        assert p.flush(0) == 20_000  # durable, not in Kafka: flush() says so
    finally:
        p.close(timeout=0)


def test_two_live_producers_on_one_name_clear_error(tmp_path: Path) -> None:
    """A second producer on a live producer's shm_name fails with ShmInUseError; it works
    once the first one closed."""
    dead = f"127.0.0.1:{free_port()}"
    name = f"logsdk-test-{uuid.uuid4().hex[:8]}"
    kw = {"buffer": "shm", "shm_name": name, "shm_bytes": 64 * 1024, **FAST}
    first = LogProducer(dead, "t", tmp_path / "a", **kw)
    try:
        with pytest.raises(ShmInUseError, match=f"/{name} is in use by a live producer"):
            LogProducer(dead, "t", tmp_path / "b", **kw)
    finally:
        first.close(timeout=1)
    LogProducer(dead, "t", tmp_path / "b", **kw).close(timeout=1)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logsdk.cli", "shm", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_lists_and_removes_stale_segments(tmp_path: Path) -> None:
    """`logsdk shm list` shows name, size, pending records and whether the owner lives;
    `logsdk shm remove` refuses a live owner or pending records (unless --force)."""
    name = segment_name(None, tmp_path)
    ring = ShmRing.attach(name, 64 * 1024, "p" * 32, tmp_path)
    try:
        for i in range(5):
            ring.put(("t", None, b"v%d" % i, None, 1, i))
        out = _cli("list")
        assert out.returncode == 0
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith(name))
        assert line.split()[1:6] == ["0.1", "MiB", "5", "0", str(os.getpid())]
        assert line.split()[6] == "yes"
        refused = _cli("remove", name)
        assert refused.returncode == 1
        assert "live process" in refused.stderr
    finally:
        ring.close(unlink=False)  # as if the owner died
    assert inspect(name).owner_alive is False
    line = next(ln for ln in _cli("list").stdout.splitlines() if ln.startswith(name))
    assert line.split()[6] == "no"
    pending = _cli("remove", name)
    assert pending.returncode == 1
    assert "5 unacknowledged record(s)" in pending.stderr
    forced = _cli("remove", "--force", name)
    assert forced.returncode == 0, forced.stderr
    assert name not in list_segments()
    assert name not in _cli("list").stdout
