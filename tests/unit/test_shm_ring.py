"""The shared-memory ring without a broker: wrap-around, full ring, torn and corrupt frames."""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import random
import stat
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import posix_ipc
import pytest

from logsdk.errors import RecordTooLargeError, ShmError, ShmInUseError
from logsdk.shm import ShmRing, inspect, list_segments, remove, segment_name
from logsdk.shm._segment import HEADER_SIZE, publish_index, read_index

CAP = 64 * 1024
PID = "p" * 32
HEAD_SLOTS = 512  # the documented layout: head stored twice at bytes 512..544


@pytest.fixture
def name() -> Iterator[str]:
    """A unique segment name, unlinked after the test whatever happened."""
    n = f"/logsdk-test-{uuid.uuid4().hex[:12]}"
    yield n
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(n)


def rec(i: int, size: int = 100) -> tuple[str, bytes, bytes, None, int, int]:
    return ("topic", b"k%d" % i, (b"rec-%06d|" % i).ljust(size, b"."), None, 1000 + i, i)


def crash(ring: ShmRing) -> None:
    """What a SIGKILL leaves: the segment as it is (close() would publish the head),
    ownership released."""
    ring.closed = True
    ring._mm.close()
    ring._shm.close_fd()


def reread(name: str, tmp_path: Path) -> tuple[list[int], int]:
    """What the next owner reads back from the segment: the seqs of the records it
    recovers, in order, and the corrupt regions it counted."""
    again = ShmRing.attach(name, CAP, PID, tmp_path)
    try:
        return [r[5] for r in again.recovered], again.corrupt
    finally:
        again.close(unlink=True)


def poke(name: str, find: bytes, data: bytes, delta: int = 0) -> None:
    """Overwrite bytes of the segment at the first occurrence of ``find`` (+ ``delta``)."""
    shm = posix_ipc.SharedMemory(name, 0)
    try:
        with mmap.mmap(shm.fd, os.fstat(shm.fd).st_size) as mm:
            i = mm.find(find, HEADER_SIZE)
            assert i > 0, find
            mm[i + delta : i + delta + len(data)] = data
    finally:
        shm.close_fd()


