"""What a record is in memory, and what send() accepts as one.

Invariants owned here:
- a record in memory is a plain tuple ``Rec`` (topic, key, value, user headers, timestamp
  ms, seq) whose fields are str, bytes, int or None (and a list of user headers), so the
  garbage collector stops tracking it (see `_Ticket`);
- what send() accepts converts to those fields or is refused with a
  [`SerializationError`][logsdk.errors.SerializationError] before it is accepted: no lone surrogate,
  no NUL in a header name, no ``logsdk.`` header of the caller's;
- every record Kafka receives carries ``logsdk.producer`` and ``logsdk.seq`` last
  (`kafka_headers()`, the one rule; ``Intake.send`` inlines it on the hot path).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Message

from logsdk.errors import SerializationError
from logsdk.spool._codec import Headers, Row, encode_headers

#: Header names every record carries, so any reader can drop duplicates.
HEADER_PRODUCER = "logsdk.producer"
HEADER_SEQ = "logsdk.seq"

#: A record in memory: topic, key, value, user headers, timestamp ms, seq.
Rec = tuple[str, bytes | None, bytes | None, Headers | None, int | None, int]
#: Headers as confluent-kafka takes them.
KHeaders = list[tuple[str, str | bytes | None]]


#: A dict value's JSON (compact, no NaN): one encoder for every record, as ``json.dumps``
#: with arguments would build one per call; ``encode()`` keeps no state between calls.
_DICT_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def kafka_headers(producer: tuple[str, bytes], seq: bytes, user: Headers | None) -> KHeaders:
    """The headers a record carries to Kafka: the user's, then ``logsdk.producer``
    (``producer``: the header, made once per producer) and ``logsdk.seq`` (``seq``: the
    number as ASCII digits), last, so that a reader finds them at the end."""
    if user:
        return [*user, producer, (HEADER_SEQ, seq)]
    return [producer, (HEADER_SEQ, seq)]


def _to_bytes(value: object, what: str) -> bytes | None:
    if value is None:
        return None
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: not text Kafka can carry
            raise SerializationError(
                f"{what} is not valid Unicode text ({exc.reason} at {exc.start}); "
                "pass bytes, or text without lone surrogates"
            ) from exc
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dict) and what == "value":
        try:
            text = _DICT_ENCODER.encode(value)
            return text.encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise SerializationError(f"value is not JSON-serialisable: {exc}") from exc
    raise SerializationError(
        f"{what} must be bytes, str{' or a JSON-serialisable dict' if what == 'value' else ''}"
        f" or None, got {type(value).__name__}"
    )


def _is_utf8_text(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _user_headers(headers: object) -> Headers | None:
    if headers is None:
        return None
    items: Sequence[Any]
    if isinstance(headers, Mapping):
        items = list(headers.items())
    elif isinstance(headers, (list, tuple)):
        items = headers
    else:
        raise SerializationError("headers must be a mapping or a list of (str, bytes) pairs")
    out: Headers = []
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise SerializationError(f"header {item!r} is not a (name, value) pair")
        name, val = item
        if not isinstance(name, str):
            raise SerializationError(f"header name {name!r} must be str")
        if "\x00" in name or (not name.isascii() and not _is_utf8_text(name)):
            raise SerializationError(
                f"header name {name!r} must be text without NUL or lone surrogates"
            )
        if name.startswith("logsdk."):
            raise SerializationError(f"header names starting with 'logsdk.' are reserved: {name}")
        out.append((name, _to_bytes(val, f"header {name!r}")))
    return out or None


def _headers_of(msg: Message) -> Headers:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(n, v.encode() if isinstance(v, str) else v) for n, v in items]


def _seq_of(msg: Message) -> int:
    for name, val in reversed(_headers_of(msg)):
        if name == HEADER_SEQ and val is not None:
            return int(val)
    return -1


def _row(rec: Rec) -> Row:
    topic, k, v, h, ts, seq = rec
    return (topic, k, v, encode_headers(h), ts, seq)
