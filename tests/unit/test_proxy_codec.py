"""The test proxy's Kafka codec without sockets: frames captured between librdkafka and
the embedded broker, and frames of other versions encoded here by hand; each parser and
rewriter checked on them."""

from __future__ import annotations

import struct
import uuid

import pytest

from logsdk.testing._batches import Batch, batches, crc32c, renumber
from logsdk.testing._wire import (
    DUPLICATE_SEQUENCE_NUMBER,
    MAX_FRAME,
    NOT_UNDERSTOOD,
    Decoder,
    ProduceRequest,
    Topic,
    duplicate_response,
    encode_uvarint,
    frame_size,
    list_offsets_answers,
    list_offsets_earliest,
    metadata_all_topics,
    metadata_topic_errors,
    parse_produce,
    request_header,
    response_correlation_id,
    set_offsets,
    set_topic_errors,
)

# Frames (size prefix left out) captured between librdkafka 2.16.0 (confluent-kafka 2.16.1)
# and the embedded broker (Tansu 0.6) through the proxy: an idempotent producer sending
# three records to partition 0 of topic "cap", then list_topics() and
# get_watermark_offsets().
#: ProduceRequest v10, correlation id 4, acks -1: one batch (producer id 1, epoch 0,
#: base sequence 0, 3 records) whose CRC librdkafka computed.
PRODUCE_V10 = bytes.fromhex(
    "0000000a00000004000772646b61666b610000ffff000075300204636170020000000"
    "05f000000000000000000000052000000000238c844e2000000000002000001a222c88bc800"
    "0001a222c88bc800000000000000010000000000000000000314000000046b3004763000140"
    "00002046b310476310014000004046b3204763200000000"
)
#: The broker's answer to it: error 0, base offset 0.
PRODUCE_V10_RESPONSE = bytes.fromhex(
    "00000004000204636170020000000000000000000000000000ffffffffffffffff00000000"
    "00000000010000000000000000"
)
#: MetadataRequest v12 for all topics (correlation id 5), and one for topic "cap".
METADATA_ALL_V12 = bytes.fromhex("0003000c00000005000772646b61666b610000000000010000")
METADATA_NAMED_V12 = bytes.fromhex(
    "0003000c00000005000772646b61666b610002000000000000000000000000000000000463617000010000"
)
#: The answer to the all-topics request: one broker, topic "cap" (its error code at 49).
METADATA_V12_RESPONSE = bytes.fromhex(
    "000000050000000000020000006f0a3132372e302e302e310000847100000e74616e73755f6"
    "36c75737465720000006f0200000463617001a222c88bc67c00a17ee19ba5183b4d000200000"
    "00000000000006f00000000020000006f020000006f0100800000000000"
)
#: ListOffsetsRequest v7 asking EARLIEST (correlation id 3) and LATEST (4) of cap[0].
LIST_OFFSETS_EARLIEST_V7 = bytes.fromhex(
    "0002000700000003000772646b61666b6100ffffffff0102046361700200000000ffffffff"
    "fffffffffffffffe000000"
)
LIST_OFFSETS_LATEST_V7 = bytes.fromhex(
    "0002000700000004000772646b61666b6100ffffffff0102046361700200000000ffffffff"
    "ffffffffffffffff000000"
)
#: The answer to the EARLIEST request: cap[0] at offset 0 (its offset at 29).
LIST_OFFSETS_V7_RESPONSE = bytes.fromhex(
    "000000030000000000020463617002000000000000000001a222c88dc1000000000000000000000000000000"
)


# -- encoding by hand -------------------------------------------------------------------------


def i8(n: int) -> bytes:
    return struct.pack(">b", n)


def i16(n: int) -> bytes:
    return struct.pack(">h", n)


def i32(n: int) -> bytes:
    return struct.pack(">i", n)


def i64(n: int) -> bytes:
    return struct.pack(">q", n)


def s16(s: str | None) -> bytes:
    """A (nullable) string of a non-flexible version."""
    return i16(-1) if s is None else i16(len(s)) + s.encode()


def compact(b: bytes | None) -> bytes:
    """A (nullable) compact string or byte array of a flexible version."""
    return encode_uvarint(0) if b is None else encode_uvarint(len(b) + 1) + b


def request(api_key: int, version: int, correlation_id: int, flexible: bool) -> bytes:
    """A request header (v1, or v2 with its tagged fields when flexible)."""
    out = i16(api_key) + i16(version) + i32(correlation_id) + s16("test")
    return out + encode_uvarint(0) if flexible else out