def test_wraps_around_many_laps_and_recovers_exactly_the_unsettled(
    name: str, tmp_path: Path
) -> None:
    """10 laps of a 64 KiB ring, acks lagging 100 records: a crash leaves exactly those 100."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    n = 0
    for i in range(6000):  # ~ 10 laps of 168-byte frames
        assert ring.put(rec(i, 100 + i % 37))
        n += 1
        if i >= 100:
            ring.settle(i - 100)
    assert ring.pending == 100
    crash(ring)
    again = ShmRing.attach(name, CAP, PID, tmp_path)
    try:
        assert [r[5] for r in again.recovered] == list(range(n - 100, n))
        assert again.corrupt == 0
        topic, key, value, headers, ts, seq = again.recovered[0]
        assert (topic, key, ts, headers) == ("topic", b"k%d" % seq, 1000 + seq, None)
        assert value is not None
        assert value.startswith(b"rec-%06d|" % seq)
    finally:
        again.close(unlink=True)


def test_full_ring_refuses_until_the_oldest_is_settled(name: str, tmp_path: Path) -> None:
    """put() returns False when full; settling the oldest records makes room again."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    try:
        i = 0
        while ring.put(rec(i, 1000)):
            i += 1
        assert 50 < i < 70
        assert not ring.put(rec(i, 1000))
        ring.settle(5)  # not the oldest: no room yet
        assert not ring.put(rec(i, 1000))
        for s in range(5):
            ring.settle(s)
        assert ring.put(rec(i, 1000))
        with pytest.raises(RecordTooLargeError):
            ring.put(rec(i + 1, CAP // 2 + 1))
    finally:
        ring.close(unlink=True)


def segment_bytes(name: str, off: int, n: int) -> bytes:
    shm = posix_ipc.SharedMemory(name, 0)
    try:
        with mmap.mmap(shm.fd, os.fstat(shm.fd).st_size) as mm:
            return mm[off : off + n]
    finally:
        shm.close_fd()


def write_at(name: str, off: int, data: bytes) -> None:
    shm = posix_ipc.SharedMemory(name, 0)
    try:
        with mmap.mmap(shm.fd, os.fstat(shm.fd).st_size) as mm:
            mm[off : off + len(data)] = data
    finally:
        shm.close_fd()


def frame_start(name: str, i: int) -> int:
    """Segment offset of record ``i``'s frame (its value follows a 24-byte frame header,
    30 bytes of lengths, the topic and the key)."""
    shm = posix_ipc.SharedMemory(name, 0)
    try:
        with mmap.mmap(shm.fd, os.fstat(shm.fd).st_size) as mm:
            return (
                mm.find(b"rec-%06d|" % i, HEADER_SIZE) - 24 - 30 - len(b"topic") - len(b"k%d" % i)
            )
    finally:
        shm.close_fd()


def test_frames_past_the_published_head_are_read_back_a_torn_write_is_not(
    name: str, tmp_path: Path
) -> None:
    """The head is published lazily (every eighth of this ring): the records written
    since are found by their pos and CRC. A frame whose magic and CRC were not yet written
    (the crash tore the put, send() had not returned) is the end, and not counted."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    for i in range(10):
        ring.put(rec(i))
    assert read_index(segment_bytes(name, HEAD_SLOTS, 32), 0) == 0  # not published yet
    crash(ring)
    write_at(name, frame_start(name, 9), bytes(12))  # body written, header not yet
    assert reread(name, tmp_path) == (list(range(9)), 0)


def test_a_torn_copy_of_the_head_falls_back_to_the_other(name: str, tmp_path: Path) -> None:
    """A crash in the middle of the head's first copy: the second (the value before) is
    read, and every record after it is still found."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    for i in range(300):  # ~45 KiB of frames: the head is published several times
        ring.put(rec(i))
        if i >= 50:
            ring.settle(i - 50)
    ring.drain_settled()  # as the producer's pump does after each poll
    slots = segment_bytes(name, HEAD_SLOTS, 32)
    assert read_index(slots, 0) not in (None, 0)
    crash(ring)
    write_at(name, HEAD_SLOTS, b"\xff" * 5 + slots[5:16] + slots[16:])
    assert reread(name, tmp_path) == (list(range(250, 300)), 0)


@pytest.mark.parametrize(
    ("where", "delta"),
    [("payload", 3), ("frame header", -40)],
)
def test_corrupt_frames_are_counted_and_skipped_never_hiding_later_ones(
    name: str, tmp_path: Path, where: str, delta: int
) -> None:
    """Garbage in three frames (payload or header), before and after the published head:
    those three are skipped and counted, every other record is read back, in order."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    for i in range(200):
        ring.put(rec(i))
    head = read_index(segment_bytes(name, HEAD_SLOTS, 32), 0)
    assert head is not None
    assert 0 < head < frame_start(name, 198) - HEADER_SIZE  # 198 is past the published head
    crash(ring)
    for victim in (20, 100, 198):
        poke(name, b"rec-%06d|" % victim, b"\x00garbage\xff", delta)
    again = ShmRing.attach(name, CAP, PID, tmp_path)
    try:
        assert again.corrupt == 3, where
        assert [r[5] for r in again.recovered] == [i for i in range(200) if i not in (20, 100, 198)]
    finally:
        again.close(unlink=True)


def test_corrupt_last_frame_past_the_published_head_reads_as_the_end(
    name: str, tmp_path: Path
) -> None:
    """The documented blind spot of the lazy head: garbage in the last frame written since
    the head was published, with no frame after it, cannot be told from a put a crash
    tore. It is skipped (nothing after it is hidden) but not counted."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    for i in range(200):
        ring.put(rec(i))
    crash(ring)
    poke(name, b"rec-%06d|" % 199, b"\x00garbage\xff", 3)
    assert reread(name, tmp_path) == (list(range(199)), 0)


class _SwitchAfterPop(dict[int, int]):
    """The ring's open-slot map, running ``hook`` right after a pop: the thread switch
    that lets a writer run between a drain taking a settled slot and flagging it."""

    hook: Callable[[], None] | None = None

    def pop(self, key: int, *default: int) -> int:  # type: ignore[override]
        value = super().pop(key, *default)
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return value


def test_settle_racing_a_writer_never_flags_the_record_that_reuses_its_slot(
    name: str, tmp_path: Path
) -> None:
    """A full ring; record 0 is settled, and the drain that flags it (the pump's, after a
    poll) is interrupted after taking slot 0, while a writer thread puts record 512 in the
    space it frees. The writer must wait for the drain's flag write: were the flag written
    into the new frame, record 512 would be read back as settled (lost)."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    frame = ("topic", b"k", b"v" * 68, None, 1, 0)  # a 128-byte frame: 512 fill the ring
    for i in range(CAP // 128):
        assert ring.put((*frame[:5], i))
    assert not ring.put((*frame[:5], 512))  # full
    hooked = _SwitchAfterPop(ring._open)
    ring._open = hooked
    writer = threading.Thread(target=lambda: ring.put((*frame[:5], 512)))

    def switch() -> None:
        writer.start()
        writer.join(0.5)  # the writer runs now if nothing holds it back

    hooked.hook = switch
    ring.settle(0)
    assert 0 in hooked  # settle() only notes it: no pop yet
    ring.drain_settled()
    writer.join(10)
    assert ring.pending == 512
    crash(ring)
    again = ShmRing.attach(name, CAP, PID, tmp_path)
    try:
        assert again.corrupt == 0
        assert [r[5] for r in again.recovered] == [*range(1, 512), 512]
    finally:
        again.close(unlink=True)


class _SwitchAfterIter(dict[int, int]):
    """The ring's open-slot map, running ``hook`` right after an iterator over it is made:
    the thread switch that lets another thread run between a drain's ``iter()`` over the
    open set and its ``next()``."""

    hook: Callable[[], None] | None = None

    def __iter__(self) -> Iterator[int]:
        it = super().__iter__()
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return it


def _in_thread(fn: Callable[[], object]) -> threading.Thread:
    """Run ``fn`` in a thread and give it half a second: the thread switch."""
    t = threading.Thread(target=fn)
    t.start()
    t.join(0.5)
    return t


def test_a_put_between_a_drains_look_at_the_oldest_frame_and_its_read_is_harmless(
    name: str, tmp_path: Path
) -> None:
    """The pump drains (no send lock) while a sender puts (send lock only): a put landing
    between the drain's iter() over the open set and its next() must not fail the drain
    (a dict that changed size during iteration raises RuntimeError), nor lose the frame."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    try:
        for i in range(5):
            assert ring.put(rec(i))
        hooked = _SwitchAfterIter(ring._open)
        ring._open = hooked
        writer: list[threading.Thread] = []
        hooked.hook = lambda: writer.append(_in_thread(lambda: ring.put(rec(5))))
        ring.settle(0)
        ring.drain_settled()
        writer[0].join(10)
        assert list(hooked) == [1, 2, 3, 4, 5]
        assert ring.pending == 5
    finally:
        ring.close(unlink=True)


def test_close_waits_for_a_drain_under_way_in_another_thread(name: str, tmp_path: Path) -> None:
    """stats() (any thread) drains the settled frames; close() running meanwhile must not
    unmap the ring under it (a flag or tail written into a closed mapping raises
    ValueError): close() waits for the drain, which then finds the ring open or closed."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    for i in range(5):
        assert ring.put(rec(i))
    hooked = _SwitchAfterIter(ring._open)
    ring._open = hooked
    closer: list[threading.Thread] = []
    hooked.hook = lambda: closer.append(_in_thread(lambda: ring.close(unlink=True)))
    ring.settle(0)
    assert ring.stats()["shm_records"] == 4
    closer[0].join(10)
    assert ring.closed
    assert name not in list_segments()


def test_settled_records_are_not_read_back(name: str, tmp_path: Path) -> None:
    """Records acknowledged out of order (several partitions) are not resent after a crash
    once their frames are flagged (the producer's pump drains right after each poll); the
    ones settled after the last drain are resent: duplicates, never a loss."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    for i in range(50):
        ring.put(rec(i))
    for i in range(0, 50, 3):
        ring.settle(i)
    ring.drain_settled()
    ring.settle(1)  # acknowledged, but the crash comes before the next drain
    crash(ring)
    again = ShmRing.attach(name, CAP, PID, tmp_path)
    try:
        assert [r[5] for r in again.recovered] == [i for i in range(50) if i % 3]
    finally:
        again.close(unlink=True)


def test_second_live_owner_gets_a_clear_error(name: str, tmp_path: Path) -> None:
    """One live owner per segment; once it is gone, the next one attaches."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    try:
        with pytest.raises(
            ShmInUseError, match=f"in use by a live producer \\(pid {os.getpid()}\\)"
        ):
            ShmRing.attach(name, CAP, PID, tmp_path)
    finally:
        crash(ring)
    ShmRing.attach(name, CAP, PID, tmp_path).close(unlink=True)


def test_a_look_from_outside_does_not_refuse_the_next_owner(name: str, tmp_path: Path) -> None:
    """`logsdk shm list` (or a producer counting its slots' records) asks whether the owner
    lives with a shared lock held for an instant: a producer attaching at that instant
    takes the segment, not a ShmInUseError naming the dead owner."""
    import fcntl

    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    ring.put(rec(0))
    crash(ring)
    seg = posix_ipc.SharedMemory(name, 0)
    fcntl.flock(seg.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # as owner_alive() does
    look = threading.Timer(0.01, fcntl.flock, (seg.fd, fcntl.LOCK_UN))
    look.start()
    try:
        again = ShmRing.attach(name, CAP, PID, tmp_path)
    finally:
        look.join()
        seg.close_fd()
    try:
        assert [r[5] for r in again.recovered] == [0]
    finally:
        again.close(unlink=True)


def test_segment_of_another_producer_is_refused(name: str, tmp_path: Path) -> None:
    """Records of producer A are never resent under producer B's id."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    ring.put(rec(1))
    crash(ring)
    with pytest.raises(ShmError, match=r"holds records of producer p+"):
        ShmRing.attach(name, CAP, "q" * 32, tmp_path / "other")


def test_mode_0600_and_clean_close_unlinks(name: str, tmp_path: Path) -> None:
    """The segment is private to its user, and a clean close removes it."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    assert stat.S_IMODE(os.stat(f"/dev/shm{name}").st_mode) == 0o600
    assert name in list_segments()
    ring.close(unlink=True)
    assert name not in list_segments()


def test_inspect_and_remove(name: str, tmp_path: Path) -> None:
    """inspect() shows pending records and a dead owner; remove() refuses a live one."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    for i in range(7):
        ring.put(rec(i))
    info = inspect(name)
    assert (info.pending, info.owner_alive, info.owner_pid) == (7, True, os.getpid())
    with pytest.raises(ShmInUseError):
        remove(name)
    crash(ring)
    info = inspect(name)
    assert (info.pending, info.owner_alive, info.spool_dir) == (7, False, str(tmp_path))
    remove(name)
    with pytest.raises(ShmError, match="no shared memory segment"):
        inspect(name)


@pytest.mark.parametrize("size", [0, HEADER_SIZE + CAP])
def test_a_half_made_segment_is_shown_empty_and_removed(name: str, size: int) -> None:
    """A segment its writer died making (0 bytes, or sized with no magic yet) holds no
    record: inspect() says so and remove() unlinks it (logsdk agent names this command for
    one left half-made)."""
    posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size).close_fd()
    info = inspect(name)
    assert (info.size, info.pending, info.owner_alive) == (size, 0, False)
    remove(name)
    with pytest.raises(ShmError, match="no shared memory segment"):
        inspect(name)


def test_names() -> None:
    """A name is derived from the spool dir, or checked."""
    assert segment_name(None, "/a/b") == segment_name(None, "/a/b/")
    assert segment_name(None, "/a/b") != segment_name(None, "/a/c")
    assert segment_name("app-1", "/x") == "/app-1"
    with pytest.raises(ShmError, match="not usable"):
        segment_name("a/b", "/x")
    # A directory name in another encoding (Latin-1 bytes, surrogate-escaped by Python):
    # named from its bytes; a UTF-8 name keeps the name it had (its bytes are the same).
    latin = os.fsdecode(b"/srv/caf\xe9")
    assert segment_name(None, latin) == segment_name(None, os.fsdecode(b"/srv/caf\xe9/"))
    assert segment_name(None, latin) != segment_name(None, "/srv/café")
    digest = hashlib.sha256("/srv/café".encode()).hexdigest()[:16]
    assert segment_name(None, "/srv/café") == f"/logsdk-{digest}"


def test_not_a_ring_is_refused(name: str, tmp_path: Path) -> None:
    """A foreign segment under the name is never overwritten."""
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=HEADER_SIZE + CAP)
    with mmap.mmap(shm.fd, HEADER_SIZE + CAP) as mm:
        mm[:5] = b"hello"
    shm.close_fd()
    with pytest.raises(ShmError, match="not a logsdk ring"):
        ShmRing.attach(name, CAP, PID, tmp_path)


def test_crash_while_initialising_leaves_a_segment_the_next_attach_initialises(
    name: str, tmp_path: Path
) -> None:
    """The magic is written last: a segment whose header is half written (magic still
    zero, indexes unset) is taken as never initialised, not as a ring full of garbage."""
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    crash(ring)
    shm = posix_ipc.SharedMemory(name, 0)
    with mmap.mmap(shm.fd, HEADER_SIZE + CAP) as mm:
        mm[:8] = bytes(8)
        mm[HEAD_SLOTS : HEAD_SLOTS + 64] = bytes(64)  # head and tail never written
    shm.close_fd()
    again = ShmRing.attach(name, CAP, PID, tmp_path)
    try:
        assert (again.recovered, again.corrupt) == ([], 0)
        assert again.put(rec(1))
    finally:
        again.close(unlink=True)


class _Recorder(bytearray):
    """A bytearray that records each slice assignment (offset, bytes) made to it."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.writes: list[tuple[int, bytes]] = []

    def __setitem__(self, key: object, value: object) -> None:
        if isinstance(key, slice) and isinstance(value, bytes | bytearray):
            self.writes.append((key.start, bytes(value)))
        super().__setitem__(key, value)  # type: ignore[index]


def _torn(data: bytes) -> Iterator[list[int]]:
    """The byte positions of ``data`` that may have landed when a crash stopped its copy:
    any subset of its aligned 8-byte words (an aligned 8-byte store is one instruction),
    and any prefix or suffix of its bytes (a byte-wise copy, either direction)."""
    words = len(data) // 8
    for mask in range(1 << words):
        yield [j for j in range(len(data)) if mask >> (j // 8) & 1]
    for k in range(len(data) + 1):
        yield list(range(k))
        yield list(range(len(data) - k, len(data)))


def test_an_index_torn_by_a_crash_reads_as_the_old_or_the_new_value() -> None:
    """A SIGKILL can stop the writer between any two stores of an index update: whatever
    part of the write in progress landed, the index reads as its old or its new value,
    never as unreadable (which made the next reader scan a lap of stale frames)."""
    old, new = 567_488, 567_560
    rec = _Recorder(32)
    publish_index(rec, 0, old)
    before = bytes(rec)
    rec.writes.clear()
    publish_index(rec, 0, new)
    steps = rec.writes
    assert len(steps) == 2
    assert all(len(b) == 16 for _, b in steps)
    for i, (off, data) in enumerate(steps):
        for landed in _torn(data):
            buf = bytearray(before)
            for o, d in steps[:i]:
                buf[o : o + len(d)] = d
            for j in landed:
                buf[off + j] = data[j]
            assert read_index(buf, 0) in (old, new), (i, landed)
    # What one pack_into over both copies could leave (CPython zero-fills its target
    # first): both copies unreadable. No layout survives that state, hence two writes.
    assert read_index(bytearray(32), 0) is None


def test_a_ring_larger_than_dev_shm_is_a_clear_error_at_open(name: str, tmp_path: Path) -> None:
    """Every page of the ring is allocated at open: on a /dev/shm without room for it,
    attach raises ShmError (a sparse segment would instead kill the process with SIGBUS at
    the first write to a page tmpfs cannot supply) and leaves no segment behind."""
    st = os.statvfs("/dev/shm")
    too_big = st.f_blocks * st.f_frsize + (1 << 30)
    with pytest.raises(ShmError, match=r"cannot allocate .* lower shm_bytes"):
        ShmRing.attach(name, too_big, PID, tmp_path)
    assert name not in list_segments()
    with pytest.raises(posix_ipc.ExistentialError):
        posix_ipc.SharedMemory(name, 0)


def test_a_crash_between_any_two_operations_resends_every_open_record(
    name: str, tmp_path: Path
) -> None:
    """A model check of the lazy head and of the tail the drain moves: random frame sizes
    (wraps, pads, a full ring), acknowledgements out of order, drains at random; after
    each of 3000 operations, the segment's bytes as a crash would leave them are read back
    in a second segment. Every record put and not yet settled must be there, in order,
    nothing corrupt, the published tail never past the published head; what comes back
    beyond that are settled records (duplicates)."""
    rng = random.Random(7)
    ring = ShmRing.attach(name, CAP, PID, tmp_path)
    image = f"{name}-image"
    try:
        open_: set[int] = set()
        put: list[int] = []
        seq = 0
        for op in range(3000):
            r = rng.random()
            if r < 0.6:
                if ring.put(rec(seq, rng.choice((20, 100, 700, 3000, rng.randrange(4000))))):
                    open_.add(seq)
                    put.append(seq)
                seq += 1
            elif r < 0.62:  # everything acknowledged: the tail may catch up with the head
                for s in sorted(open_):
                    ring.settle(s)
                open_.clear()
                ring.drain_settled()
            elif r < 0.9 and open_:
                # mostly the oldest (in order), sometimes any (another partition)
                s = min(open_) if rng.random() < 0.7 else rng.choice(sorted(open_))
                open_.discard(s)
                ring.settle(s)
            else:
                ring.drain_settled()
            if op % 7:
                continue
            shm = posix_ipc.SharedMemory(image, posix_ipc.O_CREX, mode=0o600)
            try:
                os.ftruncate(shm.fd, HEADER_SIZE + CAP)
                with mmap.mmap(shm.fd, HEADER_SIZE + CAP) as mm:
                    mm[:] = ring._mm[:]
                    head, tail = read_index(mm, HEAD_SLOTS), read_index(mm, HEAD_SLOTS + 32)
                    assert head is not None
                    assert tail is not None
                    assert tail <= head, op  # else a reader takes the indexes as torn
            finally:
                shm.close_fd()
            again = ShmRing.attach(image, CAP, PID, tmp_path)
            try:
                got = [r[5] for r in again.recovered]
                assert again.corrupt == 0, op
                assert got == sorted(got), op
                assert open_ <= set(got), (op, sorted(open_ - set(got)))
                assert set(got) <= set(put), op
            finally:
                again.close(unlink=True)
    finally:
        ring.close(unlink=True)
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(image)


def test_a_crafted_head_near_2_64_is_refused_in_bounded_time(name: str, tmp_path: Path) -> None:
    """A segment whose head and tail were set near 2**64 (crafted, or damaged) is refused
    with ShmError by inspect() and attach(), never a struct.error or a scan of 2**64."""
    from logsdk.shm._segment import HEAD_OFF, TAIL_OFF

    ring = ShmRing.attach(name, 64 * 1024, "p" * 32, tmp_path)
    for i in range(5):
        ring.put(rec(i))
    ring.close(unlink=False)
    shm = posix_ipc.SharedMemory(name, 0)
    try:
        with mmap.mmap(shm.fd, HEADER_SIZE) as mm:
            publish_index(mm, HEAD_OFF, (1 << 64) - 5)
            publish_index(mm, TAIL_OFF, (1 << 64) - 100)
    finally:
        shm.close_fd()
    with pytest.raises(ShmError, match="out of range"):
        inspect(name)
    with pytest.raises(ShmError, match="out of range"):
        ShmRing.attach(name, 64 * 1024, "p" * 32, tmp_path)
