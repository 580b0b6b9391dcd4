"""Reading a live ring from another process: ``logsdk agent``'s side of
``LogProducer(delivery="agent")``.

The application writes its ring (`logsdk.shm.ShmRing`, ``drained_elsewhere``) and
never moves its tail; a `RingReader` in the agent takes its frames, and once each
record is safe (acknowledged by Kafka, or committed to the agent's spool) settles it:
flags its frame and moves the tail up to the oldest frame not settled. The writer
follows that tail to find room.

Names: the rings of one spool root are ``/logsdk-a<16 hex of the root's real path>-<producer
id>`` (`ring_name()`), so the agent of that root finds them by prefix in ``/dev/shm``
(`ring_names()`), and each application process (each fork) has a ring and a producer
id of its own.

Invariants:
- the segment is untrusted input (another local process wrote it, or a bug did): the
  header is checked (magic, version, sizes, the producer id's characters), each index
  is taken only within bounds, each frame only where its stored position and CRC match
  (`logsdk.shm._frames.FrameReader`), and a record's lengths must add up to the
  frame's; a frame that fails is counted (``corrupt``) and skipped, never delivered and
  never fatal;
- the tail never passes a frame taken and not settled, nor the head the writer published
  (a recovering reader takes a tail past the head for a torn index), nor the frames not
  read yet; a settled frame the tail cannot pass yet is flagged, so that the next reader
  (an agent restarted after a crash) skips it;
- while the writer lives, an invalid frame at or past its published head is a write not
  finished (or not begun): the reader waits for it. Once the writer is dead, a reader
  scans as a recovering owner does (`logsdk.shm._frames.read_ring()`): up to
  ``2 * sync_bytes`` past the head, and an invalid region with no valid frame after it
  is the end.

Owner: the thread that made the reader (the agent's thread); nothing else touches it.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import hashlib
import mmap
import os
import re
import struct
from collections.abc import Iterable

import posix_ipc

from logsdk._owner import Owner
from logsdk.errors import ShmError
from logsdk.shm._frames import FRAME, REC, FrameReader, sync_bytes
from logsdk.shm._segment import (
    HEAD_OFF,
    HEADER_SIZE,
    MAGIC,
    MIN_CAPACITY,
    POS_MAX,
    SHM_DIR,
    TAIL_OFF,
    UNFINISHED,
    VERSION,
    owner_alive,
    publish_index,
    read_header,
    read_index,
)
from logsdk.spool._codec import Row

#: A producer id the agent accepts: it names a directory of the agent's, so no dots (no
#: "." or ".." can name a directory outside it).
_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,32}")


def valid_producer_id(text: str) -> bool:
    """True when ``text`` may be a producer id of a ring (see ``_ID_RE``)."""
    return _ID_RE.fullmatch(text) is not None


def ring_prefix(spool_root: str | os.PathLike[str]) -> str:
    """The name prefix (without ``/``) of the rings of ``spool_root``."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(spool_root))).hexdigest()[:16]
    return f"logsdk-a{digest}-"


def ring_name(spool_root: str | os.PathLike[str], producer_id: str) -> str:
    """The POSIX name of the ring of producer ``producer_id`` under ``spool_root``."""
    return f"/{ring_prefix(spool_root)}{producer_id}"


def readable_uids(trusted: Iterable[int] = ()) -> frozenset[int]:
    """The owners whose rings a reader takes: this process's user, and ``trusted`` (an
    agent run as root for applications of other users, ``logsdk agent --trust-uid``)."""
    return frozenset((os.geteuid(), *trusted))


def ring_names(spool_root: str | os.PathLike[str], uids: frozenset[int] | None = None) -> list[str]:
    """The rings of ``spool_root`` that exist now, owned by one of ``uids`` (by default
    this user) only (Linux: /dev/shm)."""
    prefix = ring_prefix(spool_root)
    owners = readable_uids() if uids is None else uids
    out = []
    with contextlib.suppress(OSError):
        for e in os.scandir(SHM_DIR):
            if not e.name.startswith(prefix):
                continue
            with contextlib.suppress(OSError):
                if e.is_file(follow_symlinks=False) and e.stat().st_uid in owners:
                    out.append("/" + e.name)
    return sorted(out)


def first_key(d: dict[int, int]) -> int | None:
    """The first key of ``d`` (None if empty), while a writer may insert into it: put()
    adds a frame under the send lock only, and an insert between ``iter()`` and ``next()``
    makes ``next()`` raise RuntimeError (a dict that changed size during iteration; it
    never yields a wrong key). Only inserts race with the drainer (it alone removes, under
    the settle lock), and an insert never changes the first key of a non-empty dict: look
    again."""
    while True:
        try:
            return next(iter(d), None)
        except RuntimeError:
            continue