def record_batch(producer_id: int, epoch: int, base_seq: int, count: int) -> bytes:
    """A RecordBatch (magic 2) of ``count`` records (their bytes made up), its CRC right."""
    after_crc = (
        i16(0)  # attributes
        + i32(count - 1)  # last offset delta
        + i64(1_000)  # base timestamp
        + i64(1_000)  # max timestamp
        + i64(producer_id)
        + i16(epoch)
        + i32(base_seq)
        + i32(count)
        + b"\x01" * (7 * count)  # the records
    )
    body = i32(-1) + i8(2) + struct.pack(">I", crc32c(after_crc)) + after_crc
    return i64(0) + i32(len(body)) + body


def produce_v3(topics: list[tuple[str, list[tuple[int, bytes]]]], acks: int = 1) -> bytes:
    out = request(0, 3, 77, False) + s16(None) + i16(acks) + i32(30_000) + i32(len(topics))
    for name, partitions in topics:
        out += s16(name) + i32(len(partitions))
        for index, records in partitions:
            out += i32(index) + i32(len(records)) + records
    return out


def produce_v13(topics: list[tuple[bytes, list[tuple[int, bytes]]]]) -> bytes:
    out = request(0, 13, 78, True) + compact(None) + i16(-1) + i32(30_000)
    out += encode_uvarint(len(topics) + 1)
    for topic_id, partitions in topics:
        out += topic_id + encode_uvarint(len(partitions) + 1)
        for index, records in partitions:
            out += i32(index) + compact(records) + encode_uvarint(0)
        out += encode_uvarint(0)
    return out + encode_uvarint(0)


def stored_crc(frame: bytes, b: Batch) -> int:
    return int(struct.unpack_from(">I", frame, b.pos + 17)[0])


def computed_crc(frame: bytes, b: Batch) -> int:
    return crc32c(frame[b.pos + 21 : b.end])


# -- frames and primitives --------------------------------------------------------------------


def test_frame_size_accepts_kafka_sizes_only() -> None:
    """A size prefix from 0 to MAX_FRAME is a frame; a negative or larger one is not."""
    assert frame_size(i32(0)) == 0
    assert frame_size(i32(len(PRODUCE_V10))) == 133
    assert frame_size(i32(MAX_FRAME)) == MAX_FRAME
    assert frame_size(i32(MAX_FRAME + 1)) is None
    assert frame_size(i32(-1)) is None
    assert frame_size(b"HTTP") is None


def test_headers_need_the_whole_header() -> None:
    """A request's api key, version and correlation id; a response's correlation id; None
    for a frame too short to hold them."""
    assert request_header(PRODUCE_V10) == (0, 10, 4)
    assert request_header(METADATA_ALL_V12) == (3, 12, 5)
    assert request_header(PRODUCE_V10[:7]) is None
    assert response_correlation_id(LIST_OFFSETS_V7_RESPONSE) == 3
    assert response_correlation_id(b"\x00\x00\x01") is None


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16_383, 16_384, 2**31, 2**63 - 1])
def test_uvarint_round_trips(n: int) -> None:
    """An unsigned varint decodes to what was encoded, and uses all its bytes."""
    data = encode_uvarint(n)
    d = Decoder(data)
    assert d.uvarint() == n
    assert d.pos == len(data)


def test_decoder_reads_both_encodings_and_refuses_short_data() -> None:
    """Strings and arrays, plain (int16/int32 lengths) and flexible (varint length + 1),
    null as -1 or 0; data cut short raises IndexError, a varint over 64 bits too."""
    d = Decoder(s16("ab") + s16(None) + compact(b"cd") + compact(None) + i32(-1) + b"\x03")
    assert d.string(False) == "ab"
    assert d.string(False) is None
    assert d.string(True) == "cd"
    assert d.string(True) is None
    assert d.array_len(False) == -1
    assert d.array_len(True) == 2
    with pytest.raises(IndexError):
        Decoder(i16(5) + b"abc").string(False)
    with pytest.raises(IndexError):
        Decoder(b"\xff" * 10).uvarint()
    tags = [encode_uvarint(n) for n in (2, 0, 1)] + [b"x"] + [encode_uvarint(n) for n in (7, 0)]
    d = Decoder(b"".join(tags) + b"next")
    d.skip_tags()  # two tagged fields: tag 0 (1 byte), then tag 7 (empty)
    assert d.pos == 6


