"""A loopback TCP proxy that can cut the network, heal it, and fake duplicate produces.

Toxiproxy is the usual tool, but it is a Go binary that no package registry we
can install from ships; the Python packages found are clients only. This proxy
is small on purpose: an asyncio loop in a daemon thread of the test process
(so it dies with that process, never an orphan), piping Kafka frames both ways.

``cut()`` resets every open connection and, until ``heal()``, resets each new
one as soon as it is accepted: to a client this is a network that went away
while the broker and its data stayed up.

``drop_produce_as_duplicate(n)`` swallows the next ``n`` ProduceRequests and
answers each one itself with DUPLICATE_SEQUENCE_NUMBER (error 46) and base
offset -1 for every partition, as Tansu does: the batch is never stored, and an
idempotent librdkafka producer reports its records as delivered. That is what a
broker that records a producer's sequence before it stores the batch does when it
fails in between and the client resends. To finish the picture (that broker has
moved its sequence past the lost batch) the proxy lowers the base sequence of the
producer's later batches to that partition by the lost record count, so the real
broker sees no gap and does not answer OUT_OF_ORDER_SEQUENCE_NUMBER (which
librdkafka would make a fatal error).

librdkafka numbers a batch's delivery reports from the base offset: with -1 the
first record reports offset -1 (``Message.offset()`` returns None in Python) and
the others 0, 1, 2...: offsets that look valid but belong to other records.

``fail_metadata(n, error_code)`` sets ``error_code`` (LEADER_NOT_AVAILABLE unless
told) on the topics of the next ``n`` responses to all-topics Metadata requests
(what ``list_topics()`` sends): the broker keeps the topics, the client sees them
listed with an error, as while a leader is being elected. Requests for named
topics (librdkafka's own refreshes) pass unchanged, so the count goes to the
caller that lists topics. It counts responses, not calls: librdkafka may send a
fresh client's first ``list_topics()`` twice (on the bootstrap connection, then
again on the broker's own), and then one call uses two.

``misreport_earliest(offset, n)`` answers ``offset`` in place of the broker's answer to
ListOffsets EARLIEST (what ``auto.offset.reset=earliest``, ``OFFSET_BEGINNING`` and the
low of ``get_watermark_offsets`` ask) in the next ``n`` responses that carry one: what
Tansu 0.6 answers when a partition's first batches were stored in another order than
their offsets (docs/engineering/broker-quirks.md), on demand instead of under load.

``hold_produce()`` holds the next ProduceRequest, and everything its client sends after
it on that connection, until ``release_held()``; then forwards them in order, even if the
client has closed the connection meanwhile. That is what an Apache Kafka broker does with
a connection whose produce request waits in purgatory (``acks=all`` with a follower in
the ISR that is not fetching): it reads nothing more from that connection until the
request is answered, then reads and appends the requests the client sent behind it,
after any client that gave up on them has purged them, closed the connection and sent
newer records through another (docs/engineering/chaos.md, "On Apache Kafka").

Everything else passes through unchanged. The proxy splits both directions into
Kafka frames (an int32 size, then the message) to know each request's
correlation id, so that a response it makes up is sent only after the responses
to every earlier request on that connection: a client expects them in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger("logsdk.testing.proxy")

#: Kafka's ApiKey of ProduceRequest and the error DUPLICATE_SEQUENCE_NUMBER.
PRODUCE = 0
DUPLICATE_SEQUENCE_NUMBER = 46
#: Kafka's ApiKey of MetadataRequest and the error LEADER_NOT_AVAILABLE.
METADATA = 3
LEADER_NOT_AVAILABLE = 5
#: MetadataRequest/Response versions this proxy can decode (flexible from 9, topic ids
#: from 10); others pass unchanged.
_METADATA_MIN, _METADATA_FLEXIBLE, _METADATA_TOPIC_ID, _METADATA_MAX = 1, 9, 10, 13
#: ProduceRequest/Response versions this proxy can decode and answer (flexible from 9,
#: topics named by id instead of name from 13).
_PRODUCE_MIN, _PRODUCE_FLEXIBLE, _PRODUCE_TOPIC_ID, _PRODUCE_MAX = 3, 9, 13, 13
#: Kafka's ApiKey of ListOffsetsRequest, and the timestamp that asks a partition's earliest
#: offset.
LIST_OFFSETS = 2
EARLIEST = -2
#: ListOffsetsRequest/Response versions this proxy can decode (flexible from 6); others
#: pass unchanged.
_LIST_OFFSETS_MIN, _LIST_OFFSETS_FLEXIBLE, _LIST_OFFSETS_MAX = 1, 6, 10
#: Larger frames are a corrupt stream (or not Kafka): pass the bytes through blindly.
_MAX_FRAME = 1 << 30
_BUF = 256 * 1024

#: Called with each frame (size prefix, message); returns the chunks to forward.
_FrameHook = Callable[[bytes, bytes], list[bytes]]


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a dropped network path looks to a peer."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


# -- Kafka wire format ------------------------------------------------------------------------


class _Decoder:
    """Reads Kafka primitive types from a message body; IndexError/struct.error if short."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise IndexError("truncated Kafka message")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return int(struct.unpack(">h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self._take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack(">q", self._take(8))[0])

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise IndexError("varint too long")

    def string(self, flexible: bool) -> str | None:
        """A (nullable) string: int16 length, or unsigned varint length + 1 when flexible."""
        n = self.uvarint() - 1 if flexible else self.int16()
        return None if n < 0 else self._take(n).decode()

    def span(self, flexible: bool) -> tuple[int, int]:
        """Skip a (nullable) byte array (int32 length, or unsigned varint length + 1);
        returns where its bytes start and end."""
        n = self.uvarint() - 1 if flexible else self.int32()
        start = self.pos
        if n > 0:
            self._take(n)
        return start, self.pos

    def array_len(self, flexible: bool) -> int:
        """An array's length (-1 for null): int32, or unsigned varint length + 1."""
        return self.uvarint() - 1 if flexible else self.int32()

    def uuid(self) -> bytes:
        return self._take(16)

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._take(self.uvarint())


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


