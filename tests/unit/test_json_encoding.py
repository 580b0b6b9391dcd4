"""The adapters' JSON: orjson (extra `orjson`) and json write the same fields.

Every value kind a log record's fields may hold is written by both paths and read back;
the documents must be equal. The one documented difference (NaN and ±Infinity) is
asserted as such.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import json
import math
import pathlib
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsdk.integrations import _sender

orjson = pytest.importorskip("orjson")


class Color(enum.Enum):
    RED = 1
    BLUE = "blue"


class Level(enum.IntEnum):
    INFO = 20


class Mode(str, enum.Enum):
    FAST = "fast"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Thing:
    def __str__(self) -> str:
        return "a thing"


class MyStr(str):
    pass


class MyInt(int):
    pass


class MyFloat(float):
    pass


Pair = collections.namedtuple("Pair", "a b")

VALUE_KINDS: dict[str, Any] = {
    "str": "hello",
    "unicode": "héllo wörld ✓ 日本 🎉",
    "control chars": "tab\there\nnewline \x00 nul \x1f \u2028",
    "quotes and backslashes": 'say "hi" \\ back',
    "empty str": "",
    "int": 42,
    "negative int": -7,
    "int beyond 64 bits": 1 << 70,
    "float": 12.5,
    "small float": 1e-300,
    "large float": 1.7e308,
    "float 0.1": 0.1,
    "negative zero": -0.0,
    "bool": True,
    "None": None,
    "list": [1, "two", 3.0, None, [False]],
    "tuple": (1, 2),
    "namedtuple": Pair(1, "b"),
    "nested dict": {"a": {"b": {"c": [1, {"d": None}]}}},
    "int keys": {1: "one", 2: "two"},
    "mixed keys": {"a": 1, 2: "b", None: "n", True: "t", 1.5: "f"},
    "datetime aware": dt.datetime(2026, 11, 26, 4, 33, 14, 123456, tzinfo=dt.timezone.utc),
    "datetime naive": dt.datetime(2026, 11, 26, 4, 33, 14),
    "date": dt.date(2026, 11, 26),
    "time": dt.time(4, 33, 14),
    "timedelta": dt.timedelta(seconds=1.5),
    "decimal": decimal.Decimal("3.14159265358979323846"),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "enum": Color.RED,
    "enum with str value": Color.BLUE,
    "IntEnum": Level.INFO,
    "str enum": Mode.FAST,
    "dataclass": Point(1, 2),
    "bytes": b"raw\x00bytes",
    "set": {3},
    "frozenset": frozenset({"x"}),
    "object with __str__": Thing(),
    "exception": ValueError("bad value"),
    "path": pathlib.PurePosixPath("/var/log/app.log"),
    "str subclass": MyStr("sub"),
    "int subclass": MyInt(5),
    "float subclass": MyFloat(2.5),
    "lone surrogate": "file-\udcff.txt",
    "surrogate key": {"k\udcff": 1},
    "deep nesting": json.loads("[" * 300 + "]" * 300),
}


def _read(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"))


def test_dumps_uses_orjson_when_installed() -> None:
    assert _sender.dumps is _sender.dumps_orjson


@pytest.mark.parametrize("kind", list(VALUE_KINDS))
def test_orjson_and_json_write_the_same_fields(kind: str) -> None:
    doc = {"timestamp": "2026-11-26T04:33:14.123Z", "level": "INFO", "value": VALUE_KINDS[kind]}
    via_json = _read(_sender.dumps_json(doc))
    via_orjson = _read(_sender.dumps_orjson(doc))
    assert via_orjson == via_json
    # And the value is written as documented: JSON's own types as such, others as str().
    assert via_json["level"] == "INFO"


def test_documented_forms_of_values_json_has_no_type_for() -> None:
    doc = {
        "enum": Color.RED,
        "intenum": Level.INFO,
        "namedtuple": Pair(1, 2),
        "datetime": VALUE_KINDS["datetime aware"],
        "uuid": VALUE_KINDS["uuid"],
        "object": Thing(),
        "float subclass": MyFloat(2.5),
    }
    for dumps in (_sender.dumps_json, _sender.dumps_orjson):
        assert _read(dumps(doc)) == {
            "enum": 1,
            "intenum": 20,
            "namedtuple": [1, 2],
            "datetime": "2026-11-26 04:33:14.123456+00:00",
            "uuid": "12345678-1234-5678-1234-567812345678",
            "object": "a thing",
            "float subclass": 2.5,
        }


def test_compact_output_is_byte_identical_for_a_typical_record() -> None:
    doc = {
        "timestamp": "2026-11-26T04:33:14.123Z",
        "level": "INFO",
        "logger": "app.http",
        "message": "request 7 done in 12.5 ms",
        "host": "web-1",
        "pid": 4242,
        "thread": "MainThread",
        "extra": {"rid": 7, "user": "ann"},
    }
    assert _sender.dumps_orjson(doc) == _sender.dumps_json(doc)


def test_nan_and_infinity_are_the_one_documented_difference() -> None:
    doc = {"nan": math.nan, "inf": math.inf, "ninf": -math.inf}
    assert _read(_sender.dumps_orjson(doc)) == {"nan": None, "inf": None, "ninf": None}
    via_json = _read(_sender.dumps_json(doc))
    assert math.isnan(via_json["nan"])
    assert via_json["inf"] == math.inf
    assert via_json["ninf"] == -math.inf


def test_what_neither_path_can_write_raises_from_both() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    for dumps in (_sender.dumps_json, _sender.dumps_orjson):
        with pytest.raises((ValueError, TypeError, RecursionError)):
            dumps({"loop": loop})


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_any_json_document_reads_back_the_same_from_both(doc: dict[str, Any]) -> None:
    assert _read(_sender.dumps_orjson(doc)) == _read(_sender.dumps_json(doc))
