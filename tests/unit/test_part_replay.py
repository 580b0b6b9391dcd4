"""The ``Replayer`` alone: a real spool of 20 rows (ids 1-20, values ``v1``-``v20``, seqs
101-120) in a temporary directory, a stand-in client whose produce() records each row's
callback (a reused ticket), which the test then calls with stand-in messages, as
librdkafka's poll would."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from logsdk.producer._records import HEADER_SEQ
from tests.unit.producer_parts import (
    TOPIC,
    FakeClock,
    Parts,
    StandInClient,
    fake_clock,
    msg,
    parts_factory,
)

ROWS = 20


@pytest.fixture
def make_parts(tmp_path: Path) -> Iterator[Callable[..., Parts]]:
    with parts_factory(tmp_path) as make:
        yield make


def replaying(make_parts: Callable[..., Parts], **settings: object) -> Parts:
    """Parts whose spool holds rows 1-20 (value ``v<id>``, seq 100 + id); replay batches
    of 3 (6 in flight at most), no rate limit unless given."""
    p = make_parts(**{"replay_batch": 3, "replay_max_rate": None, **settings})
    p.spool.append([(TOPIC, None, b"v%d" % i, None, 1, 100 + i) for i in range(1, ROWS + 1)])
    return p


def row_of(call: Any) -> int:
    """The spool row id of a produce() call (row ``i`` holds the value ``v<i>``)."""
    return int(call.value[1:])


def handed(client: StandInClient) -> list[int]:
    """The spool row ids handed to the client, in the order it took them."""
    return [row_of(c) for c in client.calls]


def ids_left(p: Parts) -> list[int]:
    return [r[0] for r in p.spool.read_after(0, 10**6)]


def ack(client: StandInClient, rid: int, err: KafkaError | None = None) -> None:
    """Kafka's report of row ``rid``: acknowledged (an offset), or ``err``."""
    (call,) = [c for c in client.calls if row_of(c) == rid]
    seq = next(v for n, v in call.headers if n == HEADER_SEQ)
    assert isinstance(seq, bytes)
    call.callback(err, msg(offset=None if err else 1000 + rid, headers=[(HEADER_SEQ, seq)]))


def test_rows_are_handed_over_in_id_order_at_most_two_batches_in_flight(
    make_parts: Callable[..., Parts],
) -> None:
    """Rows go in id order from the cursor, a batch at a time, with their seq header; with
    2 * replay_batch in flight nothing more goes until a report frees room."""
    p = replaying(make_parts)
    r = p.replay
    client: Any = StandInClient()
    assert r.replay_some(client)
    assert handed(client) == [1, 2, 3]
    assert r.replay_some(client)
    assert not r.replay_some(client)
    assert handed(client) == [1, 2, 3, 4, 5, 6]
    assert list(r.inflight) == [1, 2, 3, 4, 5, 6]
    assert r.cursor == 6
    assert client.calls[0].headers == [p.flight.pid_header, (HEADER_SEQ, b"101")]
    assert client.calls[0].value == b"v1"
    ack(client, 1)
    assert r.replay_some(client)
    assert handed(client) == [1, 2, 3, 4, 5, 6, 7]
    assert list(r.inflight) == [2, 3, 4, 5, 6, 7]


def test_a_full_client_queue_stops_the_batch_and_the_row_goes_next_time(
    make_parts: Callable[..., Parts],
) -> None:
    """produce() raising BufferError on row 2: row 1 is in flight, the cursor stays before
    row 2, and the next call hands 2, 3, 4."""
    p = replaying(make_parts)
    r = p.replay
    client: Any = StandInClient()
    client.refuse = lambda value: BufferError("queue full") if value == b"v2" else None
    assert r.replay_some(client)
    assert (handed(client), r.cursor) == ([1], 1)
    client.refuse = lambda value: None
    assert r.replay_some(client)
    assert handed(client) == [1, 2, 3, 4]


def test_tickets_are_reused_once_reported_and_never_while_in_flight(
    make_parts: Callable[..., Parts],
) -> None:
    """All 20 rows replayed through 6 tickets (the window): a ticket comes back only with
    its report, so the ones in flight are always distinct, and each report names the row
    its ticket carried then; a ticket produce() refused goes back at once."""
    p = replaying(make_parts)
    r = p.replay
    client: Any = StandInClient()
    client.refuse = lambda value: BufferError("queue full") if value == b"v1" else None
    assert not r.replay_some(client)  # refused: its ticket is free again
    assert len(r.rows) == 1
    assert len(r.free) == 1
    client.refuse = lambda value: None
    acked: list[int] = []
    while r.cursor < ROWS or r.inflight:
        r.replay_some(client)
        flying = [c.callback for c in client.calls if row_of(c) in r.inflight]
        assert len({id(t) for t in flying}) == len(flying) == len(r.inflight)
        oldest = next(iter(r.inflight))
        ack(client, oldest)
        acked.append(oldest)
    assert acked == list(range(1, ROWS + 1))
    assert sorted(r.acked_ids) == acked  # each report named its own row
    assert len(r.rows) == 6  # the window: no ticket made past it
    assert len({id(c.callback) for c in client.calls}) == 6
    assert len(r.free) == 6