# -- record batches ---------------------------------------------------------------------------


def test_crc32c_is_castagnoli_and_agrees_with_librdkafka() -> None:
    """The standard check value, and the CRC librdkafka wrote into the captured batch."""
    assert crc32c(b"123456789") == 0xE3069283
    req = parse_produce(PRODUCE_V10)
    assert req is not None
    (b,) = batches(PRODUCE_V10, *req.topics[0][1][0][1])
    assert stored_crc(PRODUCE_V10, b) == computed_crc(PRODUCE_V10, b) == 0x38C844E2


def test_batches_read_each_header_and_stop_at_what_is_not_one() -> None:
    """Position, end, producer id, epoch, base sequence and count of each batch; reading
    stops at a batch of another magic or one cut short."""
    one, two = record_batch(5, 1, 10, 3), record_batch(5, 1, 13, 2)
    data = b"xx" + one + two
    got = batches(data, 2, len(data))
    assert got == [
        Batch(2, 2 + len(one), 5, 1, 10, 3),
        Batch(2 + len(one), len(data), 5, 1, 13, 2),
    ]
    old = bytearray(two)
    old[16] = 1  # magic 1
    assert len(batches(one + bytes(old), 0, len(one) + len(old))) == 1
    assert len(batches(one + two, 0, len(one) + len(two) - 1)) == 1


# -- ProduceRequest -------------------------------------------------------------------------


def test_parse_captured_produce_v10() -> None:
    """librdkafka's request: version, correlation id, acks, and where cap[0]'s records are."""
    req = parse_produce(PRODUCE_V10)
    assert req == ProduceRequest(10, 4, -1, [("cap", [(0, (36, 130))])])
    assert batches(PRODUCE_V10, 36, 130) == [Batch(36, 130, 1, 0, 0, 3)]


def test_parse_produce_v3_and_v13_by_hand() -> None:
    """The oldest version read (plain encoding) and the newest (topics named by id): every
    topic and partition, in order, with the span of its records."""
    b1, b2, b3 = record_batch(1, 0, 0, 2), record_batch(1, 0, 2, 1), record_batch(2, 0, 0, 4)
    frame = produce_v3([("a", [(0, b1), (3, b2)]), ("bb", [(1, b3)])])
    req = parse_produce(frame)
    assert req is not None
    assert (req.version, req.correlation_id, req.acks) == (3, 77, 1)
    assert [(t, [i for i, _ in ps]) for t, ps in req.topics] == [("a", [0, 3]), ("bb", [1])]
    spans = [span for _, ps in req.topics for _, span in ps]
    assert [frame[s:e] for s, e in spans] == [b1, b2, b3]
    topic_id = uuid.uuid4().bytes
    frame = produce_v13([(topic_id, [(2, b3)])])
    req = parse_produce(frame)
    assert req is not None
    assert (req.version, req.correlation_id, req.acks) == (13, 78, -1)
    ((topic, [(index, (s, e))]),) = req.topics
    assert (topic, index, frame[s:e]) == (topic_id, 2, b3)


def test_parse_produce_refuses_what_it_cannot_read() -> None:
    """Another API, a version outside 3-13, or a frame cut short: None."""
    assert parse_produce(METADATA_ALL_V12) is None
    for version in (2, 14):
        frame = bytearray(PRODUCE_V10)
        struct.pack_into(">h", frame, 2, version)
        assert parse_produce(bytes(frame)) is None
    assert parse_produce(PRODUCE_V10[:60]) is None


def test_renumber_lowers_later_batches_of_a_lost_one_and_fixes_their_crc() -> None:
    """Batches of the same producer, epoch and partition after a lost one move down by its
    records, their CRC recomputed; earlier ones, other producers and epochs, and every
    other byte stay; nothing lost, the same frame back."""
    parts = [
        (0, record_batch(5, 0, 7, 3) + record_batch(5, 0, 13, 2) + record_batch(5, 1, 20, 1)),
        (1, record_batch(5, 0, 20, 1) + record_batch(6, 0, 20, 1)),
    ]
    frame = produce_v3([("t", parts)])
    req = parse_produce(frame)
    assert req is not None
    assert renumber(frame, req, {}) is frame
    lost: dict[tuple[int, int, Topic, int], list[tuple[int, int]]] = {
        (5, 0, "t", 0): [(10, 3)],
        (5, 0, "t", 1): [(4, 2), (30, 5)],
    }
    out = renumber(frame, req, lost)
    assert len(out) == len(frame)
    spans = [span for _, span in req.topics[0][1]]
    got = [b for s, e in spans for b in batches(out, s, e)]
    assert [b.base_seq for b in got] == [7, 10, 20, 18, 20]
    assert all(stored_crc(out, b) == computed_crc(out, b) for b in got)
    changed = {i for i, (x, y) in enumerate(zip(frame, out, strict=True)) if x != y}
    allowed = {b.pos + off for b in (got[1], got[3]) for off in [*range(17, 21), *range(53, 57)]}
    assert changed <= allowed


