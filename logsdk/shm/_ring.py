"""A ring of records in POSIX shared memory that outlives a crash of the process writing it.

Layout (little-endian): a 4096-byte header, then ``capacity`` bytes of frames.

    header   0  8s   magic b"LOGSDKR1"
             8  u32  version             12  u32 header size
            16  u64  capacity            24  u32 owner pid   28 u32 reserved
            32  u64  reserved            40  32s producer id (ASCII)
            72  u16  spool dir length    74  spool dir (UTF-8, at most 400 bytes)
           512  head: u64 value, u64 value ^ MASK, the same again (32 bytes)
           544  tail: the same
    frame    0  u32  magic (REC or PAD)
             4  u32  CRC32 of bytes [12, 24 + L)  (PAD: of [12, 24))
             8  u8   settled (1: acknowledged by Kafka or committed to the spool)
            12  u32  L, the payload length
            16  u64  pos, the frame's absolute position
            24  payload: u64 seq, i64 timestamp, u16 topic length, i32 key, value and
                headers lengths (-1: None), then topic, key, value, headers; the frame is
                padded to a multiple of 8 bytes

Invariants:
- positions only grow (offset = pos % capacity); a frame is valid only where its stored
  pos equals the position it is read at and its CRC matches, so a stale frame from an
  earlier lap, a torn write or corrupt bytes are never taken for a record, and a reader
  that meets one resynchronises on the next valid frame instead of stopping;
- ``tail`` is published before the space behind it is reused, so every frame from the
  tail on is readable at every instant. ``head`` is published lazily, by the writer: when
  the frames written since the last publication would pass ``_SYNC`` bytes (256 KiB; an
  eighth of a smaller ring), when a put finds the ring full, after a wrap, and at close.
  Frames past it are found by their pos and CRC (a frame's CRC is written after its
  body, so a put torn by a crash reads as invalid). They all end within ``_SYNC`` bytes
  of the published head; a reader scans ``2 * _SYNC`` bytes past it (the margin covers a
  torn copy of the head read as its previous value), skipping invalid regions, and
  stops. An invalid region before the published head, or followed by a valid frame, is
  counted as corrupt; one past it with no valid frame after it is the put a crash
  interrupted (send() had not returned) and is not counted. The price: garbage written
  into the last frames put since the head was published, with no valid frame after
  them, is skipped without being counted;
- every page of the segment is allocated at open (``posix_fallocate``): a sparse segment
  on a full /dev/shm would kill the writer with SIGBUS at its first touch of a page;
- head and tail are each stored twice with a check word, the two copies written one after
  the other by separate writes: a crash tears at most one copy, and a reader takes the
  first valid one (never both at once with one ``struct.pack_into``: CPython zero-fills
  the whole target before it packs, so a crash at that instant left both copies
  unreadable);
- a record's frame stays unsettled until Kafka acknowledged it or the spool committed it,
  and the tail never passes an unsettled frame. :meth:`ShmRing.settle` only notes the
  seq; :meth:`ShmRing.drain_settled` (the producer's pump, after each poll) and the
  writer, when it publishes the head, move the tail up to the oldest unsettled frame and
  flag the settled frames past it, under one lock, so no flag is ever written into space
  the tail has already given back. A crash before that resends the record: a duplicate,
  never a loss;
- one live owner per segment: an exclusive ``flock`` on the segment's descriptor, which
  the kernel releases when the owner dies, so a dead owner never blocks recovery.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import re
import stat
import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import posix_ipc
from zlib_ng.zlib_ng import crc32

from logsdk._fork import at_fork_in_child, fork_guard
from logsdk.errors import RecordTooLargeError, ShmError, ShmInUseError
from logsdk.spool._codec import Headers, Row, encode_headers
from logsdk.spool._spool import Spool

log = logging.getLogger("logsdk.shm")

MAGIC = b"LOGSDKR1"
VERSION = 1
HEADER_SIZE = 4096
MIN_CAPACITY = 64 * 1024
#: Where Linux shows POSIX shared memory segments (used to list them).
SHM_DIR = Path("/dev/shm")

_MASK = 0xA5A5_5A5A_C3C3_3C3C
_POS_MAX = 1 << 62  # positions beyond it are refused (see _recover)
_HDR = struct.Struct("<8sIIQIIQ32sH")
_DIR_OFF = _HDR.size
_DIR_MAX = 400
_SLOTS = struct.Struct("<QQQQ")
_SLOT = struct.Struct("<QQ")  # one copy of an index: value, value ^ _MASK
_HEAD_OFF = 512
_TAIL_OFF = 544

_FMAGIC = b"LGR"  # the first three bytes of every frame, searched for when resynchronising
_REC = int.from_bytes(_FMAGIC + b"\x01", "little")
_PAD = int.from_bytes(_FMAGIC + b"\x02", "little")
_FRAME = 24  # frame header bytes
_FHDR = struct.Struct("<IIIIQ")  # magic, crc, flags, L, pos
_F3 = struct.Struct("<III")  # magic, crc, flags: written once the body is in place
_FIXED = 30  # payload bytes before topic, key, value, headers
_BODY = struct.Struct("<IQQqHiii")  # L, pos, seq, ts, topic len, key, value, headers len
_PAYLOAD = struct.Struct("<QqHiii")
_PADBODY = struct.Struct("<IQ")
_SYNC = 256 * 1024  # bytes of frames between two publications of the head, at most

_NAME_RE = re.compile(r"^/[A-Za-z0-9._-]{1,200}$")


def segment_name(name: str | None, spool_dir: str | os.PathLike[str]) -> str:
    """The POSIX name of a producer's segment: ``name`` checked, or one derived from the
    spool directory (so a producer restarted on the same directory finds its segment)."""
    if name is None:
        # The path's bytes (a name the file system gave in another encoding is
        # surrogate-escaped by Python: str.encode() would refuse it; fsencode gives its
        # bytes back, the same as UTF-8 for any other path).
        digest = hashlib.sha256(os.fsencode(os.path.realpath(spool_dir))).hexdigest()[:16]
        return f"/logsdk-{digest}"
    full = name if name.startswith("/") else f"/{name}"
    if not _NAME_RE.match(full):
        raise ShmError(
            f"shm_name {name!r} is not usable: use 1-200 characters from A-Z a-z 0-9 . _ -"
        )
    return full


@dataclass(frozen=True)
class SegmentInfo:
    """What ``logsdk shm list`` shows about one segment."""

    name: str
    size: int
    capacity: int
    pending: int
    corrupt: int
    owner_pid: int
    owner_alive: bool
    producer_id: str
    spool_dir: str


class ShmRing:
    """The ring buffer of one producer; see the module docstring for the layout.

    Create it with :meth:`attach`. Writes (:meth:`put`) must be serialised by the caller
    (the producer holds its send lock); :meth:`settle` and :meth:`drain_settled` may be
    called from any thread.

    Who owns what (docs/engineering/design.md, "Who owns what"): the head, the fast-path
    bound and the topic cache belong to the writer (the send lock's holder, not one
    thread); the tail, the settled flags and the removals from the open set to the drain
    (the settle lock, which :meth:`_advance` and :meth:`close` take too); :meth:`settle`
    is a list append from any thread; the open set gets inserts from the writer and
    removals from the drain, each one dict operation under the GIL.
    """

    def __init__(self, name: str, shm: posix_ipc.SharedMemory, mm: mmap.mmap) -> None:
        self.name = name
        self._shm = shm
        self._mm = mm
        self.capacity = len(mm) - HEADER_SIZE
        self._head = 0
        self._head_pub = 0  # the head as last published: the tail never passes it
        self._tail = 0
        self._sync = min(_SYNC, self.capacity // 8)
        # put() writes frames ending up to here without a look at the indexes: the end of
        # the lap, of the room before the tail, and of _sync bytes past the published head.
        self._fast_until = 0
        # -- in-process bookkeeping: the shared bytes are for recovery, never trusted live --
        # seq -> position of its unsettled frame, in ring order (a dict keeps insertion
        # order, and frames are written in position order): the first is the tail.
        self._open: dict[int, int] = {}
        self._topics: dict[str, bytes] = {}
        self._settled: list[int] = []  # seqs settle() noted, not yet flagged in the ring
        #: ``settle(seq)``: the record ``seq`` is acknowledged or committed to the spool:
        #: free its slot. Only notes it (any thread, no lock; the list's own append, called
        #: once per acknowledgement); :meth:`drain_settled` or the writer's next advance
        #: lets the tail pass the frame, or flags it.
        self.settle: Callable[[int], None] = self._settled.append
        # Flagging settled frames (drain) and the tail's advance (the writer) take this
        # lock, so a slot's settled flag is written before its space can be reused.
        self._settle_lock = threading.Lock()
        self.recovered: list[Row] = []  # unsettled records a dead owner left behind
        self.corrupt = 0  # corrupt regions skipped while reading them
        self.n_recovered = 0  # records moved to the spool at attach
        self.closed = False
        self._capacity_wanted = self.capacity
        self._reserved = False  # every page allocated (_reserve)
        self._start = 0  # where positions continue after reset()
        self._producer_id = ""
        self._spool_dir = ""

    # -- open / close --------------------------------------------------------------------

    @classmethod
    def attach(
        cls, name: str, capacity: int, producer_id: str, spool_dir: str | os.PathLike[str]
    ) -> ShmRing:
        """Open or create the segment and take ownership of it.

        A segment left by a dead owner is read first: its unsettled records are in
        :attr:`recovered` (and the corrupt regions skipped in :attr:`corrupt`) until
        :meth:`reset` discards them, which the caller does once they are safe elsewhere.
        Raises :class:`ShmInUseError` while another live process owns the segment.
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
                return cls._take(name, shm, capacity, producer_id, os.fspath(spool_dir))
            except BaseException:
                shm.close_fd()
                raise

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
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner_pid(fd)
            raise ShmInUseError(
                f"shared memory segment {name} is in use by a live producer (pid {owner}); "
                "give each producer its own shm_name (or spool_dir)"
            ) from None
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise ShmError(f"shared memory segment {name} belongs to uid {st.st_uid}, not us")
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
        start = 0
        ring: ShmRing | None = None
        if st.st_size >= HEADER_SIZE + MIN_CAPACITY:
            with mmap.mmap(fd, HEADER_SIZE) as head_page:
                magic = head_page[:8]
                blank = head_page[:HEADER_SIZE] == bytes(HEADER_SIZE)
            if magic == MAGIC:
                ring = cls(name, shm, _map(fd, st.st_size))
                try:
                    ring._check_header(producer_id)
                    ring._recover()
                except BaseException:
                    ring._mm.close()
                    raise
                start = ring._head
            elif not blank and magic != bytes(8):
                raise ShmError(
                    f"shared memory segment {name} is not a logsdk ring; remove it "
                    f"(logsdk shm remove {name}) or pick another shm_name"
                )
        elif st.st_size != 0:
            raise ShmError(f"shared memory segment {name} is truncated ({st.st_size} bytes)")
        if ring is None:
            try:
                ring = cls._fresh(name, shm, capacity)
            except ShmError:
                if st.st_size == 0:  # ours, and empty: leave nothing behind in /dev/shm
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
        _reserve(name, shm.fd, HEADER_SIZE + capacity)
        ring = cls(name, shm, _map(shm.fd, HEADER_SIZE + capacity))
        ring._reserved = True
        return ring

    def reset(self) -> None:
        """Forget every record in the ring (the recovered ones are safe elsewhere now) and
        make it ready for writing, at the requested capacity, owned by this process."""
        capacity = self._capacity_wanted
        if capacity != self.capacity:
            self._mm[0:8] = bytes(8)  # uninitialised until the new header is complete
            self._mm.close()
            _reserve(self.name, self._shm.fd, HEADER_SIZE + capacity)
            self._mm = _map(self._shm.fd, HEADER_SIZE + capacity)
            self.capacity = capacity
        elif not self._reserved:  # a dead owner's segment may be sparse (an older logsdk)
            _reserve(self.name, self._shm.fd, HEADER_SIZE + capacity)
        self._reserved = True
        # Positions continue after the old head: no stale frame can ever match one.
        start = (self._start + 7) // 8 * 8
        mm = self._mm
        d = self._spool_dir.encode()[:_DIR_MAX]
        # The magic is written last: a crash before it leaves a segment that reads as not
        # yet initialised (magic all zero), which the next attach initialises again.
        _HDR.pack_into(
            mm, 0, bytes(8), VERSION, HEADER_SIZE, self.capacity, os.getpid(), 0, 0,
            self._producer_id.encode()[:32], len(d),
        )  # fmt: skip
        mm[_DIR_OFF : _DIR_OFF + len(d)] = d
        self._publish_tail(start)
        self._publish_head(start)
        mm[0:8] = MAGIC
        self._head = start
        self._fast_until = start  # the first put() goes through _make_room()
        self._open.clear()
        self._settled.clear()
        self.recovered = []

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

    def _check_header(self, producer_id: str) -> None:
        _m, version, hsize, capacity, _pid, _r, _r2, pid_b, _dl = _HDR.unpack_from(self._mm, 0)
        if version != VERSION or hsize != HEADER_SIZE or capacity != self.capacity:
            raise ShmError(
                f"shared memory segment {self.name} has an unknown layout (version {version}, "
                f"capacity {capacity}); remove it with `logsdk shm remove {self.name}`"
            )
        owner = pid_b.rstrip(b"\0").decode(errors="replace")
        if owner and owner != producer_id:
            raise ShmError(
                f"shared memory segment {self.name} holds records of producer {owner}, but "
                f"this spool dir belongs to producer {producer_id}; start the producer on the "
                f"spool dir {self._header_dir()!r} to resend them, or remove the segment"
            )

    def _header_dir(self) -> str:
        (n,) = struct.unpack_from("<H", self._mm, _DIR_OFF - 2)
        return bytes(self._mm[_DIR_OFF : _DIR_OFF + min(n, _DIR_MAX)]).decode(errors="replace")

    # -- writing (caller serialises) -------------------------------------------------------

    def put(
        self, rec: tuple[str, bytes | None, bytes | None, Headers | None, int | None, int]
    ) -> bool:
        """Write one record; False when the ring has no room for it now.

        Raises :class:`RecordTooLargeError` for a record that could never fit (a frame
        above half the capacity).
        """
        topic, k, v, h, ts, seq = rec
        return self.put_fields(topic, k, v, h, ts, seq)

    def put_fields(
        self,
        topic: str,
        k: bytes | None,
        v: bytes | None,
        h: Headers | None,
        ts: int | None,
        seq: int,
    ) -> bool:
        """:meth:`put` of a record given field by field (the producer's send path)."""
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
        n = _FIXED + len(tb) + len(k) + len(v) + len(hb)
        size = (_FRAME + n + 7) & ~7
        pos = self._head
        if pos + size > self._fast_until:
            # The frame wraps, the ring may be full, or the head is due to be published.
            if not self._make_room(size):
                return False
            pos = self._head
        b = HEADER_SIZE + pos % self.capacity
        # One copy of the payload: the body is assembled once, written once, summed once.
        body = b"".join(
            (_BODY.pack(n, pos, seq, -1 if ts is None else ts, len(tb), kl, vl, hl), tb, k, v, hb)
        )
        mm = self._mm
        mm[b + 12 : b + 24 + n] = body
        _F3.pack_into(mm, b, _REC, crc32(body), 0)  # magic and CRC last: see the layout
        self._open[seq] = pos
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
            mm = self._mm
            if room >= _FRAME:  # below that, readers skip to the next lap by themselves
                pad = _PADBODY.pack(room - _FRAME, pos)
                b = HEADER_SIZE + off
                mm[b + 12 : b + 24] = pad
                _F3.pack_into(mm, b, _PAD, crc32(pad), 0)
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
        if self._settled:
            with self._settle_lock:
                self._drain()

    def drain_all(self) -> None:
        """:meth:`drain_settled`, and wait for a drain under way in another thread: once
        this returns, every seq settled before the call has had its frame flagged and left
        the open set, so the seq may name a new record."""
        with self._settle_lock:
            self._drain()

    def _drain(self) -> None:
        """Take the settled records out of the open set, publish the tail at the oldest
        frame still open, and flag the settled frames the tail has not passed (records
        acknowledged out of order), so a recovering reader skips them.

        Caller holds _settle_lock: nothing else moves the tail meanwhile, so every frame
        still in _open is at or past the tail and its flag byte is its own."""
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
        first = _first_key(open_)
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
        _publish_slot(self._mm, _HEAD_OFF, head)
        self._head_pub = head  # only now may a drain move the tail up to it

    def _publish_tail(self, tail: int) -> None:
        _publish_slot(self._mm, _TAIL_OFF, tail)
        self._tail = tail  # only now may put() reuse the space behind it

    @property
    def pending(self) -> int:
        """Records in the ring that are neither acknowledged nor in the spool."""
        self.drain_settled()
        return len(self._open)

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

    def _recover(self, quiet: bool = False) -> None:
        head, tail = _slot(self._mm, _HEAD_OFF), _slot(self._mm, _TAIL_OFF)
        cap = self.capacity
        if any(x is not None and x > _POS_MAX for x in (head, tail)):
            # No ring gets there (2**62 bytes written); a crafted or damaged header does,
            # and positions past it would overflow the u64 fields.
            raise ShmError(
                f"shared memory segment {self.name}: head/tail position out of range "
                f"({head}, {tail}); the segment is damaged: remove it (logsdk shm remove "
                f"{self.name})"
            )
        if head is None:
            if not quiet:
                log.error("shm %s: head index unreadable; scanning one full lap", self.name)
            head = (tail or 0) + cap
        if tail is None or tail > head or head - tail > cap:
            if not quiet:
                log.error("shm %s: tail index unreadable; scanning one full lap", self.name)
            tail = max(0, head - cap)
        rows: list[Row] = []
        limit = min(tail + cap, head + 2 * self._sync)
        # Positions go on after the scanned window (reset()), past every frame written
        # after the head was published: none of those can ever match a new position.
        self._head, self._tail = max(head, limit), tail
        for off in self._valid_frames(tail, head, limit):
            if self._mm[off + 8] == 0:
                row = self._decode(off)
                if row is None:
                    self.corrupt += 1
                else:
                    rows.append(row)
        self.recovered = rows
        if self.corrupt and not quiet:
            log.error(
                "shm %s: %d corrupt region(s) skipped while reading the ring",
                self.name,
                self.corrupt,
            )

    def _valid_frames(self, tail: int, head: int, limit: int) -> Iterator[int]:
        """Byte offsets of the valid REC frames from ``tail`` on: up to the published
        ``head``, then those starting before ``limit`` (written after the head was last
        published). Counts the corrupt regions: an invalid region followed by a valid
        frame, or one before ``head``; past ``head``, an invalid region with no valid frame
        after it is the end (a write a crash interrupted, or nothing)."""
        cap = self.capacity
        end = tail + cap  # no frame reaches past this
        pos = tail
        while pos < limit:
            room = cap - pos % cap
            if room < _FRAME:
                pos += room
                continue
            size = self._frame_size(pos, end)
            if size is None:
                nxt = self._resync(pos + 8, limit, end)
                if nxt < limit or pos < head:
                    self.corrupt += 1
                pos = nxt
                continue
            off = HEADER_SIZE + pos % cap
            if struct.unpack_from("<I", self._mm, off)[0] == _REC:
                yield off
            pos += size

    def _frame_size(self, pos: int, end: int) -> int | None:
        """Size of the valid frame at ``pos`` (PAD: up to the lap's end), None if invalid."""
        cap = self.capacity
        room = cap - pos % cap
        if room < _FRAME or pos % 8:
            return None
        b = HEADER_SIZE + pos % cap
        magic, crc, _flags, n, fpos = _FHDR.unpack_from(self._mm, b)
        if fpos != pos:
            return None
        if magic == _PAD:
            if n != room - _FRAME or crc32(self._mm[b + 12 : b + 24]) != crc:
                return None
            return room
        if magic != _REC or n < _FIXED or _FRAME + n > room:
            return None
        size = (_FRAME + int(n) + 7) & ~7
        if pos + size > end or crc32(self._mm[b + 12 : b + _FRAME + n]) != crc:
            return None
        return size

    def _resync(self, pos: int, limit: int, end: int) -> int:
        """The position of the next valid frame starting at or after ``pos`` and before
        ``limit`` (``limit`` if none); no frame reaches past ``end``."""
        cap, mm = self.capacity, self._mm
        pos = (pos + 7) // 8 * 8
        while pos < limit:
            off = pos % cap
            stop = min(limit, pos + cap - off)  # this lap's end
            lo, hi = HEADER_SIZE + off, HEADER_SIZE + off + (stop - pos)
            i = mm.find(_FMAGIC, lo, hi)
            while i != -1:
                cand = pos + (i - lo)
                if cand % 8 == 0 and self._frame_size(cand, end) is not None:
                    return cand
                i = mm.find(_FMAGIC, i + 1, hi)
            pos = stop
        return end

    def _decode(self, off: int) -> Row | None:
        mm = self._mm
        n = struct.unpack_from("<I", mm, off + 12)[0]
        seq, ts, tl, kl, vl, hl = _PAYLOAD.unpack_from(mm, off + _FRAME)
        if tl + max(kl, 0) + max(vl, 0) + max(hl, 0) != n - _FIXED:
            return None
        i = off + _FRAME + _FIXED
        try:
            topic = bytes(mm[i : i + tl]).decode()
        except UnicodeDecodeError:
            return None
        i += tl
        parts: list[bytes | None] = []
        for ln in (kl, vl, hl):
            if ln < 0:
                parts.append(None)
            else:
                parts.append(bytes(mm[i : i + ln]))
                i += ln
        return (topic, parts[0], parts[1], parts[2], None if ts < 0 else ts, seq)


