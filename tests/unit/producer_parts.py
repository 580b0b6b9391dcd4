"""Helpers for the tests of the producer's parts alone (tests/unit/test_part_*.py).

The parts are wired by the producer's own wiring (``logsdk.producer._wiring.wire``), on a
real :class:`Spool` in a temporary directory, and no thread is started: the building
thread owns them all (the pump's state, the spool, the seq reservations, the in-flight
table). Neighbours that
would be Kafka are simple stand-ins (:class:`StandInClient`, :class:`Msg`), used only
where a test is about a part's own logic, never to show a Kafka guarantee.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from logsdk.producer._config import ProducerConfig
from logsdk.producer._pump import State
from logsdk.producer._records import Rec
from logsdk.producer._wiring import Parts, wire
from logsdk.spool import Spool

__all__ = ["Parts", "State"]

TOPIC = "parts"
#: Bytes a record made by :func:`rec` counts against spool_max_bytes (value + row overhead).
REC_BYTES = 100 + 64


def rec(seq: int, value: bytes | None = None) -> Rec:
    """A record in memory as send() makes it: ``seq``, a 100-byte value unless given."""
    return (TOPIC, None, b"v" * 100 if value is None else value, None, 1, seq)


def spooled(spool: Spool) -> list[tuple[int, int]]:
    """(id, seq) of every row the spool holds, in id order (the order they were written)."""
    return [(r[0], r[6]) for r in spool.read_after(0, 10**6)]


def seqs_of(spool: Spool) -> list[int]:
    """The seqs of the rows the spool holds, in id order."""
    return [seq for _, seq in spooled(spool)]


def reserved_on_disk(spool_dir: Path) -> int:
    """``seq_reserved`` as ``state.json`` holds it now."""
    return int(json.loads((spool_dir / "state.json").read_text())["seq_reserved"])


class FakeClock:
    """``time.monotonic`` for tests: moves only when the test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Install a :class:`FakeClock` as ``time.monotonic`` for the test."""
    clock = FakeClock()
    monkeypatch.setattr(time, "monotonic", clock)
    return clock


@dataclass
class Produced:
    """One produce() call a :class:`StandInClient` took."""

    topic: str
    value: bytes | None
    key: bytes | None
    #: The delivery callback: an InFlight ticket or a Replayer ack (an int subclass).
    callback: Any
    headers: list[tuple[str, bytes | str | None]]


class StandInClient:
    """A client whose produce() records each call (with its delivery callback, for the test
    to call later), or raises what ``refuse(value)`` returns (BufferError, ValueError, a
    KafkaException)."""

    def __init__(self) -> None:
        self.calls: list[Produced] = []
        self.refuse: Callable[[bytes | None], BaseException | None] = lambda value: None

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int,
        on_delivery: Callable[[Any, Any], None],
        callback: object,
        timestamp: int,
        headers: list[tuple[str, bytes | str | None]],
    ) -> None:
        exc = self.refuse(value)
        if exc is not None:
            raise exc
        self.calls.append(Produced(topic, value, key, on_delivery, headers))


class _Msg:
    """A delivery report's message: what the parts read of one."""

    def __init__(
        self,
        offset: int | None,
        partition: int = 0,
        topic: str = TOPIC,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self._offset = offset
        self._partition = partition
        self._topic = topic
        self._headers = headers

    def offset(self) -> int | None:
        return self._offset

    def partition(self) -> int:
        return self._partition

    def topic(self) -> str:
        return self._topic

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers


def msg(
    offset: int | None,
    partition: int = 0,
    topic: str = TOPIC,
    headers: list[tuple[str, bytes]] | None = None,
) -> Any:
    """A stand-in for the Message of a delivery report (typed Any: it goes where the
    parts expect confluent_kafka's)."""
    return _Msg(offset, partition, topic, headers)


def build_parts(spool_dir: Path, **settings: Any) -> Parts:
    """The parts of a producer on a spool in ``spool_dir`` (``settings``: ProducerConfig's),
    wired as every producer's are; the pump's first state DEGRADED (set another with
    ``parts.pump.begin(state)``)."""
    cfg = ProducerConfig(
        bootstrap_servers="127.0.0.1:1", topic=TOPIC, spool_dir=str(spool_dir), **settings
    )
    spool = Spool(spool_dir, max_bytes=cfg.spool_max_bytes).open()
    parts = wire(cfg, spool)
    parts.pump.begin(State.DEGRADED)
    return parts


def queue(p: Parts, seqs: Iterable[int]) -> None:
    """Records with these seqs in the backlog, behind what it holds (as send() appends)."""
    intake = p.intake
    held = intake.take(len(intake.backlog))
    intake.put_back([*held, *(rec(s) for s in seqs)])


def queued(p: Parts) -> list[int]:
    """The seqs of the records in the backlog, in order."""
    with p.intake.lock:
        return [r[5] for r in p.intake.backlog]


@contextlib.contextmanager
def parts_factory(tmp_path: Path) -> Iterator[Callable[..., Parts]]:
    """``make(**settings)``: :func:`build_parts` on a fresh spool dir under ``tmp_path``;
    every spool made is closed on the way out (by the test's thread, which takes it back
    from a thread the test handed it to once that thread has ended)."""
    made: list[Parts] = []

    def make(**settings: Any) -> Parts:
        d = tmp_path / f"spool-{len(made)}"
        p = build_parts(d, **settings)
        made.append(p)
        return p

    try:
        yield make
    finally:
        for p in made:
            p.spool.owner.take()
            p.spool.close()
            p.flight.forget()
            p.replay.forget()


def damage_a_page(spool_dir: Path, rows: int = 3000) -> None:
    """A closed spool of ``rows`` rows of 1000 bytes (ids 1..rows) with one page in the
    middle of its table overwritten, as a disk error would, its mtime kept: the next open
    trusts the clean-close summary and the damage is found by a read (as
    tests/unit/test_spool.py ``_damaged`` does)."""
    sp = Spool(spool_dir).open()
    sp.reserve_seq(rows)
    sp.append([("t", None, bytes(1000), None, 1, i) for i in range(rows)])
    sp.close()
    db = spool_dir / "spool.db"
    st = db.stat()
    with db.open("r+b") as f:
        f.seek(st.st_size // 2 // 4096 * 4096)
        f.write(b"\xff" * 4096)
    os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns))