def test_the_replay_keeps_to_the_pace(
    make_parts: Callable[..., Parts], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 8 rows a second (bursts of 3, the batch): nothing at the start of a recovery,
    2 rows after 0.25 s, 1 after 0.125 s more, 3 (the burst) after a long pause; the window
    of 6 in flight still holds."""
    p = replaying(make_parts, replay_max_rate=8.0)
    clock: FakeClock = fake_clock(monkeypatch)
    r = p.replay
    client: Any = StandInClient()
    r.pace.reset()  # a recovery begins
    assert not r.replay_some(client)
    clock.advance(0.25)
    r.replay_some(client)
    assert handed(client) == [1, 2]
    clock.advance(0.125)
    r.replay_some(client)
    assert handed(client) == [1, 2, 3]
    clock.advance(100)
    r.replay_some(client)
    assert handed(client) == [1, 2, 3, 4, 5, 6]
    clock.advance(100)
    assert not r.replay_some(client)
    assert len(r.inflight) == 6


def test_while_recovering_acked_rows_are_deleted_by_watermark(
    make_parts: Callable[..., Parts],
) -> None:
    """Acknowledged rows are deleted once a batch of them is acknowledged (or nothing is
    in flight), up to the row before the oldest still in flight; acknowledged rows above
    it wait for a later delete."""
    p = replaying(make_parts)
    r = p.replay
    client: Any = StandInClient()
    r.replay_some(client)
    r.replay_some(client)
    ack(client, 1)
    ack(client, 2)
    assert not r.settle(recovering=True, client_up=True)  # fewer than a batch
    assert ids_left(p) == list(range(1, ROWS + 1))
    ack(client, 4)
    assert r.settle(recovering=True, client_up=True)
    assert ids_left(p) == list(range(3, ROWS + 1))  # 3 is in flight: 4 waits
    assert r.replayed == 2
    assert r.acked_ids == [4]
    ack(client, 3)
    ack(client, 5)
    assert not r.settle(recovering=True, client_up=True)
    ack(client, 6)
    assert r.settle(recovering=True, client_up=True)  # nothing in flight
    assert ids_left(p) == list(range(7, ROWS + 1))
    assert r.replayed == 6
    assert p.spool.count == ROWS - 6
    assert not r.busy()


@pytest.mark.parametrize(
    ("recovering", "client_up"),
    [(False, False), (False, True), (True, False)],
    ids=["degraded", "online", "recovering-without-client"],
)
def test_otherwise_acked_rows_are_deleted_by_id(
    make_parts: Callable[..., Parts], recovering: bool, client_up: bool
) -> None:
    """Outside a replay under way (degraded, online, no client), exactly the acknowledged
    rows are deleted, by id: row 2, still in flight, stays."""
    p = replaying(make_parts)
    r = p.replay
    client: Any = StandInClient()
    r.replay_some(client)
    ack(client, 1)
    ack(client, 3)
    assert r.settle(recovering=recovering, client_up=client_up) is not recovering
    if recovering:  # one row in flight and fewer than a batch acknowledged: later
        r.forget_inflight()
        assert r.settle(recovering=recovering, client_up=client_up)
    assert ids_left(p) == [2, *range(4, ROWS + 1)]
    assert r.replayed == 2


def test_after_a_failed_replay_acked_rows_are_deleted_by_id(
    make_parts: Callable[..., Parts],
) -> None:
    """Row 1's replay fails (a degrade is asked for); rows 2 and 3 are acknowledged: while
    recovering they are deleted by id, and row 1, neither in flight nor acknowledged,
    stays (a watermark would have deleted it). Read again from the start after the
    restart."""
    p = replaying(make_parts)
    r = p.replay
    client: Any = StandInClient()
    r.replay_some(client)
    ack(client, 1, KafkaError(KafkaError._MSG_TIMED_OUT))
    reason = p.requests.take_degrade()
    assert reason is not None
    assert reason.startswith("replay delivery failed")
    ack(client, 2)
    ack(client, 3)
    assert r.settle(recovering=True, client_up=True)
    assert ids_left(p) == [1, *range(4, ROWS + 1)]
    assert r.replayed == 2
    r.restart()
    again: Any = StandInClient()
    r.replay_some(again)
    assert handed(again) == [1, 4, 5]


def test_refused_rows_go_to_the_rejected_table(make_parts: Callable[..., Parts]) -> None:
    """A row the client refuses (bad fields) and one Kafka refuses on delivery (too large)
    are counted, moved to the spool's rejected table at the next settle, and the replay
    goes on past them; a row refused at produce for itself is set aside too."""
    p = replaying(make_parts)
    r = p.replay
    client: Any = StandInClient()
    refusals: dict[bytes, BaseException] = {
        b"v2": ValueError("bad field"),
        b"v4": KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)),
    }
    client.refuse = lambda value: refusals.get(value or b"")
    r.replay_some(client)
    r.replay_some(client)
    assert handed(client) == [1, 3, 5, 6]
    assert r.cursor == 6
    ack(client, 3, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    for rid in (1, 5, 6):
        ack(client, rid)
    assert p.counters.rejected == 3
    assert p.requests.take_degrade() is None  # the record's fault, not Kafka's
    assert r.settle(recovering=True, client_up=True)
    assert p.spool.rejected_count() == 3
    assert ids_left(p) == list(range(7, ROWS + 1))
    assert r.replayed == 3