#: A topic's name, or its id (16 bytes) from Produce v13 on.
_Topic = str | bytes


@dataclass
class _ProduceRequest:
    """What the proxy needs from a ProduceRequest."""

    version: int
    correlation_id: int
    acks: int
    #: (topic, [(partition index, (start, end) of its records in the frame)]) in order.
    topics: list[tuple[_Topic, list[tuple[int, tuple[int, int]]]]]


@dataclass
class _Batch:
    """A RecordBatch (magic 2) header: where it is in the frame and its idempotence."""

    pos: int
    end: int
    producer_id: int
    epoch: int
    base_seq: int
    count: int


# RecordBatch layout (magic 2): baseOffset int64, batchLength int32, leaderEpoch int32,
# magic int8, crc uint32 (CRC-32C of everything from attributes on), attributes int16,
# lastOffsetDelta int32, baseTimestamp int64, maxTimestamp int64, producerId int64,
# producerEpoch int16, baseSequence int32, then the record count and the records.
_B_MAGIC, _B_CRC, _B_ATTRIBUTES, _B_LAST_DELTA, _B_PRODUCER, _B_SEQ = 16, 17, 21, 23, 43, 53
_B_HEADER = 61


def _batches(frame: bytes | bytearray, start: int, end: int) -> list[_Batch]:
    """The magic-2 record batches in ``frame[start:end]`` (a partition's records)."""
    out: list[_Batch] = []
    pos = start
    while pos + _B_HEADER <= end:
        (length,) = struct.unpack_from(">i", frame, pos + 8)
        if length < _B_HEADER - 12 or pos + 12 + length > end or frame[pos + _B_MAGIC] != 2:
            break
        (last_delta,) = struct.unpack_from(">i", frame, pos + _B_LAST_DELTA)
        pid, epoch, seq = struct.unpack_from(">qhi", frame, pos + _B_PRODUCER)
        out.append(_Batch(pos, pos + 12 + length, pid, epoch, seq, last_delta + 1))
        pos += 12 + length
    return out


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC32C = _crc32c_table()


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli), the checksum of Kafka record batches. Pure Python: slow,
    but it only runs on the batches the proxy renumbers."""
    crc = 0xFFFFFFFF
    table = _CRC32C
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _parse_produce(frame: bytes) -> _ProduceRequest | None:
    """Decode a ProduceRequest frame (without its size prefix); None if it is not one
    this proxy understands (another API, an unsupported version, or malformed)."""
    try:
        d = _Decoder(frame)
        api_key, version, correlation_id = d.int16(), d.int16(), d.int32()
        if api_key != PRODUCE or not _PRODUCE_MIN <= version <= _PRODUCE_MAX:
            return None
        flexible = version >= _PRODUCE_FLEXIBLE
        d.string(flexible=False)  # client_id: a plain int16 string even in header v2
        if flexible:
            d.skip_tags()
        d.string(flexible)  # transactional_id
        acks = d.int16()
        d.int32()  # timeout_ms
        topics: list[tuple[_Topic, list[tuple[int, tuple[int, int]]]]] = []
        for _ in range(max(d.array_len(flexible), 0)):
            by_id = version >= _PRODUCE_TOPIC_ID
            topic: _Topic = d.uuid() if by_id else d.string(flexible) or ""
            partitions: list[tuple[int, tuple[int, int]]] = []
            for _ in range(max(d.array_len(flexible), 0)):
                index = d.int32()
                partitions.append((index, d.span(flexible)))  # records
                if flexible:
                    d.skip_tags()
            if flexible:
                d.skip_tags()
            topics.append((topic, partitions))
        if flexible:
            d.skip_tags()
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return _ProduceRequest(version, correlation_id, acks, topics)


def _duplicate_response(req: _ProduceRequest, error_code: int = DUPLICATE_SEQUENCE_NUMBER) -> bytes:
    """A whole ProduceResponse frame (size prefix included) answering ``req`` with
    ``error_code`` and base offset -1 for each of its partitions."""
    v = req.version
    flexible = v >= _PRODUCE_FLEXIBLE

    def array(n: int) -> bytes:
        return _uvarint(n + 1) if flexible else struct.pack(">i", n)

    tags = b"\x00" if flexible else b""
    out = bytearray(struct.pack(">i", req.correlation_id))
    out += tags  # response header v1 (flexible versions) ends with tagged fields
    out += array(len(req.topics))
    for topic, partitions in req.topics:
        if isinstance(topic, bytes):
            out += topic
        else:
            name = topic.encode()
            out += _uvarint(len(name) + 1) if flexible else struct.pack(">h", len(name))
            out += name
        out += array(len(partitions))
        for index, _ in partitions:
            out += struct.pack(">ihq", index, error_code, -1)  # index, error, base_offset
            if v >= 2:
                out += struct.pack(">q", -1)  # log_append_time_ms
            if v >= 5:
                out += struct.pack(">q", -1)  # log_start_offset
            if v >= 8:
                out += array(0)  # record_errors
                out += _uvarint(0) if flexible else struct.pack(">h", -1)  # error_message null
            out += tags
        out += tags
    out += struct.pack(">i", 0)  # throttle_time_ms (v1+)
    out += tags
    return struct.pack(">i", len(out)) + bytes(out)


def _metadata_all_topics(frame: bytes) -> int | None:
    """The version of a MetadataRequest for all topics (topics null), else None."""
    try:
        d = _Decoder(frame)
        api_key, version = d.int16(), d.int16()
        if api_key != METADATA or not _METADATA_MIN <= version <= _METADATA_MAX:
            return None
        d.int32()  # correlation id
        d.string(flexible=False)  # client_id: a plain int16 string even in header v2
        flexible = version >= _METADATA_FLEXIBLE
        if flexible:
            d.skip_tags()
        return version if d.array_len(flexible) < 0 else None
    except (IndexError, struct.error, UnicodeDecodeError):
        return None


def _metadata_topic_errors(frame: bytes, version: int) -> list[tuple[int, str | None]]:
    """Where each topic's error code sits in a MetadataResponse frame, with its name."""
    flexible = version >= _METADATA_FLEXIBLE
    d = _Decoder(frame)
    d.int32()  # correlation id
    if flexible:
        d.skip_tags()  # response header v1
    if version >= 3:
        d.int32()  # throttle_time_ms

    def skip_int32_array() -> None:
        for _ in range(max(d.array_len(flexible), 0)):
            d.int32()

    for _ in range(max(d.array_len(flexible), 0)):  # brokers
        d.int32()  # node id
        d.string(flexible)  # host
        d.int32()  # port
        d.string(flexible)  # rack (v1+)
        if flexible:
            d.skip_tags()
    if version >= 2:
        d.string(flexible)  # cluster id
    d.int32()  # controller id (v1+)
    found: list[tuple[int, str | None]] = []
    for _ in range(max(d.array_len(flexible), 0)):  # topics
        at = d.pos
        d.int16()  # error code
        name = d.string(flexible)
        if version >= _METADATA_TOPIC_ID:
            d.uuid()
        d._take(1)  # is_internal (v1+)
        for _ in range(max(d.array_len(flexible), 0)):  # partitions
            d.int16()  # error code
            d.int32()  # partition index
            d.int32()  # leader id
            if version >= 7:
                d.int32()  # leader epoch
            skip_int32_array()  # replicas
            skip_int32_array()  # isr
            if version >= 5:
                skip_int32_array()  # offline replicas
            if flexible:
                d.skip_tags()
        if version >= 8:
            d.int32()  # topic authorized operations
        if flexible:
            d.skip_tags()
        found.append((at, name))
    return found


