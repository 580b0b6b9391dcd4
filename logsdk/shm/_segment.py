"""The POSIX shared-memory segment that holds a ring: its name, its header, its two
indexes, its pages, and who owns it.

Layout (little-endian): a 4096-byte header, then ``capacity`` bytes of frames
(`logsdk.shm._frames`).

    header   0  8s   magic b"LOGSDKR1"
             8  u32  version             12  u32 header size
            16  u64  capacity            24  u32 owner pid   28 u32 reserved
            32  u64  reserved            40  32s producer id (ASCII)
            72  u16  spool dir length    74  spool dir (UTF-8, at most 400 bytes)
           512  head: u64 value, u64 value ^ MASK, the same again (32 bytes)
           544  tail: the same

Invariants:
- the magic is written last (`write_header()` leaves it zero): a segment whose
  magic is zero reads as not yet initialised, and the next attach initialises it again;
- head and tail are each stored twice with a check word, the two copies written one after
  the other by separate writes (`publish_index()`): a crash tears at most one copy,
  and a reader takes the first valid one (`read_index()`). Never both at once with
  one ``struct.pack_into``: CPython zero-fills the whole target before it packs, so a
  crash at that instant left both copies unreadable;
- every page of the segment is allocated when it is sized (`reserve()`,
  ``posix_fallocate``): a sparse segment on a full /dev/shm would kill the writer with
  SIGBUS at its first touch of a page;
- one live owner per segment: an exclusive ``flock`` on the segment's descriptor, which
  the kernel releases when the owner dies, so a dead owner never blocks recovery
  (`owner_alive()` asks with a shared lock, dropped at once).

Owner: none (functions over a descriptor or a mapping). A segment belongs to the process
that holds its lock (`logsdk.shm._ring.ShmRing`); any process may read it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import re
import stat
import struct
import time
from pathlib import Path
from typing import NamedTuple

from logsdk.errors import ShmError, ShmInUseError

MAGIC = b"LOGSDKR1"
#: The magic of a segment its writer has not finished making (or is re-making): the
#: magic is written last, so a reader takes such a segment for one being made, not a foreign one.
UNFINISHED = bytes(8)
VERSION = 1
HEADER_SIZE = 4096
MIN_CAPACITY = 64 * 1024
#: Where Linux shows POSIX shared memory segments (used to list them).
SHM_DIR = Path("/dev/shm")
#: Positions beyond it are refused (no ring gets there: 2**62 bytes written; a crafted or
#: damaged header does, and positions past it would overflow the u64 fields).
POS_MAX = 1 << 62
HEAD_OFF = 512
TAIL_OFF = 544

_MASK = 0xA5A5_5A5A_C3C3_3C3C
_HDR = struct.Struct("<8sIIQIIQ32sH")
_DIR_OFF = _HDR.size
_DIR_MAX = 400
_SLOTS = struct.Struct("<QQQQ")
_SLOT = struct.Struct("<QQ")  # one copy of an index: value, value ^ _MASK

_NAME_RE = re.compile(r"^/[A-Za-z0-9._-]{1,200}$")


class Header(NamedTuple):
    """A segment's header, as `read_header()` found it."""

    magic: bytes
    version: int
    header_size: int
    capacity: int
    owner_pid: int
    producer_id: str
    spool_dir: str


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


def write_header(mm: mmap.mmap, capacity: int, producer_id: str, spool_dir: str) -> None:
    """Write the header of a ring of ``capacity`` owned by this process, magic left zero
    (the caller writes `MAGIC` once the rest of the segment is ready)."""
    d = spool_dir.encode()[:_DIR_MAX]
    _HDR.pack_into(
        mm, 0, UNFINISHED, VERSION, HEADER_SIZE, capacity, os.getpid(), 0, 0,
        producer_id.encode()[:32], len(d),
    )  # fmt: skip
    mm[_DIR_OFF : _DIR_OFF + len(d)] = d


def read_header(mm: mmap.mmap | bytes) -> Header:
    """The header of the segment mapped at ``mm``."""
    magic, version, hsize, capacity, pid, _r, _r2, pid_b, dlen = _HDR.unpack_from(mm, 0)
    spool_dir = bytes(mm[_DIR_OFF : _DIR_OFF + min(dlen, _DIR_MAX)]).decode(errors="replace")
    producer_id = pid_b.rstrip(b"\0").decode(errors="replace")
    return Header(magic, version, hsize, capacity, pid, producer_id, spool_dir)


