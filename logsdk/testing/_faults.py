"""The test proxy's fault modes (`TcpProxy`): each armed by a
test's thread and applied to Kafka frames on the proxy's event loop thread.

- `ProduceDrops`: ProduceRequests swallowed and answered DUPLICATE_SEQUENCE_NUMBER,
  and the later batches of their producers renumbered so the broker sees no gap.
- `MetadataFaults`: an error code set on topics in all-topics Metadata responses.
- `EarliestMisreports`: another offset answered for ListOffsets EARLIEST.
- `ProduceHolds`: which ProduceRequests a hold takes, and their records counted
  (the connections held and their pending frames are the proxy's).

Owners: each mode has its own lock, which guards what it was armed with and what it has
done so far: any thread may arm it or read its counts. What a mode remembers between
frames (the batches a drop lost) belongs to the event loop thread alone. A mode disarms
itself by counting down: each frame it changes uses one of the ``count`` it was armed
with, taken under its lock, so two connections never use the same one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from logsdk.testing._batches import batches, renumber
from logsdk.testing._wire import (
    LEADER_NOT_AVAILABLE,
    NOT_UNDERSTOOD,
    ProduceRequest,
    Topic,
    list_offsets_answers,
    list_offsets_earliest,
    metadata_topic_errors,
    set_offsets,
    set_topic_errors,
)

log = logging.getLogger("logsdk.testing.proxy")

#: The version of a ListOffsets request and the (topic, partition) pairs asked EARLIEST.
Asked = tuple[int, frozenset[tuple[str, int]]]


def _check_count(count: int) -> None:
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count!r}")


class ProduceDrops:
    """ProduceRequests to swallow and answer as duplicates (see
    `TcpProxy.drop_produce_as_duplicate()`), and the versions of those seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed = 0
        self._done = 0
        self._versions: set[int] = set()
        # (producer id, epoch, topic, partition) -> [(base sequence, records)] of the
        # batches lost (event loop thread only).
        self._lost: dict[tuple[int, int, Topic, int], list[tuple[int, int]]] = {}

    @property
    def armed(self) -> int:
        with self._lock:
            return self._armed

    @property
    def done(self) -> int:
        with self._lock:
            return self._done

    @property
    def versions(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._versions)

    def arm(self, count: int) -> None:
        """Drop ``count`` more (added to those still armed)."""
        _check_count(count)
        with self._lock:
            self._armed += count
        log.info("armed: the next %d produce request(s) will be answered as duplicates", count)

    def take(self, frame: bytes, req: ProduceRequest) -> bool:
        """True when ``req`` is to be dropped; then remembers its batches as lost."""
        with self._lock:
            self._versions.add(req.version)
            if self._armed <= 0:
                return False
            self._armed -= 1
            self._done += 1
        lost = []
        for topic, partitions in req.topics:
            for index, (start, end) in partitions:
                for b in batches(frame, start, end):
                    if b.producer_id >= 0:
                        key = (b.producer_id, b.epoch, topic, index)
                        self._lost.setdefault(key, []).append((b.base_seq, b.count))
                    lost.append(
                        f"{topic!r}[{index}] pid {b.producer_id} epoch {b.epoch} "
                        f"seq {b.base_seq}+{b.count}"
                    )
        log.info(
            "dropped produce request v%d (correlation id %d, acks=%d; %s): answered %s",
            req.version,
            req.correlation_id,
            req.acks,
            ", ".join(lost) or "no batches",
            "DUPLICATE_SEQUENCE_NUMBER" if req.acks != 0 else "nothing (acks=0)",
        )
        return True

    def renumber(self, frame: bytes, req: ProduceRequest) -> bytes:
        """``frame`` with the batches that follow a lost one renumbered (see
        `renumber()`); unchanged while none was lost."""
        return renumber(frame, req, self._lost) if self._lost else frame