def _first_key(d: dict[int, int]) -> int | None:
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


def _reserve(name: str, fd: int, size: int) -> None:
    """Size the segment and allocate every page of it now. A sparse segment on a full
    /dev/shm would kill the process with SIGBUS at the first write to a page that cannot
    be allocated; here it is a clear error at open instead."""
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # give back what was allocated
        free = ""
        with contextlib.suppress(OSError):
            st = os.statvfs(SHM_DIR)
            free = f" ({st.f_bavail * st.f_frsize >> 20} MiB free in {SHM_DIR})"
        raise ShmError(
            f"cannot allocate {size} bytes for shared memory segment {name}{free}: {exc}; "
            "lower shm_bytes or make room in /dev/shm"
        ) from exc


def _map(fd: int, size: int) -> mmap.mmap:
    """Map the whole segment read-write, its page tables filled at once where the platform
    can (MAP_POPULATE): no page fault on the send path during the first lap."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, size, flags=flags)


def _publish_slot(mm: mmap.mmap | bytearray, off: int, value: int) -> None:
    """Store an index (head or tail) at ``off``: the first copy, then the second.

    Two slice assignments (each a plain copy), not one ``pack_into`` over both copies:
    CPython's ``pack_into`` zero-fills its whole target before it writes the fields, and a
    SIGKILL at that instant left both copies zero, the head unreadable, and the next
    reader scanning a whole lap of stale frames (seen once in 20 random SIGKILLs).
    """
    b = _SLOT.pack(value, value ^ _MASK)
    mm[off : off + 16] = b
    mm[off + 16 : off + 32] = b


def _slot(mm: mmap.mmap | bytearray, off: int) -> int | None:
    a, ac, b, bc = _SLOTS.unpack_from(mm, off)
    if a ^ _MASK == ac:
        return int(a)
    if b ^ _MASK == bc:
        return int(b)
    return None


def _owner_pid(fd: int) -> int:
    try:
        with mmap.mmap(fd, HEADER_SIZE, prot=mmap.PROT_READ) as mm:
            return int(_HDR.unpack_from(mm, 0)[4])
    except (OSError, ValueError):
        return 0


# -- inspection (the CLI) ---------------------------------------------------------------------


def _owner_alive(fd: int) -> bool:
    """True while a live process holds the segment's ownership lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def inspect(name: str) -> SegmentInfo:
    """Read a segment without taking it over (its owner may be alive and writing)."""
    try:
        shm = posix_ipc.SharedMemory(name, 0)
    except posix_ipc.ExistentialError:
        raise ShmError(f"no shared memory segment named {name}") from None
    except (posix_ipc.Error, OSError) as exc:
        raise ShmError(f"cannot open shared memory segment {name}: {exc}") from exc
    try:
        size = os.fstat(shm.fd).st_size
        alive = _owner_alive(shm.fd)
        if size < HEADER_SIZE + MIN_CAPACITY:
            raise ShmError(f"{name} is not a logsdk ring ({size} bytes)")
        with mmap.mmap(shm.fd, size, prot=mmap.PROT_READ) as mm:
            magic, _v, _h, capacity, pid, _r, _r2, pid_b, dlen = _HDR.unpack_from(mm, 0)
            if magic != MAGIC or capacity != size - HEADER_SIZE:
                raise ShmError(f"{name} is not a logsdk ring")
            spool_dir = bytes(mm[_DIR_OFF : _DIR_OFF + min(dlen, _DIR_MAX)]).decode(
                errors="replace"
            )
            ring = ShmRing(name, shm, mm)
            ring._recover(quiet=True)
            pending, corrupt = len(ring.recovered), ring.corrupt
    finally:
        shm.close_fd()
    return SegmentInfo(
        name=name,
        size=size,
        capacity=capacity,
        pending=pending,
        corrupt=corrupt,
        owner_pid=pid,
        owner_alive=alive,
        producer_id=pid_b.rstrip(b"\0").decode(errors="replace"),
        spool_dir=spool_dir,
    )


