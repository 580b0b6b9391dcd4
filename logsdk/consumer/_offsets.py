"""The global offset map, and the codec that stores out-of-order progress in commit metadata.

Invariants:

- A partition's commit point is the first offset of its oldest dispatched-but-unfinished
  chunk, or, when nothing is pending, one past the last record received. It is never
  inferred from runs of acknowledged offsets: transaction markers and compaction leave
  real holes, so only offsets the broker actually delivered are tracked.
- Every assignment (and every rewind) starts a new *epoch* for the partition; work
  handed out in an older epoch can complete, but never moves the commit point.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from logsdk.consumer._records import Record, RecordColumns, TopicPartition

#: The longest commit metadata Apache Kafka takes by default: its
#: ``offset.metadata.max.bytes`` (4096) is a bound the text must stay under (measured on
#: Kafka 4.1.1: 4095 bytes kept, 4096 refused with OFFSET_METADATA_TOO_LARGE). A cluster
#: set lower is learned by the fetcher from its refusals.
DEFAULT_METADATA_MAX_BYTES = 4095
METADATA_PREFIX = "lsdk1:"

Range = tuple[int, int]  # half-open [start, end)

# -- metadata codec ---------------------------------------------------------------------


def _put_varint(out: bytearray, n: int) -> None:
    if n < 0:
        raise ValueError(f"varint must be >= 0, got {n}")
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _get_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or oversized varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _encode(base: int, ranges: Sequence[Range]) -> str:
    payload = bytearray()
    _put_varint(payload, base)
    _put_varint(payload, len(ranges))
    prev = base
    for start, end in ranges:
        if start < prev or end <= start:
            raise ValueError(f"ranges must be sorted, disjoint and above {base}: bad {start, end}")
        _put_varint(payload, start - prev)
        _put_varint(payload, end - start)
        prev = end
    raw = bytes(payload)
    packed = zlib.compress(raw, 9)
    body = b"\x01" + packed if len(packed) < len(raw) else b"\x00" + raw
    return METADATA_PREFIX + base64.urlsafe_b64encode(body).decode("ascii").rstrip("=")


def encode_completed(
    base: int, ranges: Sequence[Range], max_bytes: int = DEFAULT_METADATA_MAX_BYTES
) -> tuple[str, int]:
    """Encode offsets completed beyond the commit point ``base`` as commit metadata.

    ``ranges`` are sorted, disjoint, half-open ``[start, end)`` with ``start >= base``.
    Returns ``(text, kept)``: the text is at most ``max_bytes`` bytes and holds the
    first ``kept`` ranges (the lowest, which a restarted consumer reaches first);
    dropping the rest only means those records are processed again (at-least-once).
    """
    if base < 0:
        raise ValueError(f"base must be >= 0, got {base}")
    text = _encode(base, ranges)
    if len(text) <= max_bytes:
        return text, len(ranges)
    if len(_encode(base, ())) > max_bytes:
        raise ValueError(f"max_bytes={max_bytes} cannot hold even an empty range list")
    lo, hi = 0, len(ranges)  # invariant: encoding lo ranges fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(_encode(base, ranges[:mid])) <= max_bytes:
            lo = mid
        else:
            hi = mid
    return _encode(base, ranges[:lo]), lo


def decode_completed(text: str) -> tuple[int, list[Range]]:
    """Inverse of `encode_completed()`; raises ValueError on foreign or corrupt text."""
    if not text.startswith(METADATA_PREFIX):
        raise ValueError("not logsdk offset metadata")
    b64 = text[len(METADATA_PREFIX) :]
    try:
        body = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"bad base64 in offset metadata: {exc}") from exc
    if not body or body[0] not in (0, 1):
        raise ValueError("unknown offset metadata format")
    try:
        raw = zlib.decompress(body[1:]) if body[0] == 1 else body[1:]
    except zlib.error as exc:
        raise ValueError(f"corrupt compressed offset metadata: {exc}") from exc
    base, pos = _get_varint(raw, 0)
    count, pos = _get_varint(raw, pos)
    if count > len(raw):
        raise ValueError("range count larger than the payload")
    ranges: list[Range] = []
    prev = base
    for _ in range(count):
        gap, pos = _get_varint(raw, pos)
        length, pos = _get_varint(raw, pos)
        if length == 0:
            raise ValueError("empty range in offset metadata")
        start = prev + gap
        ranges.append((start, start + length))
        prev = start + length
    if pos != len(raw):
        raise ValueError("trailing bytes in offset metadata")
    return base, ranges


def ranges_for(base: int, metadata: str | None) -> list[Range]:
    """Completed ranges from ``metadata`` if it was written for commit point ``base``, else []."""
    if not metadata:
        return []
    try:
        encoded_base, ranges = decode_completed(metadata)
    except ValueError:
        return []
    # Metadata written for another commit point (someone committed without it) is stale.
    return ranges if encoded_base == base else []


def merge_ranges(ranges: Iterable[Range]) -> list[Range]:
    """Sort and merge overlapping or touching half-open ranges."""
    out: list[Range] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


class RangeSet:
    """Offsets already completed by a previous owner, to skip on this pass."""

    __slots__ = ("_ends", "_starts")

    def __init__(self, ranges: Iterable[Range] = ()) -> None:
        merged = merge_ranges(ranges)
        self._starts = [s for s, _ in merged]
        self._ends = [e for _, e in merged]

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int) or not self._starts:
            return False
        i = bisect.bisect_right(self._starts, offset) - 1
        return i >= 0 and offset < self._ends[i]

    def __bool__(self) -> bool:
        return bool(self._starts)

    def overlaps(self, start: int, end: int) -> bool:
        """Whether any offset in ``[start, end)`` is in the set."""
        i = bisect.bisect_right(self._ends, start)
        return i < len(self._starts) and self._starts[i] < end

    def above(self, offset: int) -> list[Range]:
        """The ranges (clipped) at or above ``offset``."""
        out = []
        for s, e in zip(self._starts, self._ends, strict=True):
            if e > offset:
                out.append((max(s, offset), e))
        return out

    def prune(self, offset: int) -> None:
        """Forget ranges that end at or below ``offset``."""
        i = bisect.bisect_right(self._ends, offset)
        if i:
            del self._starts[:i]
            del self._ends[:i]


# -- the offset map ---------------------------------------------------------------------


class Chunk:
    """Consecutive records of one partition from one poll, dispatched together.

    ``items`` are the fetched messages (``convert`` turns them into records for the
    handler) or, with ``convert=None``, `Record` objects already. The offset
    map tracks the chunk as a whole: ``first``/``last`` offsets and a remaining count.
    """

    __slots__ = (
        "convert",
        "count",
        "done",
        "epoch",
        "first",
        "items",
        "last",
        "nbytes",
        "remaining",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        epoch: int,
        items: list[Any],
        nbytes: int,
        first: int | None = None,
        last: int | None = None,
        convert: Callable[[list[Any]], RecordColumns] | None = None,
    ) -> None:
        self.tp = tp
        self.epoch = epoch
        self.items = items
        self.convert = convert
        self.first: int = items[0].offset if first is None else first
        self.last: int = items[-1].offset if last is None else last
        self.count = self.remaining = len(items)
        self.nbytes = nbytes
        self.done = False

    @property
    def records(self) -> list[Record]:
        """The chunk's records (converted from the messages on every call)."""
        if self.convert is None:
            return self.items
        return list(map(Record, *self.convert(self.items)))