class MetadataFaults:
    """An error code to set on topics in the next all-topics Metadata responses (see
    `TcpProxy.fail_metadata()`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed = 0
        self._done = 0
        self._error = LEADER_NOT_AVAILABLE
        self._topics: frozenset[str] | None = None

    @property
    def done(self) -> int:
        with self._lock:
            return self._done

    def arm(self, count: int, error_code: int, topics: Iterable[str] | None) -> None:
        """Replace what is armed (count 0 disarms)."""
        _check_count(count)
        if not -32768 <= error_code <= 32767:
            raise ValueError(f"error_code must be a Kafka error code (int16), got {error_code!r}")
        with self._lock:
            self._armed = count
            self._error = error_code
            self._topics = None if topics is None else frozenset(topics)
        log.info("armed: the next %d metadata response(s) get error %d", count, error_code)

    def apply(self, frame: bytes, version: int) -> bytes:
        """``frame`` with the armed error set on its topics, while faults are armed."""
        with self._lock:
            if self._armed <= 0:
                return frame
            error, wanted = self._error, self._topics
        try:
            spots = metadata_topic_errors(frame, version)
        except NOT_UNDERSTOOD:
            log.warning("metadata response v%d not understood; passed unchanged", version)
            return frame
        hit = [(at, name) for at, name in spots if wanted is None or name in wanted]
        if not hit:
            return frame
        with self._lock:
            if self._armed <= 0:
                return frame
            self._armed -= 1
            self._done += 1
        log.info("metadata response v%d: error %d set on %s", version, error, [n for _, n in hit])
        return set_topic_errors(frame, (at for at, _ in hit), error)


class EarliestMisreports:
    """An offset to answer in place of the broker's for ListOffsets EARLIEST in the next
    responses that carry one (see `TcpProxy.misreport_earliest()`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed = 0
        self._done = 0
        self._offset = 0
        self._topics: frozenset[str] | None = None

    @property
    def done(self) -> int:
        with self._lock:
            return self._done

    def arm(self, offset: int, count: int, topics: Iterable[str] | None) -> None:
        """Replace what is armed (count 0 disarms)."""
        _check_count(count)
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset!r}")
        with self._lock:
            self._armed = count
            self._offset = offset
            self._topics = None if topics is None else frozenset(topics)
        log.info("armed: the next %d earliest-offset answer(s) say %d", count, offset)

    def asked(self, frame: bytes) -> Asked | None:
        """The version and asked partitions of a ListOffsets request whose answer is to be
        changed, while misreports are armed."""
        with self._lock:
            if self._armed <= 0:
                return None
            wanted = self._topics
        found = list_offsets_earliest(frame)
        if found is None:
            return None
        version, asked = found
        asked = frozenset(tp for tp in asked if wanted is None or tp[0] in wanted)
        return (version, asked) if asked else None

    def apply(self, frame: bytes, version: int, asked: frozenset[tuple[str, int]]) -> bytes:
        """``frame`` with the armed offset in place of each asked partition's, while
        misreports are armed."""
        try:
            spots = list_offsets_answers(frame, version)
        except NOT_UNDERSTOOD:
            log.warning("list offsets response v%d not understood; passed unchanged", version)
            return frame
        hit = [(t, p, at) for t, p, error, at in spots if error == 0 and (t, p) in asked]
        with self._lock:
            if not hit or self._armed <= 0:
                return frame
            self._armed -= 1
            self._done += 1
            offset = self._offset
        log.info(
            "list offsets response v%d: earliest %d said for %s",
            version,
            offset,
            [f"{t}[{p}]" for t, p, _ in hit],
        )
        return set_offsets(frame, (at for _, _, at in hit), offset)


class ProduceHolds:
    """Whether the next ProduceRequest begins a hold, and the holds and records counted
    (see `TcpProxy.hold_produce()`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed = False
        self._done = 0
        self._records = 0

    @property
    def done(self) -> int:
        with self._lock:
            return self._done

    @property
    def records(self) -> int:
        with self._lock:
            return self._records

    def arm(self) -> None:
        """The next ProduceRequest begins a hold; the records held count from 0."""
        with self._lock:
            self._armed = True
            self._records = 0
        log.info("armed: the next produce request and its connection will be held")

    def disarm(self) -> None:
        with self._lock:
            self._armed = False

    def take(self, frame: bytes, req: ProduceRequest, held: bool) -> bool:
        """Whether ``req`` (``acks`` != 0), on a connection ``held`` or not, is held: it
        begins a hold if one is armed, or its connection is held already. Its records
        are counted then."""
        with self._lock:
            begins = self._armed and not held
            if begins:
                self._armed = False
                self._done += 1
            if not (begins or held):
                return False
            for _, partitions in req.topics:
                for _, (start, end) in partitions:
                    self._records += sum(b.count for b in batches(frame, start, end))
        return True
