"""A ring of records in POSIX shared memory that outlives a crash of the process writing it.

`ShmRing` is one producer's ring: its writer puts records as frames
(`logsdk.shm._frames`) into a segment (`logsdk.shm._segment`: the header, the
head and tail indexes, the pages, the ownership lock); what a dead owner left is read back
as a recovering reader reads it (`logsdk.shm._frames.read_ring()`).

Invariants:
- positions only grow (offset = pos % capacity), also across owners (a new owner goes on
  after the scanned window): a stale frame of an earlier lap never matches a position;
- ``tail`` is published before the space behind it is reused, so every frame from the
  tail on is readable at every instant. ``head`` is published lazily, by the writer: when
  the frames written since the last publication would pass ``sync_bytes`` (256 KiB; an
  eighth of a smaller ring), when a put finds the ring full, after a wrap, and at close;
  a reader finds the frames past it by their pos and CRC (`logsdk.shm._frames`);
- a record's frame stays unsettled until Kafka acknowledged it or the spool committed it,
  and the tail never passes an unsettled frame. `ShmRing.settle()` only notes the
  seq; `ShmRing.drain_settled()` (the producer's pump, after each poll) and the
  writer, when it publishes the head, move the tail up to the oldest unsettled frame and
  flag the settled frames past it, under one lock, so no flag is ever written into space
  the tail has already given back. A crash before that resends the record: a duplicate,
  never a loss;
- a ring ``drained_elsewhere`` (``delivery="agent"``) never has its tail moved here: the
  writer follows the tail its reader publishes (`logsdk.shm._reader.TailFollower`);
- one live owner per segment (its ``flock``, `logsdk.shm._segment.take_ownership()`);
  a forked child closes its copies of the descriptors that hold it
  (`_leave_segments_to_parent()`).

Owner: see `ShmRing`.
"""

from __future__ import annotations

import array
import contextlib
import logging
import mmap
import os
import threading
import weakref
from collections.abc import Callable

import posix_ipc
from zlib_ng.zlib_ng import crc32

from logsdk._fork import at_fork_in_child, fork_guard
from logsdk.errors import RecordTooLargeError, ShmError
from logsdk.shm._frames import (
    BODY,
    F3,
    FIXED,
    FRAME,
    REC,
    Scan,
    read_ring,
    sync_bytes,
    write_pad,
)
from logsdk.shm._reader import TailFollower, first_key
from logsdk.shm._segment import (
    HEAD_OFF,
    HEADER_SIZE,
    MAGIC,
    MIN_CAPACITY,
    TAIL_OFF,
    UNFINISHED,
    check_header,
    holds_ring,
    map_segment,
    publish_index,
    reserve,
    take_ownership,
    write_header,
)
from logsdk.spool._codec import Headers, Row, encode_headers

log = logging.getLogger("logsdk.shm")


