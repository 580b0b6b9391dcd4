"""Seq blocks reserved ahead (``SeqReserver``) and ``wait_for_seq``, alone: a real spool
in a temporary directory, blocks of 8 seqs (``LOGSDK_TEST_SEQ_BLOCK``), the send path
played by the test (a seq is taken as send() takes it, under the send lock)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsdk.errors import ConfigError, ProducerClosedError, SpoolError
from logsdk.producer._gate import Gate
from logsdk.producer._identity import ENV_SEQ_BLOCK, SeqReserver, seq_block, wait_for_seq
from logsdk.producer._tally import Tally
from logsdk.spool import Spool
from tests.unit.producer_parts import Parts, fake_clock, parts_factory, reserved_on_disk

BLOCK = 8


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SEQ_BLOCK, str(BLOCK))


@pytest.fixture
def make_parts(tmp_path: Path) -> Iterator[Callable[..., Parts]]:
    with parts_factory(tmp_path) as make:
        yield make


def take_seq(gate: Gate) -> int:
    """send(): take the next seq from memory, under the send lock."""
    with gate.lock:
        seq = gate.seq_next
        assert seq < gate.seq_limit
        gate.seq_next = seq + 1
    return seq


def test_the_block_comes_from_the_test_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """LOGSDK_TEST_SEQ_BLOCK sets the block; anything but an integer >= 2 is refused."""
    assert seq_block() == BLOCK
    for bad in ("1", "x", "-4"):
        monkeypatch.setenv(ENV_SEQ_BLOCK, bad)
        with pytest.raises(ConfigError, match=ENV_SEQ_BLOCK):
            seq_block()


def test_the_next_block_is_reserved_once_half_is_used_and_never_before(
    make_parts: Callable[..., Parts],
) -> None:
    """The pump's reserve_ahead() after each seq taken: the reservation moves exactly when
    half of the block is used, by one block ahead of the next seq; state.json and the
    spool hold it before a seq of it is taken, so both stay above every seq handed out."""
    p = make_parts()
    gate, spool_dir = p.gate, p.spool.directory
    assert (gate.seq_next, gate.seq_limit) == (0, BLOCK)
    assert reserved_on_disk(spool_dir) == p.spool.seq_reserved == BLOCK
    moves = []
    handed: list[int] = []
    for _ in range(5 * BLOCK):
        before = gate.seq_limit
        p.seqs.reserve_ahead(gate)
        if gate.seq_next >= before - BLOCK // 2:
            assert gate.seq_limit == before + BLOCK
            moves.append(gate.seq_next)
        else:
            assert gate.seq_limit == before
        assert reserved_on_disk(spool_dir) == p.spool.seq_reserved == gate.seq_limit
        handed.append(take_seq(gate))
        assert max(handed) < reserved_on_disk(spool_dir)
    assert moves == [4, 12, 20, 28, 36]
    assert handed == list(range(5 * BLOCK))
    assert p.errors["seq_reservation"] == 0


def test_a_failed_reservation_is_retried_a_second_later_and_counted(
    make_parts: Callable[..., Parts], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk refuses a reservation (a disk-full stand-in): nothing moves, it is counted
    in errors, not tried again before a second has passed, then made."""
    p = make_parts()
    clock = fake_clock(monkeypatch)
    gate = p.gate
    for _ in range(BLOCK // 2):
        take_seq(gate)
    real = p.spool.reserve_seq
    tries: list[int] = []

    def reserve(upto: int) -> None:
        tries.append(upto)
        if len(tries) == 1:
            raise SpoolError("disk full (a stand-in)")
        real(upto)

    monkeypatch.setattr(p.spool, "reserve_seq", reserve)
    p.seqs.reserve_ahead(gate)
    assert tries == [2 * BLOCK]
    assert gate.seq_limit == BLOCK
    assert reserved_on_disk(p.spool.directory) == BLOCK
    assert p.errors["seq_reservation"] == 1
    clock.advance(0.875)  # binary fractions: exact sums
    p.seqs.reserve_ahead(gate)
    assert len(tries) == 1
    clock.advance(0.125)
    p.seqs.reserve_ahead(gate)
    assert len(tries) == 2
    assert gate.seq_limit == reserved_on_disk(p.spool.directory) == 2 * BLOCK
    assert p.errors["seq_reservation"] == 1


def _all_taken(gate: Gate) -> None:
    with gate.lock:
        gate.seq_next = gate.seq_limit


def test_a_sender_out_of_seqs_waits_for_the_pump_and_is_counted(
    make_parts: Callable[..., Parts],
) -> None:
    """send() caught up with the reservation: wait_for_seq wakes the pump and waits; the
    pump (a thread the seqs and the spool are handed to) reserves the next block, and the
    sender takes the first seq of it. The wait is counted in ``seq_waits``."""
    p = make_parts()
    gate, wake = p.gate, p.requests.wake
    _all_taken(gate)
    wake.clear()

    def pump() -> None:
        assert wake.wait(30)
        p.seqs.reserve_ahead(gate)

    t = threading.Thread(target=pump, name="pump-stand-in")
    p.seqs.owner.hand_to(t)
    p.spool.owner.hand_to(t)
    t.start()
    with gate.lock:
        seq = wait_for_seq(gate, wake, 30.0, lambda: None)
        gate.seq_next = seq + 1
    t.join(30)
    p.seqs.owner.take()
    p.spool.owner.take()
    assert seq == BLOCK
    assert gate.seq_waits == 1
    assert gate.seq_limit == 2 * BLOCK == reserved_on_disk(p.spool.directory)


def test_a_sender_out_of_seqs_gives_up_after_max_block_s(
    make_parts: Callable[..., Parts],
) -> None:
    """No reservation within max_block_s: SpoolError naming the reservation and the
    spool alarm; the wait is counted."""
    p = make_parts()
    gate = p.gate
    _all_taken(gate)
    with gate.lock, pytest.raises(SpoolError, match="reserved up to 8; spool alarm: disk full"):
        wait_for_seq(gate, p.requests.wake, 0.02, lambda: "disk full")
    assert gate.seq_waits == 1
    assert gate.seq_next == BLOCK


def test_a_sender_out_of_seqs_is_refused_when_the_producer_closes(
    make_parts: Callable[..., Parts],
) -> None:
    """close() begins while a sender waits for seqs: it raises ProducerClosedError."""
    p = make_parts()
    gate, wake = p.gate, p.requests.wake
    _all_taken(gate)
    wake.clear()

    def close() -> None:
        assert wake.wait(30)
        with gate.lock:
            gate.closing = True
            gate.space.notify_all()

    t = threading.Thread(target=close, name="close-stand-in")
    t.start()
    with gate.lock, pytest.raises(ProducerClosedError):
        wait_for_seq(gate, wake, 30.0, lambda: None)
    t.join(30)
    assert gate.seq_waits == 1


@pytest.mark.parametrize(
    "files",
    [("spool.db", "spool.db-wal", "state.json"), ("spool.db", "spool.db-wal")],
    ids=["all-files", "state.json-lost"],
)
def test_a_crash_leaves_a_gap_never_a_reuse(
    make_parts: Callable[..., Parts], files: tuple[str, ...]
) -> None:
    """Seqs taken, then a crash: the spool's files as they are at that instant (the
    database and its WAL, the open connection never closed, no clean-close summary; with
    or without state.json). A new SeqReserver on them, under the same producer id, starts
    at the old reservation: above every seq handed out (a gap), never below."""
    p = make_parts()
    gate = p.gate
    handed = []
    for _ in range(BLOCK - 2):
        p.seqs.reserve_ahead(gate)
        handed.append(take_seq(gate))
    reserved = reserved_on_disk(p.spool.directory)
    assert (max(handed), reserved) == (BLOCK - 3, 2 * BLOCK)
    crashed = p.spool.directory.parent / "after-crash"
    crashed.mkdir(mode=0o700)
    for name in files:
        shutil.copy2(p.spool.directory / name, crashed / name)
    spool = Spool(crashed).open()
    try:
        assert spool.checked_at_open  # no summary of a clean close: the full checks ran
        assert spool.producer_id == p.spool.producer_id
        again = SeqReserver(spool, Tally()).gate()
        first = take_seq(again)
        assert first == reserved
        assert first > max(handed)
        assert spool.seq_reserved == reserved_on_disk(crashed) == reserved + BLOCK
    finally:
        spool.close()
