"""Custody alone: the order records reach the spool in, a spool that takes only part of a
batch, the ``when_full`` policies on a full spool, and what flush() counts as unsettled
during commits. A real spool in a temporary directory (``spool_max_bytes`` small, in
records of ``REC_BYTES``); no thread but the test's. (The policies on a full backlog are
the intake's: tests/unit/test_part_intake.py.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsdk.errors import BufferFullError, SpoolError, SpoolFullError
from logsdk.spool._codec import Columns
from tests.unit.producer_parts import (
    REC_BYTES,
    Parts,
    parts_factory,
    queue,
    queued,
    rec,
    seqs_of,
    spooled,
)


@pytest.fixture
def make_parts(tmp_path: Path) -> Iterator[Callable[..., Parts]]:
    with parts_factory(tmp_path) as make:
        yield make


def backlog(p: Parts) -> list[int]:
    return queued(p)


def unsettled(p: Parts) -> int:
    """What flush() counts as neither acknowledged nor in the spool (nothing is in flight
    here): the backlog, what custody holds, the refused waiting for the rejected table."""
    with p.intake.lock:
        return p.intake.held() + p.custody.held() + p.rejects.pending()


def delivered(p: Parts) -> int:
    """Every row of the spool was replayed and acknowledged: it leaves the spool."""
    ids = [rid for rid, _ in spooled(p.spool)]
    p.spool.delete(ids)
    p.custody.check_room()
    return len(ids)


# -- order ------------------------------------------------------------------------------


def test_failed_records_go_to_the_spool_first_in_seq_order(
    make_parts: Callable[..., Parts],
) -> None:
    """Records a client handed back (in any order) are written sorted by seq, before the
    backlog's head, and the backlog after them in its order."""
    p = make_parts()
    queue(p, [5, 6, 7])
    for s in (3, 1, 4, 2):
        p.custody.take_back(rec(s))
    assert not p.custody.spool_pending(0)  # nothing left
    assert seqs_of(p.spool) == [1, 2, 3, 4, 5, 6, 7]
    assert p.custody.spooled == 7
    assert not p.custody.failed
    assert backlog(p) == []
    assert unsettled(p) == 0


def test_a_partial_take_of_failed_records_lets_nothing_newer_in_before_the_rest(
    make_parts: Callable[..., Parts],
) -> None:
    """The spool takes 2 of 3 failed records: the third stays in ``failed``, and a smaller,
    newer backlog record that would fit the room left is not written before it; once rows
    leave the spool, the rest goes in, then the backlog: written in send order."""
    p = make_parts(spool_max_bytes=2 * REC_BYTES + 100)
    p.intake.put_back([rec(4, value=b"")])  # 64 bytes: fits the 100 left
    for s in (1, 2, 3):
        p.custody.take_back(rec(s))
    assert not p.custody.spool_pending(0)
    assert seqs_of(p.spool) == [1, 2]
    assert [r[5] for r in p.custody.failed] == [3]
    assert backlog(p) == [4]
    assert p.intake.spool_full
    written = spooled(p.spool)
    delivered(p)
    assert not p.intake.spool_full
    p.custody.spool_pending(0)
    written += spooled(p.spool)
    assert [seq for _, seq in sorted(written)] == [1, 2, 3, 4]
    assert unsettled(p) == 0


def test_a_partial_take_of_the_backlog_puts_the_rest_back_at_its_head(
    make_parts: Callable[..., Parts],
) -> None:
    """The spool takes 3 of 5 backlog records: the other 2 go back to the backlog's head in
    their order, and stay there (nothing written) while the spool has no room."""
    p = make_parts(spool_max_bytes=3 * REC_BYTES)
    queue(p, [1, 2, 3, 4, 5])
    assert p.custody.spool_pending(0)  # more left
    assert seqs_of(p.spool) == [1, 2, 3]
    assert backlog(p) == [4, 5]
    assert not p.custody.spool_pending(0)
    assert seqs_of(p.spool) == [1, 2, 3]
    assert backlog(p) == [4, 5]
    assert p.counters.dropped == 0
    delivered(p)
    queue(p, [6])
    assert not p.custody.spool_pending(0)
    assert seqs_of(p.spool) == [4, 5, 6]


# -- when_full: the spool is full (the pump's commits) -----------------------------------


def test_drop_newest_on_a_full_spool_drops_what_does_not_fit(
    make_parts: Callable[..., Parts],
) -> None:
    """The spool has room for 3 of 5: the 2 newest are dropped and counted, the 3 oldest
    written; nothing is left in memory."""
    p = make_parts(when_full="drop_newest", spool_max_bytes=3 * REC_BYTES)
    queue(p, [1, 2, 3, 4, 5])
    assert not p.custody.spool_pending(0)
    assert seqs_of(p.spool) == [1, 2, 3]
    assert p.counters.dropped == 2
    assert p.custody.spooled == 3
    assert unsettled(p) == 0


