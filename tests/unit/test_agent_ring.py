"""A ring written by an application and read live by another reader (``delivery="agent"``),
without a broker: the reader takes every frame once, the writer follows the tail it
publishes, and a damaged or foreign ring is refused or skipped, never fatal."""

from __future__ import annotations

import contextlib
import mmap
import os
import random
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import posix_ipc
import pytest

from logsdk.errors import ShmError
from logsdk.shm import ShmRing
from logsdk.shm._reader import (
    RingGoneError,
    RingNotReadyError,
    RingReader,
    ring_name,
    ring_names,
)
from logsdk.shm._segment import HEADER_SIZE

CAP = 64 * 1024
PID = "a" * 32


@pytest.fixture
def name(tmp_path: Path) -> Iterator[str]:
    """A unique ring name of ``tmp_path``'s root, unlinked after the test."""
    n = ring_name(tmp_path, uuid.uuid4().hex)
    yield n
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(n)


def rec(i: int, size: int = 100) -> tuple[str, bytes, bytes, None, int, int]:
    return ("topic", b"k%d" % i, (b"rec-%06d|" % i).ljust(size, b"."), None, 1000 + i, i)


def writer(name: str, tmp_path: Path) -> ShmRing:
    return ShmRing.attach(name, CAP, PID, tmp_path, drained_elsewhere=True)


def crash(ring: ShmRing) -> None:
    """What a SIGKILL leaves: the segment as it is, ownership released."""
    ring.closed = True
    ring._mm.close()
    ring._shm.close_fd()


def test_the_reader_takes_frames_past_the_published_head_and_the_writer_follows_its_tail(
    name: str, tmp_path: Path
) -> None:
    """Records not yet covered by the published head are read while the writer lives; once
    settled and the head published, the writer sees nothing pending."""
    ring = writer(name, tmp_path)
    reader = RingReader(name)
    try:
        assert ring_names(tmp_path) == [name]
        for i in range(50):
            assert ring.put(rec(i))
        got = reader.take(1000, alive=reader.writer_alive())
        assert [r[5] for _, r in got] == list(range(50))
        assert ring.pending == 50
        reader.settle([p for p, _ in got])
        ring.publish_head()
        reader.advance()
        assert ring.pending == 0
        assert reader.take(1000, alive=True) == []
    finally:
        reader.close()
        ring.close(unlink=True)


def test_a_writer_laps_the_ring_many_times_behind_a_reader_and_nothing_is_lost(
    name: str, tmp_path: Path
) -> None:
    """20 laps of the ring: every record read once, in order; the writer only waits for
    the room the reader gives back."""
    ring = writer(name, tmp_path)
    reader = RingReader(name)
    seen: list[int] = []
    try:
        i = 0
        while i < 13_000:
            if ring.put(rec(i)):
                i += 1
                continue
            got = reader.take(10_000, alive=True)
            seen += [r[5] for _, r in got]
            reader.settle([p for p, _ in got])
        ring.publish_head()
        got = reader.take(10_000, alive=True)
        seen += [r[5] for _, r in got]
        reader.settle([p for p, _ in got])
        assert seen == list(range(13_000))
        assert reader.corrupt == 0
        assert ring.pending == 0
    finally:
        reader.close()
        ring.close(unlink=True)


def test_the_writer_follows_a_tail_that_jumps_over_thousands_of_frames(
    name: str, tmp_path: Path
) -> None:
    """The agent settles a long run of frames at once (an outage's records spooled, or a
    heal's acknowledgements): the writer's count of pending frames stays exact across the
    drop of its bookkeeping's prefix, and the ring keeps taking records after it."""
    ring = ShmRing.attach(name, 8 << 20, PID, tmp_path, drained_elsewhere=True)
    reader = RingReader(name)
    try:
        for i in range(20_000):
            assert ring.put(rec(i, 60))
        ring.publish_head()
        got = reader.take(20_000, alive=True)
        assert len(got) == 20_000
        reader.settle([p for p, _ in got[:15_000]])
        reader.advance()
        assert ring.pending == 5_000
        for i in range(20_000, 20_100):
            assert ring.put(rec(i, 60))
        ring.publish_head()
        got += reader.take(1_000, alive=True)
        reader.settle([p for p, _ in got[15_000:]])
        reader.advance()
        assert ring.pending == 0
        assert [r[5] for _, r in got] == list(range(20_100))
    finally:
        reader.close()
        ring.close(unlink=True)