def _list_offsets_earliest(frame: bytes) -> tuple[int, frozenset[tuple[str, int]]] | None:
    """The version of a ListOffsetsRequest and the (topic, partition) pairs it asks the
    earliest offset of; None for any other request, a version this proxy cannot read, or
    a request that asks no earliest offset."""
    try:
        d = _Decoder(frame)
        api_key, version = d.int16(), d.int16()
        if api_key != LIST_OFFSETS or not _LIST_OFFSETS_MIN <= version <= _LIST_OFFSETS_MAX:
            return None
        d.int32()  # correlation id
        d.string(flexible=False)  # client_id: a plain int16 string even in header v2
        flexible = version >= _LIST_OFFSETS_FLEXIBLE
        if flexible:
            d.skip_tags()
        d.int32()  # replica id
        if version >= 2:
            d._take(1)  # isolation level
        asked: set[tuple[str, int]] = set()
        for _ in range(max(d.array_len(flexible), 0)):  # topics
            name = d.string(flexible) or ""
            for _ in range(max(d.array_len(flexible), 0)):  # partitions
                index = d.int32()
                if version >= 4:
                    d.int32()  # current leader epoch
                if d.int64() == EARLIEST:
                    asked.add((name, index))
                if flexible:
                    d.skip_tags()
            if flexible:
                d.skip_tags()
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return (version, frozenset(asked)) if asked else None


