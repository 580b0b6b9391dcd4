"""A record as a row: its fields, its headers as one blob, and the bytes it counts.

The shape in which the producer, the shm ring and the spool hand records to each other:
a `Row` (topic, key, value, headers blob, timestamp, seq), or many rows transposed
into `Columns`, the shape a spool commit takes.

Invariants:
- a headers blob is (u16 name length, u32 value length, name, value)* with a value length
  of ``0xFFFFFFFF`` for a None value, and ``None`` for no headers at all:
  `decode_headers()` gives back exactly what `encode_headers()` was given (an empty
  list for None); the spool stores the blob as it is, so rows written by any logsdk that
  used this format read back the same;
- the bytes a row counts against ``spool_max_bytes`` are its key, value and headers blob
  plus `ROW_OVERHEAD`: `row_size()` of one row, `columns_bytes()` of
  transposed rows, and the ``size`` column SQLite computes for each row the spool stores
  all agree.

Owner: none. Pure functions and types, no state; any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

#: Bytes counted per row on top of key, value and headers (ids, topic, timestamps).
ROW_OVERHEAD = 64

#: One row as the producer hands it over: topic, key, value, headers blob, ts, seq.
Row = tuple[str, bytes | None, bytes | None, bytes | None, int | None, int]
#: A row read back: id, topic, key, value, headers blob, ts, seq, size.
StoredRow = tuple[int, str, bytes | None, bytes | None, bytes | None, int | None, int, int]
#: A row read back for replay: id, topic, key, value, headers blob, ts, seq.
#: As a stored row, without ``size``, and with ``seq`` as its decimal digits (bytes): the
#: value of the ``logsdk.seq`` header, formatted by SQLite.
ReplayRow = tuple[int, str, bytes | None, bytes | None, bytes | None, int | None, bytes]
#: Rows transposed (``zip(*rows)``): topics, keys, values, headers blobs, timestamps, seqs.
Columns = list[tuple[Any, ...]]

Headers = list[tuple[str, bytes | None]]

_H = struct.Struct(">HI")
_NONE = 0xFFFFFFFF


def encode_headers(headers: Headers | None) -> bytes | None:
    """Pack user headers as (u16 name length, u32 value length, name, value)*."""
    if not headers:
        return None
    out = bytearray()
    for name, value in headers:
        nb = name.encode()
        out += _H.pack(len(nb), _NONE if value is None else len(value))
        out += nb
        if value is not None:
            out += value
    return bytes(out)


def decode_headers(blob: bytes | None) -> Headers:
    """Inverse of `encode_headers()`."""
    if not blob:
        return []
    out: Headers = []
    i, n = 0, len(blob)
    while i < n:
        nlen, vlen = _H.unpack_from(blob, i)
        i += _H.size
        name = blob[i : i + nlen].decode()
        i += nlen
        if vlen == _NONE:
            out.append((name, None))
        else:
            out.append((name, blob[i : i + vlen]))
            i += vlen
    return out


def row_size(row: Row) -> int:
    """Bytes a row counts against ``spool_max_bytes``."""
    return len(row[1] or b"") + len(row[2] or b"") + len(row[3] or b"") + ROW_OVERHEAD


def transpose(rows: Sequence[Row]) -> Columns:
    """``rows`` as their 6 columns, transposed in C (no Python loop over the rows)."""
    return list(zip(*rows, strict=True)) if rows else [() for _ in range(6)]


def columns_bytes(cols: Columns) -> int:
    """``sum(row_size(r) for r in rows)`` of the rows ``cols`` holds."""
    _, keys, values, headers, _, _ = cols
    return (
        sum(map(len, filter(None, keys)))
        + sum(map(len, filter(None, values)))
        + sum(map(len, filter(None, headers)))
        + ROW_OVERHEAD * len(keys)
    )
