"""buffer="shm" under real crashes: a producer SIGKILLed with records Kafka has not
acknowledged; a new producer on the same segment resends every one of them.

The broker is *paused* (SIGSTOP) while the child sends, so records sit unacknowledged in
the producer's memory at the kill: exactly the records a memory buffer loses.
"""

from __future__ import annotations

import mmap
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import posix_ipc
import pytest

from logsdk import LogProducer
from logsdk.errors import BufferFullError, RecordTooLargeError
from logsdk.shm import inspect, list_segments, segment_name
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, free_port, read_topic
from tests.conftest import FAST, assert_spool_sound

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]

SHM = 8 << 20

_CHILD = textwrap.dedent(
    """
    import sys, time
    from logsdk import LogProducer
    bootstrap, spool, topic, buffer, total, shm_bytes, every = sys.argv[1:8]
    p = LogProducer(bootstrap, topic, spool, buffer=buffer, shm_bytes=int(shm_bytes),
                    stall_timeout_s=120, probe_interval_s=60, probe_timeout_s=1.0)
    total, every = int(total), int(every)
    i = 0
    while total < 0 or i < total:
        p.send(b"rec-%06d|" % i, key=b"%d" % (i % 5))
        i += 1
        if i % every == 0:
            print(i, flush=True)  # i records were accepted by send()
    print("done", flush=True)
    time.sleep(600)
    """
)


@pytest.fixture(scope="module")
def pausable() -> Iterator[EmbeddedBroker]:
    """A broker of this module's own, so pausing it disturbs no other test."""
    if os.environ.get("LOGSDK_TEST_BOOTSTRAP", "").strip():
        pytest.skip("these tests pause the broker: they need the embedded one")
    with EmbeddedBroker() as broker:
        yield broker


def run_child(
    bootstrap: str,
    spool: Path,
    topic: str,
    buffer: str,
    *,
    total: int,
    every: int,
    kill_at: int | None = None,
    kill_after_s: float | None = None,
    shm_bytes: int = SHM,
) -> int:
    """Run a sending child, SIGKILL it (at ``kill_at`` records, ``kill_after_s`` after its
    first report, or once done); returns how many records it reported accepted."""
    args = [bootstrap, str(spool), topic, buffer, str(total), str(shm_bytes), str(every)]
    last = 0
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, *args], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                line = child.stdout.readline().strip()
                if not line:
                    raise AssertionError(f"child exited early: {child.poll()}")
                if line == "done":
                    break
                last = int(line)
                if kill_after_s is not None:
                    time.sleep(kill_after_s)
                    break
                if kill_at is not None and last >= kill_at:
                    break
        finally:
            child.send_signal(signal.SIGKILL)
            out, _ = child.communicate(timeout=10)
    if kill_after_s is not None:  # lines printed while we slept count too
        nums = [int(x) for x in out.split() if x.isdigit()]
        last = max([last, *nums])
    assert_spool_sound(spool)
    return last


def test_shm_resends_every_accepted_record_after_sigkill(
    pausable: EmbeddedBroker, tmp_path: Path
) -> None:
    """50k sends to a paused broker, SIGKILL mid-stream: the next producer on the same
    segment delivers every record send() accepted, with its original producer/seq."""
    topic = create_topic(pausable.bootstrap_servers, f"shm-kill-{uuid.uuid4().hex[:6]}", 3)
    spool = tmp_path / "spool"
    pausable.pause()
    try:
        accepted = run_child(
            pausable.bootstrap_servers, spool, topic, "shm", total=50_000, every=500, kill_at=25_000
        )
        info = inspect(segment_name(None, spool))
        assert not info.owner_alive
        assert info.pending >= accepted
        assert info.corrupt == 0
    finally:
        pausable.resume()
    with LogProducer(
        pausable.bootstrap_servers, topic, spool, buffer="shm", shm_bytes=SHM, **FAST
    ) as p:
        assert p.stats()["shm_recovered"] >= accepted
        # flush() means "in Kafka": what the dead producer left in the ring (moved to the
        # spool at open) is replayed before it returns 0.
        assert p.flush(60) == 0
        pid = p.producer_id
    assert segment_name(None, spool) not in list_segments()  # clean close unlinked it
    rep = check_delivery(read_topic(pausable.bootstrap_servers, topic))
    assert accepted >= 25_000
    assert rep.missing(pid, range(accepted)) == []
    assert rep.order_violations == 0


def test_memory_buffer_loses_what_shm_keeps(pausable: EmbeddedBroker, tmp_path: Path) -> None:
    """The contrast, asserted: the same run with buffer="memory" loses every record that was
    waiting for Kafka at the kill (none had reached the spool)."""
    topic = create_topic(pausable.bootstrap_servers, f"mem-kill-{uuid.uuid4().hex[:6]}", 3)
    spool = tmp_path / "spool"
    pausable.pause()
    try:
        accepted = run_child(
            pausable.bootstrap_servers,
            spool,
            topic,
            "memory",
            total=50_000,
            every=500,
            kill_at=25_000,
        )
    finally:
        pausable.resume()
    with LogProducer(pausable.bootstrap_servers, topic, spool, **FAST) as p:
        assert p.stats()["recovered_at_start"] == 0
        pid = p.producer_id
    rep = check_delivery(read_topic(pausable.bootstrap_servers, topic))
    assert accepted >= 25_000
    assert len(rep.missing(pid, range(accepted))) == accepted  # all lost