def _list_offsets_answers(frame: bytes, version: int) -> list[tuple[str, int, int, int]]:
    """Each partition of a ListOffsetsResponse frame: (topic, partition, error code,
    where its offset sits in the frame)."""
    flexible = version >= _LIST_OFFSETS_FLEXIBLE
    d = _Decoder(frame)
    d.int32()  # correlation id
    if flexible:
        d.skip_tags()  # response header v1
    if version >= 2:
        d.int32()  # throttle_time_ms
    found: list[tuple[str, int, int, int]] = []
    for _ in range(max(d.array_len(flexible), 0)):  # topics
        name = d.string(flexible) or ""
        for _ in range(max(d.array_len(flexible), 0)):  # partitions
            index, error = d.int32(), d.int16()
            d.int64()  # timestamp
            found.append((name, index, error, d.pos))
            d.int64()  # offset
            if version >= 4:
                d.int32()  # leader epoch
            if flexible:
                d.skip_tags()
        if flexible:
            d.skip_tags()
    return found


# -- the proxy --------------------------------------------------------------------------------


@dataclass
class _Conn:
    """One client connection: the responses it is owed, in request order."""

    client: asyncio.StreamWriter
    #: [correlation id, None for a request forwarded to the broker or the frame to send
    #: in its place]. The head is always a forwarded request: made-up answers at the
    #: head are sent at once.
    owed: deque[tuple[int, bytes | None]] = field(default_factory=deque)
    #: correlation id -> version of the all-topics Metadata requests awaiting an answer.
    metadata: dict[int, int] = field(default_factory=dict)
    #: correlation id -> (version, the (topic, partition) pairs asked EARLIEST) of the
    #: ListOffsets requests awaiting an answer, while misreport_earliest is armed.
    earliest: dict[int, tuple[int, frozenset[tuple[str, int]]]] = field(default_factory=dict)
    #: The broker's side of the connection (for a hold's release).
    upstream: asyncio.StreamWriter | None = None
    #: A hold is on (see ``hold_produce``): frames from the client wait in ``pending``.
    held: bool = False
    pending: list[bytes] = field(default_factory=list)
    #: The client closed its side while held: close the broker's once released.
    ended: bool = False