def take_ownership(name: str, fd: int) -> int:
    """Take the segment's ownership lock for this process (see the module docstring) and
    make sure it is ours alone (this user's, mode 0600); its size. Raises
    `ShmInUseError` while a live process holds it."""
    # A look from outside (`owner_alive()`: `logsdk shm list`, a producer counting its
    # slots' records) holds a shared lock for an instant: a refusal is tried again for
    # 50 ms before it is taken for a live owner.
    deadline = time.monotonic() + 0.05
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.001)
                continue
            owner = owner_pid(fd)
            raise ShmInUseError(
                f"shared memory segment {name} is in use by a live producer (pid {owner}); "
                "give each producer its own shm_name (or spool_dir)"
            ) from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise ShmError(f"shared memory segment {name} belongs to uid {st.st_uid}, not us")
    if stat.S_IMODE(st.st_mode) != 0o600:
        os.fchmod(fd, 0o600)
    return st.st_size


def holds_ring(name: str, fd: int, size: int) -> bool:
    """True when the segment (``size`` bytes) holds a ring, False when it is new (empty, or
    its header blank or never finished: the magic is written last). Raises
    `ShmError` for anything else: a segment that is not a logsdk ring, or one too
    small to be one."""
    if size >= HEADER_SIZE + MIN_CAPACITY:
        with mmap.mmap(fd, HEADER_SIZE) as head_page:
            magic = head_page[:8]
            blank = head_page[:HEADER_SIZE] == bytes(HEADER_SIZE)
        if magic == MAGIC:
            return True
        if not blank and magic != UNFINISHED:
            raise ShmError(
                f"shared memory segment {name} is not a logsdk ring; remove it "
                f"(logsdk shm remove {name}) or pick another shm_name"
            )
    elif size != 0:
        raise ShmError(f"shared memory segment {name} is truncated ({size} bytes)")
    return False


def check_header(mm: mmap.mmap, name: str, capacity: int, producer_id: str) -> None:
    """Refuse a ring's header of another layout than this logsdk writes (or of another
    ``capacity`` than the segment's), or one that names another producer: its records are
    that producer's to resend."""
    header = read_header(mm)
    if (
        header.version != VERSION
        or header.header_size != HEADER_SIZE
        or header.capacity != capacity
    ):
        raise ShmError(
            f"shared memory segment {name} has an unknown layout (version "
            f"{header.version}, capacity {header.capacity}); remove it with "
            f"`logsdk shm remove {name}`"
        )
    owner = header.producer_id
    if owner and owner != producer_id:
        raise ShmError(
            f"shared memory segment {name} holds records of producer {owner}, but "
            f"this spool dir belongs to producer {producer_id}; start the producer on the "
            f"spool dir {header.spool_dir!r} to resend them, or remove the segment"
        )


def publish_index(mm: mmap.mmap | bytearray, off: int, value: int) -> None:
    """Store an index (head or tail) at ``off``: the first copy, then the second.

    Two slice assignments (each a plain copy), not one ``pack_into`` over both copies:
    CPython's ``pack_into`` zero-fills its whole target before it writes the fields, and a
    SIGKILL at that instant left both copies zero, the head unreadable, and the next
    reader scanning a whole lap of stale frames (seen once in 20 random SIGKILLs).
    """
    b = _SLOT.pack(value, value ^ _MASK)
    mm[off : off + 16] = b
    mm[off + 16 : off + 32] = b


def read_index(mm: mmap.mmap | bytearray, off: int) -> int | None:
    """The index stored at ``off``: its first valid copy, None when neither is."""
    a, ac, b, bc = _SLOTS.unpack_from(mm, off)
    if a ^ _MASK == ac:
        return int(a)
    if b ^ _MASK == bc:
        return int(b)
    return None


def reserve(name: str, fd: int, size: int) -> None:
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


def map_segment(fd: int, size: int) -> mmap.mmap:
    """Map the whole segment read-write, its page tables filled at once where the platform
    can (MAP_POPULATE): no page fault on the send path during the first lap."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, size, flags=flags)


def owner_pid(fd: int) -> int:
    """The pid the segment's header names (0 when it cannot be read)."""
    try:
        with mmap.mmap(fd, HEADER_SIZE, prot=mmap.PROT_READ) as mm:
            return int(_HDR.unpack_from(mm, 0)[4])
    except (OSError, ValueError):
        return 0


def owner_alive(fd: int) -> bool:
    """True while a live process holds the segment's ownership lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False
