"""The Kafka wire codec of the test proxy (`logsdk.testing._proxy`): pure functions
on bytes, no sockets, no state.

- Frames: every Kafka message on a connection is an int32 size, then the message
  (`frame_size()`). A request starts with its header (api key, version, correlation
  id: `request_header()`), a response with the correlation id of the request it
  answers (`response_correlation_id()`); a client expects the responses in the order
  of its requests.
- Requests the proxy reads: ProduceRequest v3-13 (`parse_produce()`; the record
  batches inside it: `logsdk.testing._batches`), all-topics MetadataRequest v1-13
  (`metadata_all_topics()`), ListOffsetsRequest v1-10 asking EARLIEST
  (`list_offsets_earliest()`). Any other version or API is "not understood": the
  parser returns None and the proxy passes the frame unchanged.
- Frames the proxy writes or rewrites: a ProduceResponse it makes up
  (`duplicate_response()`), the error code of topics in a MetadataResponse
  (`metadata_topic_errors()`, `set_topic_errors()`), the offset of partitions in
  a ListOffsetsResponse (`list_offsets_answers()`, `set_offsets()`).

Invariants: a rewrite changes only the fields it names, in place, so a frame keeps its
size and every other byte. A request parser returns None for a frame it cannot read
(short, malformed, another API or version); a response reader raises one of
`NOT_UNDERSTOOD` instead, and the caller passes that response unchanged.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

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
MAX_FRAME = 1 << 30
#: What the response readers raise on a frame they cannot read.
NOT_UNDERSTOOD = (IndexError, struct.error, UnicodeDecodeError)


# -- frames and headers -----------------------------------------------------------------------


def frame_size(head: bytes) -> int | None:
    """The size a frame's 4-byte prefix gives, or None when it cannot be Kafka framing
    (negative, or above `MAX_FRAME`)."""
    (size,) = struct.unpack(">i", head)
    return size if 0 <= size <= MAX_FRAME else None


def request_header(frame: bytes) -> tuple[int, int, int] | None:
    """A request's (api key, api version, correlation id); None if the frame is too short
    to hold them."""
    if len(frame) < 8:
        return None
    api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
    return api_key, version, correlation_id


def response_correlation_id(frame: bytes) -> int | None:
    """The correlation id a response frame answers; None if the frame is too short."""
    if len(frame) < 4:
        return None
    (correlation_id,) = struct.unpack_from(">i", frame)
    return int(correlation_id)


# -- primitive types --------------------------------------------------------------------------


class Decoder:
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

    def int8(self) -> int:
        return int(struct.unpack(">b", self._take(1))[0])

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


def encode_uvarint(n: int) -> bytes:
    """``n`` as an unsigned varint (the lengths of flexible versions)."""
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
Topic = str | bytes


@dataclass
class ProduceRequest:
    """What the proxy needs from a ProduceRequest."""

    version: int
    correlation_id: int
    acks: int
    #: (topic, [(partition index, (start, end) of its records in the frame)]) in order.
    topics: list[tuple[Topic, list[tuple[int, tuple[int, int]]]]]


def parse_produce(frame: bytes) -> ProduceRequest | None:
    """Decode a ProduceRequest frame (without its size prefix); None if it is not one
    this proxy understands (another API, an unsupported version, or malformed)."""
    try:
        d = Decoder(frame)
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
        topics: list[tuple[Topic, list[tuple[int, tuple[int, int]]]]] = []
        for _ in range(max(d.array_len(flexible), 0)):
            by_id = version >= _PRODUCE_TOPIC_ID
            topic: Topic = d.uuid() if by_id else d.string(flexible) or ""
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
    return ProduceRequest(version, correlation_id, acks, topics)


def duplicate_response(req: ProduceRequest, error_code: int = DUPLICATE_SEQUENCE_NUMBER) -> bytes:
    """A whole ProduceResponse frame (size prefix included) answering ``req`` with
    ``error_code`` and base offset -1 for each of its partitions."""
    v = req.version
    flexible = v >= _PRODUCE_FLEXIBLE

    def array(n: int) -> bytes:
        return encode_uvarint(n + 1) if flexible else struct.pack(">i", n)

    tags = b"\x00" if flexible else b""
    out = bytearray(struct.pack(">i", req.correlation_id))
    out += tags  # response header v1 (flexible versions) ends with tagged fields
    out += array(len(req.topics))
    for topic, partitions in req.topics:
        if isinstance(topic, bytes):
            out += topic
        else:
            name = topic.encode()
            out += encode_uvarint(len(name) + 1) if flexible else struct.pack(">h", len(name))
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
                out += (
                    encode_uvarint(0) if flexible else struct.pack(">h", -1)
                )  # error_message null
            out += tags
        out += tags
    out += struct.pack(">i", 0)  # throttle_time_ms (v1+)
    out += tags
    return struct.pack(">i", len(out)) + bytes(out)


def metadata_all_topics(frame: bytes) -> int | None:
    """The version of a MetadataRequest for all topics (topics null), else None."""
    try:
        d = Decoder(frame)
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


def metadata_topic_errors(frame: bytes, version: int) -> list[tuple[int, str | None]]:
    """Where each topic's error code sits in a MetadataResponse frame, with its name."""
    flexible = version >= _METADATA_FLEXIBLE
    d = Decoder(frame)
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
        d.int8()  # is_internal (v1+)
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


def list_offsets_earliest(frame: bytes) -> tuple[int, frozenset[tuple[str, int]]] | None:
    """The version of a ListOffsetsRequest and the (topic, partition) pairs it asks the
    earliest offset of; None for any other request, a version this proxy cannot read, or
    a request that asks no earliest offset."""
    try:
        d = Decoder(frame)
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
            d.int8()  # isolation level
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


def list_offsets_answers(frame: bytes, version: int) -> list[tuple[str, int, int, int]]:
    """Each partition of a ListOffsetsResponse frame: (topic, partition, error code,
    where its offset sits in the frame)."""
    flexible = version >= _LIST_OFFSETS_FLEXIBLE
    d = Decoder(frame)
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


# -- rewriting --------------------------------------------------------------------------------


def set_topic_errors(frame: bytes, spots: Iterable[int], error_code: int) -> bytes:
    """``frame`` (a MetadataResponse) with ``error_code`` at each topic's error code
    position in ``spots`` (from `metadata_topic_errors()`)."""
    buf = bytearray(frame)
    for at in spots:
        struct.pack_into(">h", buf, at, error_code)
    return bytes(buf)


def set_offsets(frame: bytes, spots: Iterable[int], offset: int) -> bytes:
    """``frame`` (a ListOffsetsResponse) with ``offset`` at each partition's offset
    position in ``spots`` (from `list_offsets_answers()`)."""
    buf = bytearray(frame)
    for at in spots:
        struct.pack_into(">q", buf, at, offset)
    return bytes(buf)