@dataclass(frozen=True)
class CommitPoint:
    """What to commit for one partition: the offset and the completed ranges beyond it."""

    offset: int
    ranges: list[Range]


class _Partition:
    __slots__ = (
        "blocked",
        "committed",
        "dirty",
        "epoch",
        "next_fetch",
        "pending",
        "skip",
        "tx_lock",
    )

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        # Set between a failed exactly-once batch and the seek back to the stored offset:
        # nothing is admitted or committed for the partition meanwhile.
        self.blocked = False
        self.pending: deque[Chunk] = deque()
        self.next_fetch: int | None = None
        self.skip = RangeSet()
        self.committed: int | None = None
        self.dirty = False
        # Held by a worker around a handler commit and by revoke around the epoch bump,
        # so an exactly-once commit never straddles the moment the partition is revoked.
        self.tx_lock = threading.Lock()


class OffsetMap:
    """Per partition: which offsets were handed to workers and which completed (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[TopicPartition, _Partition] = {}
        self._epochs: dict[TopicPartition, int] = {}  # survives revoke, so epochs only grow
        self.discarded = 0  # records completed in a stale epoch

    def _new_epoch(self, tp: TopicPartition) -> int:
        e = self._epochs.get(tp, 0) + 1
        self._epochs[tp] = e
        return e

    def assign(
        self, tp: TopicPartition, start: int | None = None, skip: Iterable[Range] = ()
    ) -> int:
        """Start owning ``tp`` (a new epoch); ``start`` is where fetching resumes if known."""
        with self._lock:
            part = _Partition(self._new_epoch(tp))
            part.next_fetch = start
            part.committed = start
            part.skip = RangeSet(skip)
            self._parts[tp] = part
            return part.epoch

    def invalidate(self, tp: TopicPartition, epoch: int) -> bool:
        """Fence ``tp``'s work of ``epoch`` and hold the partition until `rewind()`.

        Returns False when ``epoch`` is already stale (someone else handled it).
        """
        with self._lock:
            part = self._parts.get(tp)
            if part is None or part.epoch != epoch:
                return False
            part.epoch = self._new_epoch(tp)
            part.blocked = True
            part.pending.clear()
            return True

    def blocked(self) -> list[TopicPartition]:
        with self._lock:
            return [tp for tp, part in self._parts.items() if part.blocked]

    def rewind(self, tp: TopicPartition, start: int | None) -> int | None:
        """Forget pending work of ``tp`` and resume at ``start`` in a new epoch."""
        with self._lock:
            old = self._parts.get(tp)
            if old is None:
                return None
            part = _Partition(self._new_epoch(tp))
            part.next_fetch = start
            part.committed = old.committed
            part.tx_lock = old.tx_lock
            self._parts[tp] = part
            return part.epoch

    def revoke(self, tp: TopicPartition) -> None:
        """Stop owning ``tp``: later completions from its epoch are discarded."""
        with self._lock:
            self._parts.pop(tp, None)
            self._new_epoch(tp)

    def owned(self) -> list[TopicPartition]:
        with self._lock:
            return list(self._parts)

    def epoch(self, tp: TopicPartition) -> int | None:
        with self._lock:
            part = self._parts.get(tp)
            return None if part is None else part.epoch

    def is_current(self, tp: TopicPartition, epoch: int) -> bool:
        with self._lock:
            part = self._parts.get(tp)
            return part is not None and part.epoch == epoch

    def tx_lock(self, tp: TopicPartition) -> threading.Lock | None:
        with self._lock:
            part = self._parts.get(tp)
            return None if part is None else part.tx_lock

    def admit_run(
        self, tp: TopicPartition, first: int, last: int, offsets: Callable[[], Sequence[int]]
    ) -> tuple[int | None, list[int] | None]:
        """Filter a polled run of ``tp`` (offsets ``first``..``last``, ascending).

        Returns ``(epoch, None)`` to dispatch the whole run, ``(epoch, indexes)`` to
        dispatch only the records at those positions, or ``(None, [])`` when the
        partition is not owned (or blocked). Drops stale records from before a seek and
        offsets a previous owner already completed (from the commit metadata);
        ``offsets()`` (every record's offset) is called only when something may be
        dropped.
        """
        with self._lock:
            part = self._parts.get(tp)
            if part is None or part.blocked:
                return None, []
            nf = part.next_fetch
            skip = part.skip
            if (nf is None or first >= nf) and not (skip and skip.overlaps(first, last + 1)):
                part.next_fetch = last + 1
                return part.epoch, None
            offs = offsets()
            keep = list(range(len(offs)))
            if nf is not None and first < nf:
                keep = [i for i in keep if offs[i] >= nf]
                if not keep:
                    return part.epoch, []
            part.next_fetch = offs[keep[-1]] + 1
            if skip:
                kept = [i for i in keep if offs[i] not in skip]
                if len(kept) != len(keep):
                    part.dirty = True
                keep = kept
            return part.epoch, keep

    def admit(self, tp: TopicPartition, records: list[Record]) -> tuple[int | None, list[Record]]:
        """`admit_run()` for a list of records; returns (epoch, records to dispatch)."""
        if not records:
            return self.epoch(tp), []
        epoch, keep = self.admit_run(
            tp, records[0].offset, records[-1].offset, lambda: [r.offset for r in records]
        )
        if keep is None:
            return epoch, records
        return epoch, [records[i] for i in keep]

    def register(self, chunk: Chunk) -> bool:
        """Record that ``chunk`` was handed to the workers; False if its epoch is stale."""
        with self._lock:
            part = self._parts.get(chunk.tp)
            if part is None or part.epoch != chunk.epoch:
                return False
            part.pending.append(chunk)
            return True

    def complete(self, chunk: Chunk, n: int) -> bool:
        """``n`` records of ``chunk`` finished; False (and nothing moves) if the epoch is stale."""
        with self._lock:
            part = self._parts.get(chunk.tp)
            if part is None or part.epoch != chunk.epoch:
                self.discarded += n
                return False
            chunk.remaining -= n
            if chunk.remaining <= 0:
                chunk.done = True
                part.dirty = True
                pending = part.pending
                while pending and pending[0].done:
                    pending.popleft()
            return True

    def _point(self, part: _Partition) -> CommitPoint | None:
        pending = part.pending
        while pending and pending[0].done:
            pending.popleft()
        low = pending[0].first if pending else part.next_fetch
        if low is None:
            return None
        done = [(c.first, c.last + 1) for c in pending if c.done]
        if part.skip:
            part.skip.prune(low)
            done.extend(part.skip.above(low))
        return CommitPoint(low, merge_ranges(done))

    def commit_points(
        self, force: bool = False, only: set[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommitPoint]:
        """Commit points of owned partitions that moved since the last commit (all if force),
        of ``only`` these when given (the others stay marked as moved)."""
        out = {}
        with self._lock:
            for tp, part in self._parts.items():
                if part.blocked or not (force or part.dirty):
                    continue
                if only is not None and tp not in only:
                    continue
                point = self._point(part)
                if point is not None and (force or point.offset != part.committed or point.ranges):
                    out[tp] = point
                part.dirty = False
        return out

    def mark_dirty(self, tps: Iterable[TopicPartition]) -> None:
        """A commit of these partitions failed: the next interval commits them again."""
        with self._lock:
            for tp in tps:
                part = self._parts.get(tp)
                if part is not None:
                    part.dirty = True

    def point(self, tp: TopicPartition) -> CommitPoint | None:
        with self._lock:
            part = self._parts.get(tp)
            return None if part is None else self._point(part)

    def mark_committed(self, tp: TopicPartition, offset: int) -> None:
        with self._lock:
            part = self._parts.get(tp)
            if part is not None:
                part.committed = offset

    def positions(self) -> dict[TopicPartition, tuple[int | None, int | None, int | None]]:
        """Per owned partition: (next fetch offset, commit point, last committed)."""
        with self._lock:
            out = {}
            for tp, part in self._parts.items():
                point = self._point(part)
                out[tp] = (part.next_fetch, None if point is None else point.offset, part.committed)
            return out