def list_segments() -> list[str]:
    """Names of the logsdk rings this user can see (Linux: the files in /dev/shm)."""
    names: list[str] = []
    try:
        entries = sorted(os.scandir(SHM_DIR), key=lambda e: e.name)
    except OSError:
        return names
    uid = os.geteuid()
    for e in entries:
        try:
            if not e.is_file() or e.stat().st_uid != uid:
                continue
            with open(e.path, "rb") as f:
                if f.read(8) == MAGIC:
                    names.append("/" + e.name)
        except OSError:
            continue
    return names


def remove(name: str) -> None:
    """Unlink a segment; refuses while its owner is alive."""
    info = inspect(name)
    if info.owner_alive:
        raise ShmInUseError(
            f"{name} is owned by a live process (pid {info.owner_pid}); close that producer"
        )
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        raise ShmError(f"no shared memory segment named {name}") from None


def open_for_producer(spool: Spool, name: str | None, capacity: int) -> ShmRing:
    """Attach a producer's ring. Records a dead owner left unsettled are committed to the
    spool first (one transaction, with their original seq), so the ordinary replay path
    resends them, oldest first, with the same ``logsdk.producer``/``logsdk.seq`` headers."""
    seg = segment_name(name, spool.directory)
    ring = ShmRing.attach(seg, capacity, spool.producer_id, spool.directory)
    rows = ring.recovered
    if rows:
        try:
            spool.append(rows)
            ring.reset()  # only now: until the commit, the ring is their only copy
        except BaseException:
            ring.close(unlink=False)
            raise
        ring.n_recovered = len(rows)
        log.warning(
            "shm %s: %d unacknowledged record(s) left by a dead producer moved to the spool; "
            "they are resent first",
            seg,
            len(rows),
        )
    return ring
