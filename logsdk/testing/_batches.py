"""Record batches (magic 2) inside a ProduceRequest: where they are, whose they are
(producer id, epoch, base sequence), and their base sequence rewritten.

Part of the test proxy's Kafka codec (`logsdk.testing._wire` reads the requests;
this module the record format inside them). Pure functions on bytes, no state. A rewrite
changes the base sequence and the batch's CRC-32C in place and nothing else, so a frame
keeps its size and every other byte.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from logsdk.testing._wire import ProduceRequest, Topic

log = logging.getLogger("logsdk.testing.proxy")


@dataclass
class Batch:
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


def batches(frame: bytes | bytearray, start: int, end: int) -> list[Batch]:
    """The magic-2 record batches in ``frame[start:end]`` (a partition's records)."""
    out: list[Batch] = []
    pos = start
    while pos + _B_HEADER <= end:
        (length,) = struct.unpack_from(">i", frame, pos + 8)
        if length < _B_HEADER - 12 or pos + 12 + length > end or frame[pos + _B_MAGIC] != 2:
            break
        (last_delta,) = struct.unpack_from(">i", frame, pos + _B_LAST_DELTA)
        pid, epoch, seq = struct.unpack_from(">qhi", frame, pos + _B_PRODUCER)
        out.append(Batch(pos, pos + 12 + length, pid, epoch, seq, last_delta + 1))
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


#: (producer id, epoch, topic, partition) -> [(base sequence, record count)] of the batches
#: a broker is to take as stored although it never saw them.
Lost = Mapping[tuple[int, int, Topic, int], list[tuple[int, int]]]


def renumber(frame: bytes, req: ProduceRequest, lost: Lost) -> bytes:
    """``frame`` (the ProduceRequest ``req``) with the base sequence of each batch that
    follows a lost one (same producer, epoch and partition) lowered by the lost records,
    so the broker sees no gap: as if it had recorded the lost batches' sequences. The
    CRC of each batch changed is recomputed; a frame with none to change is returned as
    it is."""
    buf: bytearray | None = None
    for topic, partitions in req.topics:
        for index, (start, end) in partitions:
            for b in batches(frame, start, end):
                gone = lost.get((b.producer_id, b.epoch, topic, index))
                shift = sum(n for seq, n in gone or () if seq < b.base_seq)
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