@pytest.mark.parametrize(("in_flight", "left"), [(0, [3, 4, 5]), (1, [1, 4, 5])])
def test_drop_oldest_on_a_full_spool_drops_its_oldest_rows_not_those_in_flight(
    make_parts: Callable[..., Parts], in_flight: int, left: list[int]
) -> None:
    """A full spool makes room for 2 new records by dropping its 2 oldest rows, past the
    replay's cursor (a row handed to Kafka is not the policy's to drop); counted; the rows
    left are in send order."""
    p = make_parts(when_full="drop_oldest", spool_max_bytes=3 * REC_BYTES)
    queue(p, [1, 2, 3])
    p.custody.spool_pending(0)
    cursor = spooled(p.spool)[in_flight - 1][0] if in_flight else 0
    queue(p, [4, 5])
    assert not p.custody.spool_pending(cursor)
    assert seqs_of(p.spool) == left
    assert p.counters.dropped == 2
    assert backlog(p) == []


@pytest.mark.parametrize(
    ("may_arrive", "left"), [(False, [2, 3, 4, 5]), (True, [1, 2, 4, 5]), (None, [1, 2, 4, 5])]
)
def test_drop_oldest_keeps_the_rows_a_retired_client_may_still_deliver(
    make_parts: Callable[..., Parts], may_arrive: bool | None, left: list[int]
) -> None:
    """Records a client handed back that it may have sent (True), or rows the replay had
    handed to a client retired since (None), are not dropped to make room: the oldest of
    the newer rows is; counted. Records that cannot arrive (False) go as the oldest."""
    p = make_parts(when_full="drop_oldest", spool_max_bytes=4 * REC_BYTES)
    if may_arrive is None:
        queue(p, [1, 2])
        p.custody.spool_pending(0)
        p.custody.keep_rows(spooled(p.spool)[-1][0])  # a degrade: the replay's cursor
    else:
        for s in (1, 2):
            p.custody.take_back(rec(s), may_arrive)
        p.custody.spool_pending(0)
    queue(p, [3])
    p.custody.spool_pending(0)
    queue(p, [4, 5])
    assert not p.custody.spool_pending(0)  # the replay starts again from the first row
    assert seqs_of(p.spool) == left
    assert p.counters.dropped == 1
    assert backlog(p) == []


@pytest.mark.parametrize(
    ("policy", "error"), [("raise", SpoolFullError), ("block", BufferFullError)]
)
def test_raise_and_block_refuse_new_records_while_the_spool_is_full(
    make_parts: Callable[..., Parts], policy: str, error: type[Exception]
) -> None:
    """A commit that found the spool full keeps the rest in memory and says so
    (``spool_full``): send() refuses new records (``raise`` at once, ``block`` after
    max_block_s) although the backlog has room; nothing is dropped."""
    p = make_parts(when_full=policy, spool_max_bytes=2 * REC_BYTES, max_block_s=0.02)
    queue(p, [1, 2, 3])
    p.custody.spool_pending(0)
    assert p.intake.spool_full
    p.intake.warmed()
    with pytest.raises(error, match="spool is full"):
        p.intake.send(b"v" * 100)
    assert seqs_of(p.spool) == [1, 2]
    assert backlog(p) == [3]
    assert p.counters.dropped == 0


# -- what flush() counts ---------------------------------------------------------------


@pytest.mark.parametrize("policy", ["block", "drop_newest"])
def test_unsettled_never_misses_a_record_while_a_commit_runs(
    make_parts: Callable[..., Parts], monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """Records in memory (``unsettled()``) + rows in the spool + dropped never count less
    than the records not yet delivered: before and after each step, and inside each
    commit, before and after the spool's write (which once fails: disk full)."""
    p = make_parts(when_full=policy, spool_max_bytes=6 * REC_BYTES)
    c, spool = p.custody, p.spool
    for s in (4, 2, 3, 1):
        c.take_back(rec(s))
    queue(p, range(5, 11))
    undelivered = 10

    def held() -> int:
        return unsettled(p) + spool.count + p.counters.dropped

    seen: list[tuple[int, int]] = []  # (held, undelivered) inside the commits
    real = spool.append_columns
    fail = [True]

    def write(cols: Columns, total: int | None = None) -> None:
        seen.append((held(), undelivered))
        if fail[0]:
            fail[0] = False
            raise SpoolError("disk full (a stand-in)")
        real(cols, total)
        seen.append((held(), undelivered))

    monkeypatch.setattr(spool, "append_columns", write)
    assert held() == undelivered
    assert not c.spool_pending(0)  # the write failed: the records stay in memory
    assert p.alarm.reason is not None
    assert [r[5] for r in c.failed] == [1, 2, 3, 4]
    assert held() == undelivered
    p.alarm.retry_now()
    c.spool_pending(0)  # 1-4, then 5-6 fit: 7-10 back to the backlog (or dropped)
    assert p.alarm.reason is None
    assert held() == undelivered
    undelivered -= delivered(p)
    assert held() == undelivered
    c.spool_pending(0)
    assert held() == undelivered
    assert len(seen) == (7 if policy == "block" else 5)  # drop_newest: 7-10 were dropped
    assert all(n >= floor for n, floor in seen)