class TailFollower:
    """The writer's side of a ring drained elsewhere: the tail its reader publishes, and
    the positions of the frames written, oldest first (``positions[start:]``: what is
    pending).

    The positions are machine integers, not Python ones: the reader may settle 100,000
    frames at once, and freeing that many int objects (a deque popped, or a list's prefix
    deleted) took 55-95 ms of the sender's thread in one call after an outage healed; here
    one bisect finds them and one memmove drops them.

    Owner: the writer's ring. ``positions.append`` is called by its sender (under the
    send lock), ``follow`` and ``pending`` under the ring's settle lock: the array only
    grows at its end meanwhile (positions grow), so an index found stays right.
    """

    def __init__(self) -> None:
        self.positions: array.array[int] = array.array("q")
        self._start = 0

    @property
    def pending(self) -> int:
        return len(self.positions) - self._start

    def follow(self, mm: mmap.mmap, known: int, head: int) -> int:
        """The tail the reader published, taken only between the tail ``known`` here and
        the writer's ``head`` (else ``known``: the reader is another process, not trusted),
        with the positions it passed forgotten."""
        tail = read_index(mm, TAIL_OFF)
        if tail is None or not known <= tail <= head:
            return known
        if tail != known:
            positions = self.positions
            start = bisect.bisect_left(positions, tail, self._start)
            if start > 4096 and start * 2 > len(positions):
                del positions[:start]
                start = 0
            self._start = start
        return tail


class RingNotReadyError(ShmError):
    """The segment is a ring being made: its writer creates it empty, sizes it, writes its
    header, and its magic last. Open it again later; never a reason to give it up."""


class RingGoneError(ShmError):
    """The segment was unlinked after it was listed (its writer closed it, empty)."""


