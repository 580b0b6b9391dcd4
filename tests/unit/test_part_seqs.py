"""Seq blocks reserved ahead (``SeqReserver``) and a sender that waits for them, alone: a
real spool in a temporary directory, blocks of 8 seqs (``LOGSDK_TEST_SEQ_BLOCK``), the
send path the intake's own (each record takes the next seq, under the send lock)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsdk.errors import ConfigError, ProducerClosedError, SpoolError
from logsdk.producer._counters import Counters
from logsdk.producer._identity import ENV_SEQ_BLOCK, SeqReserver, seq_block
from logsdk.producer._intake import Intake
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


def take_seq(intake: Intake) -> int:
    """send() one record: it takes the next seq from memory (never waiting here)."""
    seq = intake.seq_next
    assert seq < intake.seq_limit
    intake.send(b"x")
    assert intake.seq_next == seq + 1
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
    intake, spool_dir = p.intake, p.spool.directory
    assert (intake.seq_next, intake.seq_limit) == (0, BLOCK)
    assert reserved_on_disk(spool_dir) == p.spool.seq_reserved == BLOCK
    moves = []
    handed: list[int] = []
    for _ in range(5 * BLOCK):
        before = intake.seq_limit
        p.seqs.reserve_ahead(intake)
        if intake.seq_next >= before - BLOCK // 2:
            assert intake.seq_limit == before + BLOCK
            moves.append(intake.seq_next)
        else:
            assert intake.seq_limit == before
        assert reserved_on_disk(spool_dir) == p.spool.seq_reserved == intake.seq_limit
        handed.append(take_seq(intake))
        assert max(handed) < reserved_on_disk(spool_dir)
    assert moves == [4, 12, 20, 28, 36]
    assert handed == list(range(5 * BLOCK))
    assert p.counters.errors["seq_reservation"] == 0


def test_a_failed_reservation_is_retried_a_second_later_and_counted(
    make_parts: Callable[..., Parts], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk refuses a reservation (a disk-full stand-in): nothing moves, it is counted
    in errors, not tried again before a second has passed, then made."""
    p = make_parts()
    clock = fake_clock(monkeypatch)
    intake = p.intake
    for _ in range(BLOCK // 2):
        take_seq(intake)
    real = p.spool.reserve_seq
    tries: list[int] = []

    def reserve(upto: int) -> None:
        tries.append(upto)
        if len(tries) == 1:
            raise SpoolError("disk full (a stand-in)")
        real(upto)

    monkeypatch.setattr(p.spool, "reserve_seq", reserve)
    p.seqs.reserve_ahead(intake)
    assert tries == [2 * BLOCK]
    assert intake.seq_limit == BLOCK
    assert reserved_on_disk(p.spool.directory) == BLOCK
    assert p.counters.errors["seq_reservation"] == 1
    clock.advance(0.875)  # binary fractions: exact sums
    p.seqs.reserve_ahead(intake)
    assert len(tries) == 1
    clock.advance(0.125)
    p.seqs.reserve_ahead(intake)
    assert len(tries) == 2
    assert intake.seq_limit == reserved_on_disk(p.spool.directory) == 2 * BLOCK
    assert p.counters.errors["seq_reservation"] == 1


def _all_taken(intake: Intake) -> None:
    """Records sent until every seq reserved is taken."""
    while intake.seq_next < intake.seq_limit:
        intake.send(b"x")


def take_seq_waiting(intake: Intake) -> int:
    """send() one record, which may wait for its seq; the seq it took."""
    before = len(intake.backlog)
    intake.send(b"x")
    assert len(intake.backlog) == before + 1
    return intake.backlog[-1][5]


def test_a_sender_out_of_seqs_waits_for_the_pump_and_is_counted(
    make_parts: Callable[..., Parts],
) -> None:
    """send() caught up with the reservation: it wakes the pump and waits; the pump (a
    thread the seqs and the spool are handed to) reserves the next block, and the sender
    takes the first seq of it. The wait is counted in ``seq_waits``."""
    p = make_parts()
    intake, wake = p.intake, p.requests.wake
    _all_taken(intake)
    wake.clear()

    def pump() -> None:
        assert wake.wait(30)
        p.seqs.reserve_ahead(intake)

    t = threading.Thread(target=pump, name="pump-stand-in")
    p.seqs.owner.hand_to(t)
    p.spool.owner.hand_to(t)
    t.start()
    seq = take_seq_waiting(intake)
    t.join(30)
    p.seqs.owner.take()
    p.spool.owner.take()
    assert seq == BLOCK
    assert intake.seq_waits == 1
    assert intake.seq_limit == 2 * BLOCK == reserved_on_disk(p.spool.directory)


def test_a_sender_out_of_seqs_gives_up_after_max_block_s(
    make_parts: Callable[..., Parts],
) -> None:
    """No reservation within max_block_s: SpoolError naming the reservation and the
    spool alarm; the wait is counted."""
    p = make_parts(max_block_s=0.02)
    intake = p.intake
    _all_taken(intake)
    p.alarm.failed(SpoolError("disk full"), "write")
    with pytest.raises(SpoolError, match="reserved up to 8; spool alarm: disk full"):
        intake.send(b"x")
    assert intake.seq_waits == 1
    assert intake.seq_next == BLOCK


def test_a_sender_out_of_seqs_is_refused_when_the_producer_closes(
    make_parts: Callable[..., Parts],
) -> None:
    """close() begins while a sender waits for seqs: it raises ProducerClosedError."""
    p = make_parts()
    intake, wake = p.intake, p.requests.wake
    _all_taken(intake)
    wake.clear()

    def close() -> None:
        assert wake.wait(30)
        assert intake.close()

    t = threading.Thread(target=close, name="close-stand-in")
    t.start()
    with pytest.raises(ProducerClosedError):
        intake.send(b"x")
    t.join(30)
    assert intake.seq_waits == 1


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
    intake = p.intake
    handed = []
    for _ in range(BLOCK - 2):
        p.seqs.reserve_ahead(intake)
        handed.append(take_seq(intake))
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
        first, _ = SeqReserver(spool, Counters()).span()
        assert first == reserved
        assert first > max(handed)
        assert spool.seq_reserved == reserved_on_disk(crashed) == reserved + BLOCK
    finally:
        spool.close()
