"""The frames of a ring: a record's bytes in shared memory, and how a reader finds the
valid ones among stale, torn and corrupt bytes.

Layout (little-endian), from a position ``pos`` (``pos % capacity`` past the header of
the segment, `logsdk.shm._segment`):

    frame    0  u32  magic (REC or PAD)
             4  u32  CRC32 of bytes [12, 24 + L)  (PAD: of [12, 24))
             8  u8   settled (1: acknowledged by Kafka or committed to the spool)
            12  u32  L, the payload length
            16  u64  pos, the frame's absolute position
            24  payload: u64 seq, i64 timestamp, u16 topic length, i32 key, value and
                headers lengths (-1: None), then topic, key, value, headers; the frame is
                padded to a multiple of 8 bytes

A PAD frame fills the end of a lap a record does not fit in; fewer than `FRAME`
bytes left at the end of a lap are skipped by readers without one.

Invariants:
- positions only grow (offset = pos % capacity); a frame is valid only where its stored
  pos equals the position it is read at and its CRC matches, so a stale frame from an
  earlier lap, a torn write or corrupt bytes are never taken for a record, and a reader
  that meets one resynchronises on the next valid frame instead of stopping;
- a frame's magic and CRC are written after its body (`write_pad()`, and the ring's
  ``put``, which inlines the REC layout for speed), so a write torn by a crash reads as
  invalid;
- the writer publishes the head at most `sync_bytes()` bytes of frames apart, so a
  reader (`read_ring()`) scans ``2 * sync_bytes`` past it (the margin covers a torn
  copy of the head read as its previous value), skipping invalid regions, and stops. An
  invalid region before the published head, or followed by a valid frame, is counted as
  corrupt; one past it with no valid frame after it is the put a crash interrupted
  (send() had not returned) and is not counted. The price: garbage written into the last
  frames put since the head was published, with no valid frame after them, is skipped
  without being counted.

Owner: none (functions over a mapping, and `FrameReader`, owned by the call that
made it). The ring's writer writes frames; readers in any process read them.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import struct
from collections.abc import Iterator

from zlib_ng.zlib_ng import crc32

from logsdk.errors import ShmError
from logsdk.shm._segment import HEAD_OFF, HEADER_SIZE, POS_MAX, TAIL_OFF, read_index
from logsdk.spool._codec import Row

log = logging.getLogger("logsdk.shm")

FMAGIC = b"LGR"  # the first three bytes of every frame, searched for when resynchronising
REC = int.from_bytes(FMAGIC + b"\x01", "little")
PAD = int.from_bytes(FMAGIC + b"\x02", "little")
FRAME = 24  # frame header bytes
FHDR = struct.Struct("<IIIIQ")  # magic, crc, flags, L, pos
F3 = struct.Struct("<III")  # magic, crc, flags: written once the body is in place
FIXED = 30  # payload bytes before topic, key, value, headers
BODY = struct.Struct("<IQQqHiii")  # L, pos, seq, ts, topic len, key, value, headers len
PAYLOAD = struct.Struct("<QqHiii")
PADBODY = struct.Struct("<IQ")
SYNC = 256 * 1024  # bytes of frames between two publications of the head, at most


def sync_bytes(capacity: int) -> int:
    """Bytes of frames between two publications of the head, at most, in a ring of
    ``capacity``: `SYNC` (256 KiB), an eighth of a smaller ring."""
    return min(SYNC, capacity // 8)


def write_pad(mm: mmap.mmap, pos: int, room: int, capacity: int) -> None:
    """Fill the ``room`` bytes left in the lap from ``pos`` with a PAD frame (nothing when
    fewer than `FRAME` are left: readers skip to the next lap by themselves)."""
    if room >= FRAME:
        pad = PADBODY.pack(room - FRAME, pos)
        b = HEADER_SIZE + pos % capacity
        mm[b + 12 : b + 24] = pad
        F3.pack_into(mm, b, PAD, crc32(pad), 0)


@dataclasses.dataclass
class Scan:
    """What `read_ring()` found."""

    #: The unsettled records, oldest first.
    rows: list[Row]
    #: Corrupt regions skipped.
    corrupt: int
    #: Where positions may go on: past the scanned window, so past every frame written
    #: after the head was published (none of those can ever match a new position).
    head: int
    #: The tail the scan started from.
    tail: int


def read_ring(mm: mmap.mmap, capacity: int, name: str, quiet: bool = False) -> Scan:
    """The records a ring's frames hold that are not settled, from its tail (see the
    module docstring); ``quiet``: log nothing (an inspection). Raises `ShmError`
    for head or tail positions out of range (a damaged segment)."""
    head, tail = read_index(mm, HEAD_OFF), read_index(mm, TAIL_OFF)
    cap = capacity
    if any(x is not None and x > POS_MAX for x in (head, tail)):
        raise ShmError(
            f"shared memory segment {name}: head/tail position out of range "
            f"({head}, {tail}); the segment is damaged: remove it (logsdk shm remove "
            f"{name})"
        )
    if head is None:
        if not quiet:
            log.error("shm %s: head index unreadable; scanning one full lap", name)
        head = (tail or 0) + cap
    if tail is None or tail > head or head - tail > cap:
        if not quiet:
            log.error("shm %s: tail index unreadable; scanning one full lap", name)
        tail = max(0, head - cap)
    rows: list[Row] = []
    limit = min(tail + cap, head + 2 * sync_bytes(cap))
    reader = FrameReader(mm, cap)
    for off in reader.valid_frames(tail, head, limit):
        if mm[off + 8] == 0:
            row = reader.decode(off)
            if row is None:
                reader.corrupt += 1
            else:
                rows.append(row)
    if reader.corrupt and not quiet:
        log.error("shm %s: %d corrupt region(s) skipped while reading the ring", name,
                  reader.corrupt)  # fmt: skip
    return Scan(rows, reader.corrupt, max(head, limit), tail)


class FrameReader:
    """Reads the frames of one mapping (see the module docstring); ``corrupt`` counts the
    corrupt regions it met."""

    def __init__(self, mm: mmap.mmap, capacity: int) -> None:
        self.mm = mm
        self.capacity = capacity
        self.corrupt = 0

    def valid_frames(self, tail: int, head: int, limit: int) -> Iterator[int]:
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
            if room < FRAME:
                pos += room
                continue
            size = self.frame_size(pos, end)
            if size is None:
                nxt = self.resync(pos + 8, limit, end)
                if nxt < limit or pos < head:
                    self.corrupt += 1
                pos = nxt
                continue
            off = HEADER_SIZE + pos % cap
            if struct.unpack_from("<I", self.mm, off)[0] == REC:
                yield off
            pos += size

    def frame_size(self, pos: int, end: int) -> int | None:
        """Size of the valid frame at ``pos`` (PAD: up to the lap's end), None if invalid."""
        cap = self.capacity
        room = cap - pos % cap
        if room < FRAME or pos % 8:
            return None
        b = HEADER_SIZE + pos % cap
        magic, crc, _flags, n, fpos = FHDR.unpack_from(self.mm, b)
        if fpos != pos:
            return None
        if magic == PAD:
            if n != room - FRAME or crc32(self.mm[b + 12 : b + 24]) != crc:
                return None
            return room
        if magic != REC or n < FIXED or FRAME + n > room:
            return None
        size = (FRAME + int(n) + 7) & ~7
        if pos + size > end or crc32(self.mm[b + 12 : b + FRAME + n]) != crc:
            return None
        return size

    def resync(self, pos: int, limit: int, end: int) -> int:
        """The position of the next valid frame starting at or after ``pos`` and before
        ``limit`` (``limit`` if none); no frame reaches past ``end``."""
        cap, mm = self.capacity, self.mm
        pos = (pos + 7) // 8 * 8
        while pos < limit:
            off = pos % cap
            stop = min(limit, pos + cap - off)  # this lap's end
            lo, hi = HEADER_SIZE + off, HEADER_SIZE + off + (stop - pos)
            i = mm.find(FMAGIC, lo, hi)
            while i != -1:
                cand = pos + (i - lo)
                if cand % 8 == 0 and self.frame_size(cand, end) is not None:
                    return cand
                i = mm.find(FMAGIC, i + 1, hi)
            pos = stop
        return end

    def decode(self, off: int) -> Row | None:
        mm = self.mm
        n = struct.unpack_from("<I", mm, off + 12)[0]
        seq, ts, tl, kl, vl, hl = PAYLOAD.unpack_from(mm, off + FRAME)
        if tl + max(kl, 0) + max(vl, 0) + max(hl, 0) != n - FIXED:
            return None
        i = off + FRAME + FIXED
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