# -- ProduceResponse made up ------------------------------------------------------------------


def test_duplicate_response_has_the_layout_of_the_brokers_answer() -> None:
    """For the captured request, the made-up answer is the broker's real one but for the
    error (46 instead of 0), the base offset and the log start offset (-1)."""
    req = parse_produce(PRODUCE_V10)
    assert req is not None
    made = duplicate_response(req)
    assert frame_size(made[:4]) == len(made) - 4
    body = made[4:]
    assert len(body) == len(PRODUCE_V10_RESPONSE)
    # correlation id 4, tags, 1 topic "cap", 1 partition: index at 11, then the fields.
    assert struct.unpack_from(">ihq", body, 11) == (0, DUPLICATE_SEQUENCE_NUMBER, -1)
    assert struct.unpack_from(">ihq", PRODUCE_V10_RESPONSE, 11) == (0, 0, 0)
    assert struct.unpack_from(">q", body, 33) == (-1,)  # log start offset
    changed = {i for i, (x, y) in enumerate(zip(body, PRODUCE_V10_RESPONSE, strict=True)) if x != y}
    assert changed <= {*range(15, 25), *range(33, 41)}


@pytest.mark.parametrize("version", [3, 13])
def test_duplicate_response_answers_every_partition(version: int) -> None:
    """Plain and flexible, by name and by id: each partition answered with the error and
    base offset -1, in the request's order, then throttle time 0."""
    b = record_batch(1, 0, 0, 1)
    topic_id = uuid.uuid4().bytes
    frame = (
        produce_v3([("a", [(0, b), (4, b)])])
        if version == 3
        else produce_v13([(topic_id, [(0, b), (4, b)])])
    )
    req = parse_produce(frame)
    assert req is not None
    made = duplicate_response(req, error_code=7)
    flexible = version >= 9
    d = Decoder(made[4:])
    assert d.int32() == req.correlation_id
    if flexible:
        d.skip_tags()
    assert d.array_len(flexible) == 1
    assert (d.uuid() if version >= 13 else d.string(flexible)) == (topic_id if flexible else "a")
    assert d.array_len(flexible) == 2
    for index in (0, 4):
        assert (d.int32(), d.int16(), d.int64()) == (index, 7, -1)
        assert d.int64() == -1  # log append time
        if version >= 5:
            assert d.int64() == -1  # log start offset
        if version >= 8:
            assert d.array_len(flexible) == 0  # record errors
            assert d.string(flexible) is None  # error message
        if flexible:
            d.skip_tags()
    if flexible:
        d.skip_tags()
    assert d.int32() == 0
    if flexible:
        d.skip_tags()
    assert d.pos == len(made) - 4


# -- Metadata ---------------------------------------------------------------------------------


def metadata_v1_response(topics: list[str]) -> bytes:
    out = i32(9) + i32(1) + i32(1) + s16("localhost") + i32(9092) + s16(None) + i32(1)
    out += i32(len(topics))
    for name in topics:
        out += i16(0) + s16(name) + i8(0) + i32(2)
        for index in range(2):
            out += i16(0) + i32(index) + i32(1) + i32(1) + i32(1) + i32(1) + i32(1)
    return out


def test_metadata_all_topics_is_told_from_named_requests() -> None:
    """An all-topics request (topics null) gives its version; one naming topics, one with
    an empty list, and an unsupported version give None."""
    assert metadata_all_topics(METADATA_ALL_V12) == 12
    assert metadata_all_topics(METADATA_NAMED_V12) is None
    assert metadata_all_topics(request(3, 1, 1, False) + i32(-1)) == 1
    assert metadata_all_topics(request(3, 1, 1, False) + i32(0)) is None
    assert metadata_all_topics(request(3, 0, 1, False) + i32(-1)) is None
    assert metadata_all_topics(PRODUCE_V10) is None