def test_corrupt_bytes_in_the_segment_are_counted_skipped_rest_delivered(
    pausable: EmbeddedBroker, tmp_path: Path
) -> None:
    """Garbage written into three records of a dead producer's segment: those three are
    counted and skipped, the other 4997 are delivered."""
    topic = create_topic(pausable.bootstrap_servers, f"shm-bad-{uuid.uuid4().hex[:6]}", 2)
    spool = tmp_path / "spool"
    pausable.pause()
    try:
        run_child(pausable.bootstrap_servers, spool, topic, "shm", total=5000, every=1000)
    finally:
        pausable.resume()
    shm = posix_ipc.SharedMemory(segment_name(None, spool), 0)
    try:
        with mmap.mmap(shm.fd, os.fstat(shm.fd).st_size) as mm:
            for victim, delta in ((1000, 2), (2500, -30), (4000, 5)):  # payload, header, payload
                i = mm.find(b"rec-%06d|" % victim)
                assert i > 0
                mm[i + delta : i + delta + 6] = b"\xde\xad\xbe\xef\x00\xff"
    finally:
        shm.close_fd()
    with LogProducer(
        pausable.bootstrap_servers, topic, spool, buffer="shm", shm_bytes=SHM, **FAST
    ) as p:
        s = p.stats()
        assert (s["shm_corrupt"], s["shm_recovered"]) == (3, 4997)
        assert p.flush(60) == 0
        pid = p.producer_id
    rep = check_delivery(read_topic(pausable.bootstrap_servers, topic))
    assert rep.missing(pid, range(5000)) == [1000, 2500, 4000]


def test_refused_record_never_frees_the_slot_of_the_next_one(
    pausable: EmbeddedBroker, tmp_path: Path
) -> None:
    """A record written to the ring and then refused (librdkafka's own size limit, lower
    here than the SDK's) gives its seq back to the next record. Its settle must flag its
    own frame, not that of the record now holding the seq: with the broker paused, both
    accepted records stay pending in the ring, and both are delivered."""
    topic = create_topic(pausable.bootstrap_servers, f"shm-refused-{uuid.uuid4().hex[:6]}", 1)
    p = LogProducer(
        pausable.bootstrap_servers,
        topic,
        tmp_path,
        buffer="shm",
        shm_bytes=64 * 1024,
        kafka_config={"message.max.bytes": 5000},
        stall_timeout_s=60,
        probe_interval_s=60,
        probe_timeout_s=0.2,
    )
    try:
        pausable.pause()
        try:
            p.send(b"ok-0")
            with pytest.raises(RecordTooLargeError):
                p.send(b"x" * 8000)
            p.send(b"ok-1")
            s = p.stats()
            assert s["next_seq"] == 2  # the refused record's seq went to ok-1
            assert s["shm_records"] == 2  # neither accepted record flagged settled
            assert s["rejected"] == 1
        finally:
            pausable.resume()
        assert p.flush(30) == 0
        assert p.stats()["shm_records"] == 0
    finally:
        p.close()
    got = [m.value() for m in read_topic(pausable.bootstrap_servers, topic)]
    assert got == [b"ok-0", b"ok-1"]


def test_full_ring_policies_while_kafka_stalls(pausable: EmbeddedBroker, tmp_path: Path) -> None:
    """A 64 KiB ring full of records a paused broker does not acknowledge: ``raise`` raises
    at once, ``block`` after max_block_s, ``drop_newest`` drops and counts."""
    topic = create_topic(pausable.bootstrap_servers, f"shm-full-{uuid.uuid4().hex[:6]}", 1)
    pausable.pause()
    try:
        for policy in ("raise", "block", "drop_newest"):
            p = LogProducer(
                pausable.bootstrap_servers,
                topic,
                tmp_path / policy,
                buffer="shm",
                shm_bytes=64 * 1024,
                when_full=policy,  # type: ignore[arg-type]
                max_block_s=0.3,
                stall_timeout_s=60,
                probe_interval_s=60,
                probe_timeout_s=0.2,  # close() waits for the health thread's probe
            )
            try:
                outcome: list[str] = []
                for _ in range(200):
                    try:
                        p.send(b"x" * 1000)
                    except BufferFullError as exc:
                        outcome.append(str(exc))
                        break
                    outcome.append("ok")
                s = p.stats()
                assert s["shm_records"] == outcome.count("ok") - s["dropped"]
                if policy == "drop_newest":
                    assert len(outcome) == outcome.count("ok") == 200
                    assert s["dropped"] > 100
                else:
                    assert outcome[-1].startswith("shm ring full")
                    assert 50 < outcome.count("ok") < 70
            finally:
                p.close(timeout=0)
    finally:
        pausable.resume()


def test_sigkill_at_random_points_twenty_times_ring_always_recovers(
    make_producer: Callable[..., LogProducer], tmp_path: Path
) -> None:
    """20 producers with a small (256 KiB, often full) ring, Kafka down, SIGKILLed at a
    random instant: the segment always reads back without a corrupt frame, and the next
    producer puts every accepted record into its spool."""
    dead = f"127.0.0.1:{free_port()}"
    rng = random.Random(4004)
    for round_no in range(20):
        spool = tmp_path / f"spool-{round_no}"
        accepted = run_child(
            dead,
            spool,
            "t",
            "shm",
            total=-1,
            every=200,
            kill_after_s=rng.uniform(0.0, 0.4),
            shm_bytes=256 * 1024,
        )
        name = segment_name(None, spool)
        info = inspect(name)
        assert info.corrupt == 0
        assert not info.owner_alive
        p = make_producer(dead, "t", spool, buffer="shm", shm_bytes=256 * 1024, **FAST)
        assert p.stats()["shm_recovered"] == info.pending
        p.close(timeout=0)  # Kafka is down: nothing to wait for; the ring goes to the spool
        assert name not in list_segments()
        conn = sqlite3.connect(spool / "spool.db")
        try:
            seqs = {s for (s,) in conn.execute("SELECT seq FROM records")}
        finally:
            conn.close()
        assert set(range(accepted)) <= seqs, round_no