class TcpProxy:
    """Forward ``127.0.0.1:listen_port`` to ``127.0.0.1:target_port``."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._cut = False
        self._lock = threading.Lock()
        self._drops_armed = 0
        self._drops_done = 0
        self._produce_versions: set[int] = set()
        self._meta_armed = 0
        self._meta_done = 0
        self._meta_error = LEADER_NOT_AVAILABLE
        self._meta_topics: frozenset[str] | None = None
        self._early_armed = 0
        self._early_done = 0
        self._early_offset = 0
        self._early_topics: frozenset[str] | None = None
        # (producer id, epoch, topic, partition) -> [(base sequence, records)] of the
        # batches lost by drop_produce_as_duplicate (event loop thread only).
        self._lost: dict[tuple[int, int, _Topic, int], list[tuple[int, int]]] = {}
        self._hold_armed = False
        self._holds_done = 0
        self._held_records = 0
        self._held: list[_Conn] = []  # connections on hold (event loop thread only)

    @property
    def is_cut(self) -> bool:
        """True between ``cut()`` and ``heal()``."""
        return self._cut

    @property
    def produce_drops_armed(self) -> int:
        """ProduceRequests still to be dropped by :meth:`drop_produce_as_duplicate`."""
        with self._lock:
            return self._drops_armed

    @property
    def produce_drops_done(self) -> int:
        """ProduceRequests dropped (and answered as duplicates) so far."""
        with self._lock:
            return self._drops_done

    @property
    def produce_versions(self) -> frozenset[int]:
        """ProduceRequest versions seen so far (what the clients negotiated)."""
        with self._lock:
            return frozenset(self._produce_versions)

    @property
    def metadata_faults_done(self) -> int:
        """Metadata responses :meth:`fail_metadata` has changed so far."""
        with self._lock:
            return self._meta_done

    def fail_metadata(
        self,
        count: int = 1,
        *,
        error_code: int = LEADER_NOT_AVAILABLE,
        topics: Iterable[str] | None = None,
    ) -> None:
        """Set ``error_code`` on ``topics`` (default: every topic) in the next ``count``
        responses to all-topics Metadata requests that list one of them.

        The broker's answer is otherwise passed as it was. Replaces any faults still
        armed (count 0 disarms).
        """
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count!r}")
        if not -32768 <= error_code <= 32767:
            raise ValueError(f"error_code must be a Kafka error code (int16), got {error_code!r}")
        with self._lock:
            self._meta_armed = count
            self._meta_error = error_code
            self._meta_topics = None if topics is None else frozenset(topics)
        log.info("armed: the next %d metadata response(s) get error %d", count, error_code)

    def _fail_metadata(self, frame: bytes, version: int) -> bytes:
        """``frame`` with the armed error set on its topics, while faults are armed."""
        with self._lock:
            if self._meta_armed <= 0:
                return frame
            error, wanted = self._meta_error, self._meta_topics
        try:
            spots = _metadata_topic_errors(frame, version)
        except (IndexError, struct.error, UnicodeDecodeError):
            log.warning("metadata response v%d not understood; passed unchanged", version)
            return frame
        hit = [(at, name) for at, name in spots if wanted is None or name in wanted]
        if not hit:
            return frame
        with self._lock:
            if self._meta_armed <= 0:
                return frame
            self._meta_armed -= 1
            self._meta_done += 1
        buf = bytearray(frame)
        for at, _ in hit:
            struct.pack_into(">h", buf, at, error)
        log.info("metadata response v%d: error %d set on %s", version, error, [n for _, n in hit])
        return bytes(buf)

    @property
    def earliest_misreports_done(self) -> int:
        """ListOffsets responses :meth:`misreport_earliest` has changed so far."""
        with self._lock:
            return self._early_done

    def misreport_earliest(
        self, offset: int, count: int = 1, *, topics: Iterable[str] | None = None
    ) -> None:
        """Answer ``offset`` for each partition of ``topics`` (default: every topic) asked
        its earliest offset in the next ``count`` ListOffsets responses that carry one.

        Partitions the broker answered with an error, and every other answer, pass
        unchanged. Replaces any misreports still armed (count 0 disarms).
        """
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count!r}")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset!r}")
        with self._lock:
            self._early_armed = count
            self._early_offset = offset
            self._early_topics = None if topics is None else frozenset(topics)
        log.info("armed: the next %d earliest-offset answer(s) say %d", count, offset)

    def _earliest_asked(self, frame: bytes) -> tuple[int, frozenset[tuple[str, int]]] | None:
        """The version and asked partitions of a ListOffsets request whose answer is to be
        changed, while misreports are armed."""
        with self._lock:
            if self._early_armed <= 0:
                return None
            wanted = self._early_topics
        found = _list_offsets_earliest(frame)
        if found is None:
            return None
        version, asked = found
        asked = frozenset(tp for tp in asked if wanted is None or tp[0] in wanted)
        return (version, asked) if asked else None

    def _misreport_earliest(
        self, frame: bytes, version: int, asked: frozenset[tuple[str, int]]
    ) -> bytes:
        """``frame`` with the armed offset in place of each asked partition's, while
        misreports are armed."""
        try:
            spots = _list_offsets_answers(frame, version)
        except (IndexError, struct.error, UnicodeDecodeError):
            log.warning("list offsets response v%d not understood; passed unchanged", version)
            return frame
        hit = [(t, p, at) for t, p, error, at in spots if error == 0 and (t, p) in asked]
        with self._lock:
            if not hit or self._early_armed <= 0:
                return frame
            self._early_armed -= 1
            self._early_done += 1
            offset = self._early_offset
        buf = bytearray(frame)
        for _, _, at in hit:
            struct.pack_into(">q", buf, at, offset)
        log.info(
            "list offsets response v%d: earliest %d said for %s",
            version,
            offset,
            [f"{t}[{p}]" for t, p, _ in hit],
        )
        return bytes(buf)

    @property
    def produce_holds_done(self) -> int:
        """ProduceRequests that began a hold (see :meth:`hold_produce`) so far."""
        with self._lock:
            return self._holds_done

    @property
    def held_records(self) -> int:
        """Records in the ProduceRequests held since the last :meth:`hold_produce` (the
        held one and those sent behind it on its connection)."""
        with self._lock:
            return self._held_records

    def hold_produce(self) -> None:
        """Hold the next ProduceRequest (``acks`` != 0) and every frame its client sends
        after it on that connection, until :meth:`release_held`: as a Kafka broker reads
        nothing more from a connection whose produce request waits in purgatory. Other
        connections pass. The held frames are forwarded in order on release, even if the
        client closed the connection meanwhile (the broker then stores what a client
        that gave up on those records sent)."""
        with self._lock:
            self._hold_armed = True
            self._held_records = 0
        log.info("armed: the next produce request and its connection will be held")

    def release_held(self) -> None:
        """Forward what :meth:`hold_produce` held (an armed hold not yet begun is
        disarmed)."""
        with self._lock:
            self._hold_armed = False
        loop = self._loop
        if loop is None:
            return

        def release() -> None:
            held, self._held = self._held, []
            for conn in held:
                conn.held = False
                up = conn.upstream
                if up is None or self._cut:
                    continue
                for chunk in conn.pending:
                    up.write(chunk)
                log.info("released %d held frame(s)", len(conn.pending) // 2)
                conn.pending.clear()
                if conn.ended:
                    up.close()  # after what was written: the client had closed its side
                    self._conns.discard(up)

        loop.call_soon_threadsafe(release)

    def _take_hold(self, frame: bytes, req: _ProduceRequest, conn: _Conn) -> None:
        """Begin a hold on ``conn`` if one is armed, and count the records held."""
        if req.acks == 0:
            return
        with self._lock:
            if self._hold_armed and not conn.held:
                self._hold_armed = False
                self._holds_done += 1
                conn.held = True
                self._held.append(conn)
            if not conn.held:
                return
            for _, partitions in req.topics:
                for _, (start, end) in partitions:
                    self._held_records += sum(b.count for b in _batches(frame, start, end))
        log.info("produce request (correlation id %d) held", req.correlation_id)

    def drop_produce_as_duplicate(self, count: int = 1) -> None:
        """Swallow the next ``count`` ProduceRequests and answer each with
        DUPLICATE_SEQUENCE_NUMBER and base offset -1 for all its partitions.

        The batches are never stored; an idempotent librdkafka producer reports
        their records as delivered (the first with offset -1, the rest with offsets
        0, 1, ... counted from it). Later batches of that producer to those partitions
        are renumbered so the broker sees no sequence gap. Adds to any drops still
        armed; requests with ``acks=0`` are dropped without an answer.
        """
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count!r}")
        with self._lock:
            self._drops_armed += count
        log.info("armed: the next %d produce request(s) will be answered as duplicates", count)

    def start(self) -> None:
        """Listen on the port; returns once the listener is bound."""
        ready = threading.Event()
        errors: list[BaseException] = []
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(
                        self._handle, "127.0.0.1", self.listen_port, reuse_address=True
                    )
                )
            except BaseException as exc:  # reported to start() below
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="logsdk-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]

    def stop(self) -> None:
        """Close the listener and every connection."""
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._conns):
                _reset(w)
            self._conns.clear()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until ``heal()``."""
        self._cut = True
        loop = self._loop
        if loop is None:
            return

        async def drop() -> int:
            n = len(self._conns)
            for w in list(self._conns):
                _reset(w)
            self._conns.clear()
            return n

        n = asyncio.run_coroutine_threadsafe(drop(), loop).result(5)
        log.info("network cut: %d connection(s) reset", n)

    def heal(self) -> None:
        """Accept and forward connections again."""
        self._cut = False
        log.info("network healed")

    # -- per connection (all on the proxy's event loop thread) ----------------------------

    def _take_drop(self, frame: bytes, req: _ProduceRequest) -> bool:
        """True when ``req`` is to be dropped; then remembers its batches as lost."""
        with self._lock:
            self._produce_versions.add(req.version)
            if self._drops_armed <= 0:
                return False
            self._drops_armed -= 1
            self._drops_done += 1
        lost = []
        for topic, partitions in req.topics:
            for index, (start, end) in partitions:
                for b in _batches(frame, start, end):
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

    def _renumber(self, frame: bytes, req: _ProduceRequest) -> bytes:
        """Lower the base sequence of each batch that follows a lost one (same producer,
        epoch and partition) by the lost records, so the broker sees no gap: as if it had
        recorded the lost batches' sequences. The batch CRC is recomputed."""
        buf: bytearray | None = None
        for topic, partitions in req.topics:
            for index, (start, end) in partitions:
                for b in _batches(frame, start, end):
                    lost = self._lost.get((b.producer_id, b.epoch, topic, index))
                    shift = sum(n for seq, n in lost or () if seq < b.base_seq)
                    if not shift:
                        continue
                    if buf is None:
                        buf = bytearray(frame)
                    struct.pack_into(">i", buf, b.pos + _B_SEQ, b.base_seq - shift)
                    crc = crc32c(memoryview(buf)[b.pos + _B_ATTRIBUTES : b.end])
                    struct.pack_into(">I", buf, b.pos + _B_CRC, crc)
                    log.debug(
                        "%r[%d] pid %d: batch seq %d sent as %d",
                        topic,
                        index,
                        b.producer_id,
                        b.base_seq,
                        b.base_seq - shift,
                    )
        return frame if buf is None else bytes(buf)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _reset(writer)
            return
        self._conns.add(writer)
        self._conns.add(up_writer)
        conn = _Conn(writer, upstream=up_writer)

        def requests(head: bytes, frame: bytes) -> list[bytes]:
            """Client to broker: note the answer owed, or swallow a produce and answer it."""
            if len(frame) < 8:
                return [head, frame]
            api_key, _, correlation_id = struct.unpack_from(">hhi", frame)
            if api_key != PRODUCE:
                if api_key == METADATA and (version := _metadata_all_topics(frame)) is not None:
                    conn.metadata[correlation_id] = version
                if api_key == LIST_OFFSETS and (asked := self._earliest_asked(frame)) is not None:
                    conn.earliest[correlation_id] = asked
                conn.owed.append((correlation_id, None))
                return [head, frame]
            req = _parse_produce(frame)
            if req is None:  # a version we cannot read: forward it, pass its answer
                log.warning("produce request not understood; forwarded unchanged")
                conn.owed.append((correlation_id, None))
                return [head, frame]
            if not self._take_drop(frame, req):
                self._take_hold(frame, req, conn)
                if req.acks != 0:
                    conn.owed.append((correlation_id, None))
                return [head, self._renumber(frame, req) if self._lost else frame]
            if req.acks != 0:
                answer = _duplicate_response(req)
                if conn.owed:  # after the answers to the requests before it
                    log.debug("answer to %d held for %d earlier", correlation_id, len(conn.owed))
                    conn.owed.append((correlation_id, answer))
                else:
                    writer.write(answer)
            return []

        def responses(head: bytes, frame: bytes) -> list[bytes]:
            """Broker to client: pass the frame, then the made-up answers owed after it."""
            if len(frame) < 4:
                return [head, frame]
            (correlation_id,) = struct.unpack_from(">i", frame)
            version = conn.metadata.pop(correlation_id, None)
            if version is not None:
                frame = self._fail_metadata(frame, version)
            if (earliest := conn.earliest.pop(correlation_id, None)) is not None:
                frame = self._misreport_earliest(frame, *earliest)
            if conn.owed and conn.owed[0][0] == correlation_id:
                conn.owed.popleft()
            else:
                log.warning(
                    "response to correlation id %d out of the expected order %s",
                    correlation_id,
                    [c for c, _ in conn.owed][:5],
                )
            out = [head, frame]
            while conn.owed and (answer := conn.owed[0][1]) is not None:
                conn.owed.popleft()
                out.append(answer)
            return out

        await asyncio.gather(
            self._pipe(reader, up_writer, requests, conn), self._pipe(up_reader, writer, responses)
        )
        self._conns.discard(writer)
        if not conn.held:  # else the release closes it (a cut or stop resets it)
            self._conns.discard(up_writer)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        on_frame: _FrameHook,
        held: _Conn | None = None,
    ) -> None:
        """Copy ``src`` to ``dst`` frame by frame through ``on_frame``, which returns
        what to forward in the frame's place; with ``held``, frames wait in its
        ``pending`` while a hold is on (see :meth:`hold_produce`)."""
        try:
            while not self._cut:
                try:
                    head = await src.readexactly(4)
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        if held is not None and held.held:
                            held.pending.append(exc.partial)
                        else:
                            dst.write(exc.partial)
                    break
                (size,) = struct.unpack(">i", head)
                if not 0 <= size <= _MAX_FRAME:  # not Kafka framing: copy bytes blindly
                    log.warning("frame size %d: passing the rest of the stream through", size)
                    dst.write(head)
                    await self._copy(src, dst)
                    break
                frame = await src.readexactly(size)
                chunks = on_frame(head, frame)
                if held is not None and held.held:
                    held.pending.extend(chunks)
                    continue
                for chunk in chunks:
                    dst.write(chunk)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if self._cut:
                _reset(dst)
            elif held is not None and held.held:
                held.ended = True  # the release forwards what is pending, then closes
            else:
                dst.close()

    async def _copy(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while not self._cut:
            data = await src.read(_BUF)
            if not data:
                return
            dst.write(data)
            await dst.drain()