class RingReader:
    """The agent's reader of one application's ring (see the module docstring).

    Owner: the thread that made it (checked in every method that touches the mapping).
    """

    def __init__(self, name: str, uids: frozenset[int] | None = None) -> None:
        self.name = name
        self.owner = Owner(f"the reader of ring {name}")
        self._uids = readable_uids() if uids is None else uids
        try:
            shm = posix_ipc.SharedMemory(name, 0)
        except posix_ipc.ExistentialError:
            raise RingGoneError(f"no shared memory segment named {name}") from None
        except (posix_ipc.Error, OSError, ValueError) as exc:
            raise ShmError(f"cannot open shared memory segment {name}: {exc}") from exc
        self._shm = shm
        try:
            self._mm = self._map(name, shm.fd, self._uids)
        except BaseException:
            shm.close_fd()
            raise
        header = read_header(self._mm)
        self.capacity = header.capacity
        self.producer_id = header.producer_id
        self._sync = sync_bytes(self.capacity)
        self._frames = FrameReader(self._mm, self.capacity)
        head = self._head()
        tail = read_index(self._mm, TAIL_OFF)
        if tail is None or tail > head or head - tail > self.capacity:
            tail = max(0, head - self.capacity)  # a torn or forged tail: one lap back
        self._tail = tail
        #: Where the next frame is read.
        self.cursor = tail
        #: Positions of the frames taken and not settled yet, in ring order.
        self._open: dict[int, None] = {}
        #: The writer is dead and every frame up to its last one has been read.
        self.finished = False
        self.closed = False

    @staticmethod
    def _map(name: str, fd: int, uids: frozenset[int]) -> mmap.mmap:
        st = os.fstat(fd)
        if st.st_uid not in uids:
            raise ShmError(
                f"shared memory segment {name} belongs to uid {st.st_uid}, not us "
                f"(nor a uid the agent trusts: {sorted(uids)})"
            )
        size = st.st_size
        if size == 0:
            raise RingNotReadyError(f"{name} is being created (0 bytes)")
        if size < HEADER_SIZE + MIN_CAPACITY:
            raise ShmError(f"{name} is not a logsdk ring ({size} bytes)")
        mm = mmap.mmap(fd, size)
        try:
            header = read_header(mm)
            if header.magic == UNFINISHED:
                raise RingNotReadyError(f"{name} is being created (no magic yet)")
            if header.magic != MAGIC:
                raise ShmError(f"{name} is not a logsdk ring")
            if header.version != VERSION or header.header_size != HEADER_SIZE:
                raise ShmError(
                    f"ring {name} was written by another logsdk (layout version "
                    f"{header.version}, this agent reads {VERSION}): run an agent of the "
                    "application's logsdk version for it"
                )
            if header.capacity != size - HEADER_SIZE or header.capacity % 8:
                raise ShmError(f"ring {name}: capacity {header.capacity} does not match its size")
            if not valid_producer_id(header.producer_id):
                raise ShmError(f"ring {name}: producer id {header.producer_id!r} is not valid")
        except BaseException:
            mm.close()
            raise
        return mm

    def _head(self) -> int:
        """The head the writer published (0 when unreadable or out of range)."""
        head = read_index(self._mm, HEAD_OFF)
        return head if head is not None and head <= POS_MAX else 0

    def writer_alive(self) -> bool:
        """True while the application that writes the ring holds its lock."""
        return owner_alive(self._shm.fd)

    @property
    def open(self) -> int:
        """Frames taken and not settled yet."""
        return len(self._open)

    @property
    def corrupt(self) -> int:
        """Corrupt frames or regions met so far."""
        return self._frames.corrupt

    def take(self, limit: int, alive: bool) -> list[tuple[int, Row]]:
        """Up to ``limit`` records not taken yet, oldest first, with their positions
        (``alive``: the writer still lives; see the module docstring). A frame whose
        record does not decode is counted and skipped."""
        self.owner.check("read a ring")
        out: list[tuple[int, Row]] = []
        if self.closed or self.finished:
            return out
        cap, mm, frames = self.capacity, self._mm, self._frames
        head = max(self._head(), self._tail)
        end = self._tail + cap  # no frame reaches past it
        while len(out) < limit:
            pos = self.cursor
            if pos >= end:
                break  # a full lap from the tail: the writer waits for room
            room = cap - pos % cap
            if room < FRAME:
                if pos >= head and alive:
                    break  # the writer has not gone past the lap's end yet
                self.cursor = pos + room
                continue
            size = frames.frame_size(pos, end)
            if size is None:
                if pos < head:
                    # Written before the head was published: damaged. Go on at the next
                    # valid frame (the head, if none is before it).
                    nxt = frames.resync(pos + 8, head, end)
                    frames.corrupt += 1
                    self.cursor = min(nxt, head)
                    continue
                if alive:
                    break  # not written yet
                limit_pos = min(head + 2 * self._sync, end)
                nxt = frames.resync(pos + 8, limit_pos, end)
                if nxt >= limit_pos:
                    self.finished = True  # a write the writer's death interrupted, or none
                    break
                frames.corrupt += 1
                self.cursor = nxt
                continue
            off = HEADER_SIZE + pos % cap
            self.cursor = pos + size
            if struct.unpack_from("<I", mm, off)[0] != REC or mm[off + 8] != 0:
                continue  # a pad, or a record already settled (by an earlier agent)
            try:
                row = frames.decode(off)
            except (struct.error, ValueError, IndexError):
                row = None
            if row is None:
                frames.corrupt += 1
                continue
            self._open[pos] = None
            out.append((pos, row))
        return out

    def put_back(self, positions: list[int]) -> None:
        """The records just taken at ``positions`` (the last `take()`'s, oldest first)
        could not be made safe: forget them, to be taken again from the first."""
        if not positions:
            return
        for pos in positions:
            self._open.pop(pos, None)
        self.cursor = min(self.cursor, positions[0])
        self.finished = False  # they are still to be read

    def forget_open(self) -> None:
        """The records taken and not settled will never be reported (a client given up):
        read them again from the oldest."""
        if self._open:
            self.put_back(sorted(self._open))

    def reject(self, pos: int) -> None:
        """The record taken at ``pos`` is not deliverable (the agent found it invalid): it
        is counted corrupt and settled, so it is never read again."""
        self._frames.corrupt += 1
        self.settle([pos])

    def settle(self, positions: list[int]) -> None:
        """The records taken at ``positions`` are safe (in Kafka, or committed to the
        agent's spool): flag their frames and move the tail (see the module docstring)."""
        self.owner.check("settle a ring's frames")
        if self.closed:
            return
        open_ = self._open
        for pos in positions:
            open_.pop(pos, None)
        tail = min(self.cursor, max(self._head(), self._tail))
        if open_:
            tail = min(tail, next(iter(open_)))
        mm, cap = self._mm, self.capacity
        if tail > self._tail:
            publish_index(mm, TAIL_OFF, tail)
            self._tail = tail
        for pos in positions:
            if pos >= self._tail:
                mm[HEADER_SIZE + 8 + pos % cap] = 1

    def advance(self) -> None:
        """Move the tail as far as it may go now (the writer may have published its head
        since the last settle)."""
        self.settle([])

    @property
    def tail(self) -> int:
        """The tail as this reader last published it."""
        return self._tail

    def unlink(self) -> None:
        """Remove the segment (its writer is dead and everything in it is safe)."""
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(self.name)

    def close(self) -> None:
        """Unmap; the segment stays (its records are the writer's, or the next agent's)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(BufferError, ValueError):
            self._mm.close()
        with contextlib.suppress(OSError, posix_ipc.Error):
            self._shm.close_fd()
