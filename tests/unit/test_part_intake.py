"""The intake alone: send() into the backlog (the ``when_full`` policies on a full one, a
sender waiting its turn), direct sends (the hot path hands librdkafka the same call as
``InFlight.produce``), a refused record's seq, and the pump's side (take, put back, direct
on and off). A real spool in a temporary directory, a stand-in client; no thread but the
test's, except where a test shows a sender waiting for room."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from logsdk.errors import BufferFullError, RecordTooLargeError, SerializationError, SpoolFullError
from logsdk.producer._records import HEADER_SEQ, kafka_headers
from tests.unit.producer_parts import Parts, StandInClient, State, parts_factory, queued


@pytest.fixture
def make_parts(tmp_path: Path) -> Iterator[Callable[..., Parts]]:
    with parts_factory(tmp_path) as make:
        yield make


def direct(p: Parts) -> StandInClient:
    """ONLINE with a stand-in client installed, as the first send() makes it."""
    client = StandInClient()
    p.pump.begin(State.ONLINE)
    p.intake.go_direct(lambda: p.flight.install(client) is None)  # type: ignore[arg-type,func-returns-value]
    assert p.intake.direct
    return client


# -- into the backlog --------------------------------------------------------------------


def test_records_queue_in_send_order_with_seqs_in_order(make_parts: Callable[..., Parts]) -> None:
    """Without direct sends (no client yet, or DEGRADED), each record takes the next seq and
    joins the backlog behind the others; the pump is woken."""
    p = make_parts()
    p.requests.wake.clear()
    for i in range(3):
        p.intake.send(b"%d" % i, key=b"k")
    assert queued(p) == [0, 1, 2]
    assert [r[2] for r in p.intake.backlog] == [b"0", b"1", b"2"]
    assert p.intake.sent == 3
    assert p.requests.wake.is_set()


@pytest.mark.parametrize(
    ("policy", "left"), [("drop_newest", [0, 1, 2]), ("drop_oldest", [2, 3, 4])]
)
def test_drop_policies_on_a_full_backlog_count_each_drop_and_keep_send_order(
    make_parts: Callable[..., Parts], policy: str, left: list[int]
) -> None:
    """A full backlog drops the new record (drop_newest) or its head (drop_oldest), counts
    each drop once, and keeps the others in send order; every record counts as sent."""
    p = make_parts(when_full=policy, buffer_max_records=3)
    for i in range(5):
        p.intake.send(b"%d" % i)
    assert queued(p) == left
    assert p.counters.dropped == 2
    assert p.intake.sent == 5


def test_raise_on_a_full_backlog_refuses_the_record_and_gives_its_seq_back(
    make_parts: Callable[..., Parts],
) -> None:
    """``raise``: the record is refused with BufferFullError (not its SpoolFullError:
    memory is full, not the spool); nothing is dropped or moved; its seq serves the next
    record."""
    p = make_parts(when_full="raise", buffer_max_records=3)
    for i in range(3):
        p.intake.send(b"%d" % i)
    with pytest.raises(BufferFullError, match="memory buffer full") as info:
        p.intake.send(b"3")
    assert not isinstance(info.value, SpoolFullError)
    assert queued(p) == [0, 1, 2]
    assert p.counters.dropped == 0
    assert p.intake.seq_next == 3


def test_block_on_a_full_backlog_gives_up_after_max_block_s(
    make_parts: Callable[..., Parts],
) -> None:
    """``block``: the sender wakes the pump and waits; no room within max_block_s raises
    BufferFullError, and nothing is dropped or moved."""
    p = make_parts(when_full="block", buffer_max_records=3, max_block_s=0.02)
    for i in range(3):
        p.intake.send(b"%d" % i)
    p.requests.wake.clear()
    with pytest.raises(BufferFullError, match=r"waited max_block_s=0\.02"):
        p.intake.send(b"3")
    assert p.requests.wake.is_set()
    assert queued(p) == [0, 1, 2]
    assert not p.intake.waiters
    assert p.counters.dropped == 0


def test_block_on_a_full_backlog_goes_on_when_the_pump_makes_room(
    make_parts: Callable[..., Parts],
) -> None:
    """``block``: a sender waiting for room is let in as soon as the pump takes the head
    (it wakes the pump, whose put_back notifies), behind the others."""
    p = make_parts(when_full="block", buffer_max_records=3, max_block_s=30.0)
    for i in range(3):
        p.intake.send(b"%d" % i)
    p.requests.wake.clear()
    taken: list[int] = []

    def pump() -> None:
        assert p.requests.wake.wait(30)
        taken.extend(r[5] for r in p.intake.take(1))
        p.intake.put_back([])

    t = threading.Thread(target=pump, name="pump-stand-in")
    t.start()
    p.intake.send(b"3")
    t.join(30)
    assert taken == [0]
    assert queued(p) == [1, 2, 3]
    assert not p.intake.waiters
    assert p.counters.dropped == 0


def test_a_record_too_large_is_refused_counted_and_takes_no_seq(
    make_parts: Callable[..., Parts],
) -> None:
    """Over message_max_bytes: RecordTooLargeError before a seq is taken; counted as
    rejected (``record_too_large``)."""
    p = make_parts(message_max_bytes=10)
    with pytest.raises(RecordTooLargeError):
        p.intake.send(b"x" * 11)
    assert p.intake.seq_next == 0
    assert p.counters.rejected == 1
    assert p.counters.errors["record_too_large"] == 1


# -- direct sends -----------------------------------------------------------------------


def test_the_hot_path_hands_librdkafka_what_inflight_produce_does(
    make_parts: Callable[..., Parts],
) -> None:
    """send()'s direct path inlines ``InFlight.produce``: for the same record both make the
    same call (topic, value, key, headers as ``kafka_headers`` builds them: the user's,
    then the producer id, then the seq), each under a ticket of the in-flight table."""
    p = make_parts()
    client = direct(p)
    user = [("trace", b"abc")]
    p.intake.send(b"value", b"key", headers=user, timestamp=5)
    assert p.flight.produce(("parts", b"key", b"value", user, 5, 0))
    hot, pumped = client.calls
    want = kafka_headers(p.flight.pid_header, b"0", user)
    assert want[-1] == (HEADER_SEQ, b"0")
    assert (hot.topic, hot.value, hot.key, hot.headers) == ("parts", b"value", b"key", want)
    assert (pumped.topic, pumped.value, pumped.key, pumped.headers) == (
        hot.topic, hot.value, hot.key, hot.headers,
    )  # fmt: skip
    assert p.flight.outstanding() == 2
    assert p.intake.sent == 1
    assert queued(p) == []


def test_a_full_client_turns_direct_sends_off_and_queues_in_order(
    make_parts: Callable[..., Parts],
) -> None:
    """librdkafka's queue full (BufferError): the record goes to the backlog, direct sends
    go off, and every later record queues behind it (the pump feeds them in order)."""
    p = make_parts()
    client = direct(p)
    client.refuse = lambda value: BufferError("full") if value == b"1" else None
    for i in range(3):
        p.intake.send(b"%d" % i)
    assert [c.value for c in client.calls] == [b"0"]
    assert queued(p) == [1, 2]
    assert not p.intake.direct
    assert p.flight.outstanding() == 1
    assert p.intake.sent == 3


@pytest.mark.parametrize(
    ("refusal", "error"),
    [
        (ValueError("bad field"), SerializationError),
        (KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)), RecordTooLargeError),
    ],
)
def test_a_record_librdkafka_refuses_is_refused_and_its_seq_serves_the_next(
    make_parts: Callable[..., Parts], refusal: Exception, error: type[Exception]
) -> None:
    """librdkafka refuses the record itself: send() raises a typed error, counts it as
    rejected, frees its ticket, and gives its seq back; direct sends stay on."""
    p = make_parts()
    client = direct(p)
    client.refuse = lambda value: refusal if value == b"bad" else None
    with pytest.raises(error):
        p.intake.send(b"bad")
    p.intake.send(b"good")
    assert [(c.value, c.headers[-1]) for c in client.calls] == [(b"good", (HEADER_SEQ, b"0"))]
    assert p.counters.rejected == 1
    assert p.counters.errors["record_rejected"] == 1
    assert p.flight.tickets() == (1, 0)
    assert p.intake.direct


# -- the pump's side --------------------------------------------------------------------


def test_what_the_pump_takes_is_held_until_put_back(make_parts: Callable[..., Parts]) -> None:
    """Records taken from the head count as held until put back; the rest goes back to the
    head in order, ahead of what senders appended meanwhile."""
    p = make_parts()
    for i in range(5):
        p.intake.send(b"%d" % i)
    taken = p.intake.take(3)
    assert [r[5] for r in taken] == [0, 1, 2]
    p.intake.send(b"5")
    with p.intake.lock:
        assert p.intake.held() == 6
    assert p.intake.put_back(taken[1:])
    assert queued(p) == [1, 2, 3, 4, 5]
    with p.intake.lock:
        assert p.intake.held() == 5


def test_direct_sends_go_on_only_with_an_empty_backlog_and_no_sender_waiting(
    make_parts: Callable[..., Parts],
) -> None:
    """``open_direct`` changes nothing while the backlog holds records; on an empty one it
    runs its step under the lock and turns direct sends on, unless a sender waits for its
    turn (then a later step does)."""
    p = make_parts()
    p.intake.send(b"0")
    ran: list[bool] = []
    assert not p.intake.open_direct(then=lambda: ran.append(True))
    assert ran == []
    assert not p.intake.direct
    p.intake.put_back([*p.intake.take(1)[1:]])
    assert p.intake.open_direct(then=lambda: ran.append(True))
    assert ran == [True]
    assert p.intake.direct
    p.intake.close_direct()
    assert not p.intake.direct