class ShmRing:
    """The ring buffer of one producer (see the module docstring; the layout is
    `logsdk.shm._segment`'s and `logsdk.shm._frames`').

    Create it with `attach()`. Writes (`put()`) must be serialised by the caller
    (the producer holds its send lock); `settle()` and `drain_settled()` may be
    called from any thread.

    Who owns what (docs/engineering/design.md, "Who owns what"): the head, the fast-path
    bound and the topic cache belong to the writer (the send lock's holder, not one
    thread); the tail, the settled flags and the removals from the open set to the drain
    (the settle lock, which `_advance()` and `close()` take too); `settle()`
    is a list append from any thread; the open set gets inserts from the writer and
    removals from the drain, each one dict operation under the GIL.
    """

    def __init__(
        self, name: str, shm: posix_ipc.SharedMemory, mm: mmap.mmap, found: Scan | None = None
    ) -> None:
        """``found``: what a reading of the segment found (a dead owner's ring)."""
        self.name = name
        self.drained_elsewhere = False  # an agent reads the frames and moves the tail
        self._shm = shm
        self._mm = mm
        self.capacity = len(mm) - HEADER_SIZE
        self._head = 0
        self._head_pub = 0  # the head as last published: the tail never passes it
        self._tail = 0
        self._sync = sync_bytes(self.capacity)
        # put() writes frames ending up to here without a look at the indexes: the end of
        # the lap, of the room before the tail, and of _sync bytes past the published head.
        self._fast_until = 0
        # -- in-process bookkeeping: the shared bytes are for recovery, never trusted live --
        # seq -> position of its unsettled frame, in ring order (a dict keeps insertion
        # order, and frames are written in position order): the first is the tail.
        self._open: dict[int, int] = {}
        self._follower: TailFollower | None = None
        self._fifo: array.array[int] | None = None  # the follower's positions, for put()
        self._topics: dict[str, bytes] = {}
        self._settled: list[int] = []  # seqs settle() noted, not yet flagged in the ring
        #: ``settle(seq)``: the record ``seq`` is acknowledged or committed to the spool:
        #: free its slot. Only notes it (any thread, no lock; the list's own append, called
        #: once per acknowledgement); `drain_settled()` or the writer's next advance
        #: lets the tail pass the frame, or flags it.
        self.settle: Callable[[int], None] = self._settled.append
        # Flagging settled frames (drain) and the tail's advance (the writer) take this
        # lock, so a slot's settled flag is written before its space can be reused.
        self._settle_lock = threading.Lock()
        self.recovered: list[Row] = []  # unsettled records a dead owner left behind
        self.corrupt = 0  # corrupt regions skipped while reading them
        if found is not None:
            self._head, self._tail = found.head, found.tail
            self.recovered, self.corrupt = found.rows, found.corrupt
        self.n_recovered = 0  # records handed over at attach (hand_over)
        self.closed = False
        self._capacity_wanted = self.capacity
        self._reserved = False  # every page allocated (reserve)
        self._start = 0  # where positions continue after reset()
        self._producer_id = ""
        self._spool_dir = ""

    # -- open / close --------------------------------------------------------------------

    @classmethod
    def attach(
        cls,
        name: str,
        capacity: int,
        producer_id: str,
        spool_dir: str | os.PathLike[str],
        *,
        drained_elsewhere: bool = False,
    ) -> ShmRing:
        """Open or create the segment and take ownership of it (``drained_elsewhere``: see
        the module docstring).

        A segment left by a dead owner is read first: its unsettled records are in
        `recovered` (and the corrupt regions skipped in `corrupt`) until
        `reset()` discards them, which the caller does once they are safe elsewhere.
        Raises `ShmInUseError` while another live process owns the segment.
        """
        if capacity < MIN_CAPACITY:
            raise ShmError(f"shm_bytes must be at least {MIN_CAPACITY}, got {capacity}")
        capacity = capacity // 8 * 8
        # Under the fork guard until _HELD knows the ring: a child forked in between would
        # hold a copy of the locked descriptor that nothing closes (_leave_segments_to_parent).
        with fork_guard:
            try:
                shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREAT, mode=0o600)
            except (posix_ipc.Error, OSError, ValueError) as exc:
                raise ShmError(f"cannot open shared memory segment {name}: {exc}") from exc
            try:
                ring = cls._take(name, shm, capacity, producer_id, os.fspath(spool_dir))
            except BaseException:
                shm.close_fd()
                raise
            ring.drained_elsewhere = drained_elsewhere
            if drained_elsewhere:
                ring._follower = TailFollower()
                ring._fifo = ring._follower.positions
            return ring

    @classmethod
    def _take(
        cls,
        name: str,
        shm: posix_ipc.SharedMemory,
        capacity: int,
        producer_id: str,
        spool_dir: str,
    ) -> ShmRing:
        fd = shm.fd
        size = take_ownership(name, fd)
        start = 0
        if holds_ring(name, fd, size):
            mm = map_segment(fd, size)
            try:
                check_header(mm, name, size - HEADER_SIZE, producer_id)
                # What a dead owner left: its unsettled records and the corrupt regions
                # skipped; positions go on after the scanned window.
                found = read_ring(mm, size - HEADER_SIZE, name)
            except BaseException:
                mm.close()
                raise
            ring = cls(name, shm, mm, found)
            start = found.head
        else:
            try:
                ring = cls._fresh(name, shm, capacity)
            except ShmError:
                if size == 0:  # ours, and empty: leave nothing behind in /dev/shm
                    with contextlib.suppress(posix_ipc.ExistentialError):
                        shm.unlink()
                raise
        _HELD.add(ring)  # this process holds the segment's lock through ring._shm
        ring._capacity_wanted = capacity
        ring._start = start
        ring._producer_id = producer_id
        ring._spool_dir = spool_dir
        if not ring.recovered:
            ring.reset()
        return ring

    @classmethod
    def _fresh(cls, name: str, shm: posix_ipc.SharedMemory, capacity: int) -> ShmRing:
        reserve(name, shm.fd, HEADER_SIZE + capacity)
        ring = cls(name, shm, map_segment(shm.fd, HEADER_SIZE + capacity))
        ring._reserved = True
        return ring

    def reset(self) -> None:
        """Forget every record in the ring (the recovered ones are safe elsewhere now) and
        make it ready for writing, at the requested capacity, owned by this process."""
        capacity = self._capacity_wanted
        if capacity != self.capacity:
            self._mm[0:8] = UNFINISHED  # until the new header is complete
            self._mm.close()
            reserve(self.name, self._shm.fd, HEADER_SIZE + capacity)
            self._mm = map_segment(self._shm.fd, HEADER_SIZE + capacity)
            self.capacity = capacity
        elif not self._reserved:  # a dead owner's segment may be sparse (an older logsdk)
            reserve(self.name, self._shm.fd, HEADER_SIZE + capacity)
        self._reserved = True
        # Positions continue after the old head: no stale frame can ever match one.
        start = (self._start + 7) // 8 * 8
        mm = self._mm
        # The magic last (`UNFINISHED` until then): a crash before it, the next attach redoes it.
        write_header(mm, self.capacity, self._producer_id, self._spool_dir)
        self._publish_tail(start)
        self._publish_head(start)
        mm[0:8] = MAGIC
        self._head = start
        self._fast_until = start  # the first put() goes through _make_room()
        self._open.clear()
        self._settled.clear()
        self.recovered = []

    def hand_over(self, keep: Callable[[list[Row]], None]) -> int:
        """Give the records a dead owner left (`recovered`) to ``keep``, which makes
        them safe elsewhere (a producer commits them to its spool), then forget them
        (`reset()`); how many. Until ``keep`` returns the ring is their only copy: if
        it raises, they stay, and so does the ring's content."""
        rows = self.recovered
        if rows:
            keep(rows)
            self.reset()
            self.n_recovered = len(rows)
        return len(rows)

    def close(self, unlink: bool) -> None:
        """Unmap and release ownership; ``unlink`` removes the segment (a clean close).

        Called by the writer, once no put() can come (the producer refuses sends first).
        A drain under way in another thread (the pump's, or stats() on any thread) ends
        first: it writes into the mapping, and a drain after this finds ``closed``.
        """
        if self.closed:  # a ring closed already is never locked again (a forked child's
            return  # copy of the lock may be held for good by a thread it does not have)
        with self._settle_lock:
            if self.closed:
                return
            if not unlink:  # the next reader starts from the true head: no scan past it
                self._publish_head(self._head)
            self.closed = True
            if unlink:
                with contextlib.suppress(posix_ipc.ExistentialError):
                    self._shm.unlink()
            self._mm.close()
            _HELD.discard(self)
            self._shm.close_fd()

    # -- writing (caller serialises) -------------------------------------------------------

    def put(
        self, rec: tuple[str, bytes | None, bytes | None, Headers | None, int | None, int]
    ) -> bool:
        """Write one record; False when the ring has no room for it now. Raises
        `RecordTooLargeError` for a record that could never fit (over half the capacity)."""
        return self.put_fields(*rec)

    def put_fields(
        self,
        topic: str,
        k: bytes | None,
        v: bytes | None,
        h: Headers | None,
        ts: int | None,
        seq: int,
    ) -> bool:
        """`put()` of a record given field by field (the producer's send path)."""
        tb = self._topics.get(topic)
        if tb is None:
            tb = self._topic_bytes(topic)
        # Lengths as stored (-1: None); a None becomes b"" for the join.
        if k is None:
            k, kl = b"", -1
        else:
            kl = len(k)
        if v is None:
            v, vl = b"", -1
        else:
            vl = len(v)
        hb = encode_headers(h) if h else None
        if hb is None:
            hb, hl = b"", -1
        else:
            hl = len(hb)
        n = FIXED + len(tb) + len(k) + len(v) + len(hb)
        size = (FRAME + n + 7) & ~7
        pos = self._head
        if pos + size > self._fast_until:
            # The frame wraps, the ring may be full, or the head is due to be published.
            if not self._make_room(size):
                return False
            pos = self._head
        b = HEADER_SIZE + pos % self.capacity
        # One copy of the payload: the body is assembled once, written once, summed once.
        body = b"".join(
            (BODY.pack(n, pos, seq, -1 if ts is None else ts, len(tb), kl, vl, hl), tb, k, v, hb)
        )
        mm = self._mm
        mm[b + 12 : b + 24 + n] = body
        F3.pack_into(mm, b, REC, crc32(body), 0)  # magic and CRC last: see _frames
        if self._fifo is None:
            self._open[seq] = pos
        else:
            self._fifo.append(pos)
        self._head = pos + size
        return True

    def _make_room(self, size: int) -> bool:
        """Before a frame of ``size`` bytes at the head: publish the head, move the tail
        past the settled frames, and pad the end of the lap if the frame would cross it.
        False when the ring has no room for it now."""
        cap = self.capacity
        pos = self._head
        off = pos % cap
        room = cap - off
        need = size if size <= room else room + size
        self._advance()
        if pos + need - self._tail > cap:
            if size > cap // 2:
                raise RecordTooLargeError(
                    f"record of {size} bytes does not fit the shm ring (shm_bytes={cap})"
                )
            return False
        if size > room:
            write_pad(self._mm, pos, room, cap)
            pos += room
            off = 0
            self._head = pos
            # Published: a reader must not have to scan a long pad for the next frame.
            self._publish_head(pos)
        self._fast_until = min(pos + self._sync, pos - off + cap, self._tail + cap)
        return True

    def _topic_bytes(self, topic: str) -> bytes:
        tb = topic.encode()
        if len(self._topics) < 1024:
            self._topics[topic] = tb
        return tb

    def drain_settled(self) -> None:
        """Let the tail pass the frames of the records settled so far, and flag those it
        cannot pass yet, so a recovering reader skips them (fewer duplicates after a
        crash). Any thread; the producer's pump calls it after each poll."""
        if self._settled or self.drained_elsewhere:
            with self._settle_lock:
                self._drain()

    def drain_all(self) -> None:
        """`drain_settled()`, and wait for a drain under way in another thread: once
        this returns, every seq settled before the call has had its frame flagged and left
        the open set, so the seq may name a new record."""
        with self._settle_lock:
            self._drain()

    def publish_head(self) -> None:
        """Publish the head now (the writer: the caller serialises with put): a reader in
        another process may then move the tail up to the last frame written."""
        if not self.closed:
            self._publish_head(self._head)

    def _drain(self) -> None:
        """Take the settled records out of the open set, publish the tail at the oldest
        frame still open, and flag the settled frames the tail has not passed (records
        acknowledged out of order), so a recovering reader skips them.

        Caller holds _settle_lock: nothing else moves the tail meanwhile, so every frame
        still in _open is at or past the tail and its flag byte is its own."""
        if self._follower is not None:
            if not self.closed:
                self._tail = self._follower.follow(self._mm, self._tail, self._head)
            return
        settled = self._settled
        n = len(settled)
        done: list[int | None] = []
        if n:
            # Copy, then delete that prefix: settle() may append meanwhile (both are single
            # list operations under the GIL), and what it appends stays for the next drain.
            batch = settled[:n]
            del settled[:n]
            pop = self._open.pop
            done = [pop(seq, None) for seq in batch]
        if self.closed:  # unmapped: only the bookkeeping remains
            return
        open_ = self._open
        # The first key of the open set is its oldest frame (found past the entries removed
        # since the dict last compacted: amortised O(1) a settled record). Never past the
        # published head: a reader takes a tail beyond the head for a torn index.
        first = first_key(open_)
        tail = self._head_pub if first is None else min(open_[first], self._head_pub)
        if tail > self._tail:
            self._publish_tail(tail)
        tail = self._tail
        mm, cap = self._mm, self.capacity
        for pos in done:
            if pos is not None and pos >= tail:
                mm[HEADER_SIZE + 8 + pos % cap] = 1

    def _advance(self) -> None:
        """Publish the head, then the tail (caller serialises with put): the published
        tail never passes the published head."""
        self._publish_head(self._head)
        with self._settle_lock:  # a drain between its pop and its flag write ends first
            self._drain()

    def _publish_head(self, head: int) -> None:
        publish_index(self._mm, HEAD_OFF, head)
        self._head_pub = head  # only now may a drain move the tail up to it

    def _publish_tail(self, tail: int) -> None:
        publish_index(self._mm, TAIL_OFF, tail)
        self._tail = tail  # only now may put() reuse the space behind it

    @property
    def pending(self) -> int:
        """Records in the ring that are neither acknowledged nor in the spool."""
        self.drain_settled()
        if self._follower is None:
            return len(self._open)
        with self._settle_lock:  # not in the middle of a follow()
            return self._follower.pending

    def stats(self) -> dict[str, object]:
        """Gauges for ``LogProducer.stats()``."""
        return {
            "shm_name": self.name,
            "shm_capacity": self.capacity,
            "shm_records": self.pending,
            "shm_used_bytes": self._head - self._tail,
            "shm_recovered": self.n_recovered,
            "shm_corrupt": self.corrupt,
        }

    # -- reading (recovery, inspection) -----------------------------------------------------


#: The rings whose segment's ownership lock this process holds (their descriptor does).
_HELD: weakref.WeakSet[ShmRing] = weakref.WeakSet()


def _leave_segments_to_parent() -> None:
    """In a forked child: close this process's copies of the descriptors that hold the
    parent's segment locks (see ``logsdk.spool._dirlock._leave_locks_to_parent``: the same
    rule for the same reason), so a dead parent's ring is free for the next producer
    whatever the child does after the fork."""
    for ring in list(_HELD):
        # Two descriptors hold the lock: the segment's own and the mapping's (mmap keeps a
        # duplicate of the descriptor it was made from), so the child's copy of the mapping
        # goes too; the parent's ring is never used in the child (a producer starts afresh
        # there), and ``closed`` says so to any call that might come.
        ring.closed = True
        with contextlib.suppress(OSError, BufferError, ValueError):
            ring._mm.close()
        with contextlib.suppress(OSError, posix_ipc.Error, ValueError):
            ring._shm.close_fd()
    _HELD.clear()


at_fork_in_child(_leave_segments_to_parent)