def test_settled_frames_are_skipped_by_the_next_reader_after_a_crash_of_the_first(
    name: str, tmp_path: Path
) -> None:
    """A reader settles records out of order (the tail stays at the oldest open one) and
    dies; the next reader delivers only what was not settled."""
    ring = writer(name, tmp_path)
    first = RingReader(name)
    try:
        for i in range(20):
            ring.put(rec(i))
        got = first.take(100, alive=True)
        first.settle([p for p, r in got if r[5] % 2 == 0 or r[5] >= 15])
        first.close()  # its bookkeeping is gone, as in a SIGKILL
        again = RingReader(name)
        try:
            left = [r[5] for _, r in again.take(100, alive=True)]
            assert left == [1, 3, 5, 7, 9, 11, 13]
        finally:
            again.close()
    finally:
        ring.close(unlink=True)


def test_a_dead_writers_ring_is_read_to_its_last_frame_and_then_finished(
    name: str, tmp_path: Path
) -> None:
    """SIGKILLed writer, head published long ago: the frames past it are still read, and the
    reader knows when it is done."""
    ring = writer(name, tmp_path)
    for i in range(30):
        ring.put(rec(i))
    crash(ring)
    reader = RingReader(name)
    try:
        assert not reader.writer_alive()
        got = reader.take(1000, alive=False)
        assert [r[5] for _, r in got] == list(range(30))
        assert reader.take(1000, alive=False) == []
        assert reader.finished
        reader.settle([p for p, _ in got])
        assert reader.open == 0
    finally:
        reader.close()


def test_a_corrupt_frame_is_counted_and_skipped_and_the_rest_delivered(
    name: str, tmp_path: Path
) -> None:
    """One frame's payload overwritten (its CRC no longer matches): the reader counts it and
    delivers the others."""
    ring = writer(name, tmp_path)
    for i in range(10):
        ring.put(rec(i))
    ring.publish_head()
    seg = posix_ipc.SharedMemory(name, 0)

    with mmap.mmap(seg.fd, HEADER_SIZE + CAP) as mm:
        at = mm.find(b"rec-000004|")
        mm[at : at + 4] = b"XXXX"
    seg.close_fd()
    reader = RingReader(name)
    try:
        got = [r[5] for _, r in reader.take(100, alive=True)]
        assert got == [0, 1, 2, 3, 5, 6, 7, 8, 9]
        assert reader.corrupt == 1
    finally:
        reader.close()
        ring.close(unlink=True)


def test_a_ring_of_another_layout_version_is_refused_with_a_clear_error(
    name: str, tmp_path: Path
) -> None:
    """A ring written by a newer or older logsdk is not read at all."""
    ring = writer(name, tmp_path)
    ring.put(rec(0))
    seg = posix_ipc.SharedMemory(name, 0)
    with mmap.mmap(seg.fd, HEADER_SIZE) as mm:
        mm[8:12] = struct.pack("<I", 99)  # the layout version, as a newer logsdk writes it
    seg.close_fd()
    try:
        with pytest.raises(ShmError, match="another logsdk"):
            RingReader(name)
    finally:
        ring.close(unlink=True)


def test_a_ring_being_made_or_gone_is_told_apart_from_a_ring_refused(name: str) -> None:
    """What the agent opens again later (a segment its writer is making: empty, or sized
    with no magic yet), forgets (unlinked since it was listed), and refuses (not a ring):
    three errors, so that only the last is given up."""
    with pytest.raises(RingGoneError):
        RingReader(name)
    seg = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
    try:
        with pytest.raises(RingNotReadyError, match="0 bytes"):
            RingReader(name)
        os.ftruncate(seg.fd, HEADER_SIZE + CAP)
        with pytest.raises(RingNotReadyError, match="no magic"):
            RingReader(name)
        with mmap.mmap(seg.fd, HEADER_SIZE) as mm:
            mm[:8] = b"NOTARING"
        with pytest.raises(ShmError, match="not a logsdk ring") as refused:
            RingReader(name)
        assert not isinstance(refused.value, (RingNotReadyError, RingGoneError))
    finally:
        seg.close_fd()


def test_random_bytes_in_the_frames_never_crash_or_wedge_the_reader(
    name: str, tmp_path: Path
) -> None:
    """Fuzz: random regions of the frames and the indexes overwritten, 200 times; the
    reader returns, delivers only well-formed records, and finishes a dead ring."""
    rnd = random.Random(46)
    for _ in range(200):
        ring = writer(name, tmp_path)
        for i in range(rnd.randrange(1, 60)):
            ring.put(rec(i, rnd.randrange(1, 900)))
        mm = ring._mm
        for _ in range(rnd.randrange(1, 5)):
            at = rnd.choice([512, 544, HEADER_SIZE + rnd.randrange(0, CAP - 64)])
            n = rnd.randrange(1, 64)
            mm[at : at + n] = rnd.randbytes(n)
        crash(ring)
        reader = RingReader(name)
        try:
            for _ in range(100):
                got = reader.take(1000, alive=False)
                for pos, row in got:
                    assert row[0] == "topic"
                    assert row[2] is not None
                    reader.settle([pos])
                if reader.finished or not got:
                    break
        finally:
            reader.close()
            posix_ipc.unlink_shared_memory(name)
