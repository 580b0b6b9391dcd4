"""Looking at rings from outside: the segments this user has, what one holds, and removing
a dead owner's (``logsdk shm list|remove``, and a producer looking at free slots).

Invariants:
- nothing here takes a segment over: it is mapped read-only and read as a recovering
  owner would read it (`logsdk.shm._frames.read_ring()`), without logging, while its
  owner may be alive and writing;
- a segment whose owner is alive is never removed (`remove()`).

Owner: none (functions); any thread of any process.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import posix_ipc

from logsdk.errors import ShmError, ShmInUseError
from logsdk.shm._frames import read_ring
from logsdk.shm._segment import (
    HEADER_SIZE,
    MAGIC,
    MIN_CAPACITY,
    SHM_DIR,
    UNFINISHED,
    owner_alive,
    read_header,
)


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
        alive = owner_alive(shm.fd)
        if size == 0:
            return _half_made(name, alive)
        if size < HEADER_SIZE + MIN_CAPACITY:
            raise ShmError(f"{name} is not a logsdk ring ({size} bytes)")
        with mmap.mmap(shm.fd, size, prot=mmap.PROT_READ) as mm:
            header = read_header(mm)
            if header.magic == UNFINISHED:
                return _half_made(name, alive, size)
            if header.magic != MAGIC or header.capacity != size - HEADER_SIZE:
                raise ShmError(f"{name} is not a logsdk ring")
            scan = read_ring(mm, header.capacity, name, quiet=True)
    finally:
        shm.close_fd()
    return SegmentInfo(
        name=name,
        size=size,
        capacity=header.capacity,
        pending=len(scan.rows),
        corrupt=scan.corrupt,
        owner_pid=header.owner_pid,
        owner_alive=alive,
        producer_id=header.producer_id,
        spool_dir=header.spool_dir,
    )


def _half_made(name: str, alive: bool, size: int = 0) -> SegmentInfo:
    """A segment its writer was making (sized, then its header, the magic last): no record
    is in it yet."""
    return SegmentInfo(name, size, 0, 0, 0, 0, alive, "", "")


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