def test_topic_errors_found_and_set_in_captured_response() -> None:
    """Where "cap"'s error code is in the broker's v12 answer; setting it changes those two
    bytes and nothing else."""
    assert metadata_topic_errors(METADATA_V12_RESPONSE, 12) == [(49, "cap")]
    out = set_topic_errors(METADATA_V12_RESPONSE, [49], 5)
    assert struct.unpack_from(">h", out, 49) == (5,)
    assert out[:49] + out[51:] == METADATA_V12_RESPONSE[:49] + METADATA_V12_RESPONSE[51:]
    assert metadata_topic_errors(out, 12) == [(49, "cap")]


def test_topic_errors_of_a_v1_response_by_hand() -> None:
    """Each topic of a plain v1 answer, in order; the error set on one of them only."""
    frame = metadata_v1_response(["a", "bb"])
    spots = metadata_topic_errors(frame, 1)
    assert [name for _, name in spots] == ["a", "bb"]
    out = set_topic_errors(frame, [spots[1][0]], 3)
    assert [Decoder(out, at).int16() for at, _ in spots] == [0, 3]
    with pytest.raises(NOT_UNDERSTOOD):
        metadata_topic_errors(frame[:-3], 1)


# -- ListOffsets ------------------------------------------------------------------------------


def test_list_offsets_earliest_in_captured_requests() -> None:
    """librdkafka's EARLIEST request names cap[0]; its LATEST request asks none: None."""
    assert list_offsets_earliest(LIST_OFFSETS_EARLIEST_V7) == (7, frozenset({("cap", 0)}))
    assert list_offsets_earliest(LIST_OFFSETS_LATEST_V7) is None
    assert list_offsets_earliest(PRODUCE_V10) is None


@pytest.mark.parametrize("version", [1, 4])
def test_list_offsets_earliest_by_hand(version: int) -> None:
    """Only the partitions asked EARLIEST (-2), of every topic; not LATEST (-1) nor a time;
    a version outside 1-10 or a frame cut short: None."""
    out = request(2, version, 1, False) + i32(-1) + (i8(0) if version >= 2 else b"")
    asks = [("a", [(0, -2), (1, -1)]), ("b", [(2, 1_000), (3, -2)])]
    out += i32(len(asks))
    for name, partitions in asks:
        out += s16(name) + i32(len(partitions))
        for index, ts in partitions:
            out += i32(index) + (i32(-1) if version >= 4 else b"") + i64(ts)
    assert list_offsets_earliest(out) == (version, frozenset({("a", 0), ("b", 3)}))
    assert list_offsets_earliest(out[:-4]) is None
    bad = bytearray(out)
    struct.pack_into(">h", bad, 2, 11)
    assert list_offsets_earliest(bytes(bad)) is None


def test_list_offsets_answers_found_and_set_in_captured_response() -> None:
    """cap[0]'s offset in the broker's v7 answer; setting it changes those 8 bytes only."""
    assert list_offsets_answers(LIST_OFFSETS_V7_RESPONSE, 7) == [("cap", 0, 0, 29)]
    out = set_offsets(LIST_OFFSETS_V7_RESPONSE, [29], 42)
    assert Decoder(out, 29).int64() == 42
    assert out[:29] + out[37:] == LIST_OFFSETS_V7_RESPONSE[:29] + LIST_OFFSETS_V7_RESPONSE[37:]


@pytest.mark.parametrize("version", [1, 4])
def test_list_offsets_answers_by_hand(version: int) -> None:
    """Each partition of a plain answer with its error code and where its offset is."""
    out = i32(1) + (i32(0) if version >= 2 else b"") + i32(1) + s16("a") + i32(2)
    for index, error, offset in ((0, 0, 5), (1, 6, -1)):
        out += i32(index) + i16(error) + i64(-1) + i64(offset)
        out += i32(0) if version >= 4 else b""
    got = list_offsets_answers(out, version)
    assert [(t, p, e) for t, p, e, _ in got] == [("a", 0, 0), ("a", 1, 6)]
    assert [Decoder(out, at).int64() for *_, at in got] == [5, -1]
    with pytest.raises(NOT_UNDERSTOOD):
        list_offsets_answers(out[:-5], version)
