"""``InFlight``'s ticket table alone: a stand-in client whose produce() records each
record's ticket (its delivery callback), which the test then calls with stand-in
messages, as librdkafka's poll would. Failed records go to a real Custody."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from logsdk.producer._inflight import Handback, InFlight
from logsdk.producer._records import HEADER_SEQ, Rec
from tests.unit.producer_parts import Parts, StandInClient, msg, parts_factory, rec


@pytest.fixture
def make_parts(tmp_path: Path) -> Iterator[Callable[..., Parts]]:
    with parts_factory(tmp_path) as make:
        yield make


def in_use(flight: InFlight) -> int:
    """Tickets holding a record."""
    return sum(r is not None for r in flight.slots)


def with_client(p: Parts) -> Any:
    client: Any = StandInClient()
    p.flight.install(client)
    return client


def test_tickets_are_reused_after_their_report(make_parts: Callable[..., Parts]) -> None:
    """Each record is produced under a ticket that holds it; an acknowledgement counts
    ``acked`` and frees the ticket, which the next records take: the table does not grow.
    ``outstanding()`` is the tickets in use at every step."""
    p = make_parts()
    flight, client = p.flight, with_client(p)
    for s in range(5):
        assert flight.produce(rec(s))
        assert flight.outstanding() == in_use(flight) == s + 1
    tickets = [c.callback for c in client.calls]
    assert sorted(map(int, tickets)) == [0, 1, 2, 3, 4]
    assert client.calls[2].headers == [p.flight.pid_header, (HEADER_SEQ, b"2")]
    tickets[1](None, msg(offset=11))
    tickets[3](None, msg(offset=13))
    assert flight.acked == 2
    assert flight.outstanding() == in_use(flight) == 3
    assert flight.produce(rec(5))
    assert flight.produce(rec(6))
    assert {int(c.callback) for c in client.calls[5:]} == {1, 3}
    assert len(flight.slots) == 5
    assert flight.outstanding() == in_use(flight) == 5
    for i in (0, 2, 4, 5, 6):  # the reports still owed (1 and 3 came)
        client.calls[i].callback(None, msg(offset=20 + i))
    assert flight.acked == 7
    assert flight.outstanding() == in_use(flight) == 0
    assert len(flight.free) == len(flight.slots) == 5


@pytest.mark.parametrize(
    ("refusal", "raises", "degrades"),
    [
        (BufferError("queue full"), None, False),
        (ValueError("bad field"), ValueError, False),
        (KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)), KafkaException, False),
        (KafkaException(KafkaError(KafkaError._FATAL)), None, True),
    ],
    ids=["queue-full", "bad-field", "too-large", "client-broken"],
)
def test_a_record_the_client_refuses_gives_its_ticket_back(
    make_parts: Callable[..., Parts],
    refusal: BaseException,
    raises: type[BaseException] | None,
    degrades: bool,
) -> None:
    """produce() refused: the ticket is free at once (librdkafka holds nothing of the
    record, no report will come) and the next record reuses it. A full queue returns
    False; a record refused for itself raises; a broken client returns False and asks
    for a degrade."""
    p = make_parts()
    flight, client = p.flight, with_client(p)
    client.refuse = lambda value: refusal
    if raises is None:
        assert not flight.produce(rec(1))
    else:
        with pytest.raises(raises):
            flight.produce(rec(1))
    assert flight.outstanding() == in_use(flight) == 0
    assert (p.requests.take_degrade() is not None) is degrades
    assert p.counters.errors["produce_error"] == int(degrades)
    client.refuse = lambda value: None
    assert flight.produce(rec(2))
    assert len(flight.slots) == 1
    assert flight.outstanding() == 1


def test_a_failed_report_hands_the_record_to_custody_before_its_ticket_is_freed(
    make_parts: Callable[..., Parts],
) -> None:
    """A record handed back (timed out) reaches custody while its ticket is still taken:
    the handback sees it counted in ``outstanding()``, so the record is never in neither
    place; then the ticket is free, a degrade is asked for, nothing is counted acked."""
    p = make_parts()
    seen: list[tuple[int, int]] = []

    def failed(r: Rec, may_arrive: bool) -> None:
        seen.append((flight.outstanding(), len(p.custody.failed)))
        p.custody.take_back(r, may_arrive)

    flight = InFlight(
        p.config,
        p.clients,
        p.flight.pid_header,
        p.counters,
        Handback(failed, p.rejects.reject, p.requests.degrade),
        None,
        p.stop,
    )
    client: Any = StandInClient()
    flight.install(client)
    assert flight.produce(rec(7))
    client.calls[0].callback(KafkaError(KafkaError._MSG_TIMED_OUT), msg(offset=None))
    assert seen == [(1, 0)]
    assert flight.outstanding() == 0
    assert p.custody.failed == [rec(7)]
    assert flight.acked == 0
    assert flight.possible_dups == 1  # a timed-out record may be in Kafka
    assert p.counters.errors["_MSG_TIMED_OUT"] == 1
    reason = p.requests.take_degrade()
    assert reason is not None
    assert reason.startswith("delivery failed")
    flight.forget()


def test_a_record_kafka_refuses_goes_to_the_rejected_records(
    make_parts: Callable[..., Parts],
) -> None:
    """A report saying the record itself is bad (too large) sets it aside for the rejected
    table and counts it; no degrade, not acked, the ticket free; the next settle writes it
    there."""
    p = make_parts()
    flight, client = p.flight, with_client(p)
    assert flight.produce(rec(3))
    client.calls[0].callback(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), msg(offset=None))
    assert p.rejects.pending() == 1
    assert p.counters.rejected == 1
    assert p.counters.errors["rejected"] == 1
    assert p.requests.take_degrade() is None
    assert flight.acked == 0
    assert flight.outstanding() == 0
    assert p.rejects.set_aside_records()
    assert p.rejects.pending() == 0
    assert p.spool.rejected_count() == 1


def test_the_unconfirmed_chain_is_detected_and_cleared_by_polled(
    make_parts: Callable[..., Parts],
) -> None:
    """A report without an offset starts a chain: the next reports of the same partition
    with offsets 0, 1, 2... are unconfirmed too; another partition is not; an offset that
    breaks the sequence ends it, and so does the end of the poll (``polled()``)."""
    flight = make_parts().flight
    assert not flight.is_unconfirmed(msg(offset=0, partition=0))
    assert flight.is_unconfirmed(msg(offset=None, partition=0))
    assert flight.is_unconfirmed(msg(offset=0, partition=0))
    assert flight.is_unconfirmed(msg(offset=1, partition=0))
    assert not flight.is_unconfirmed(msg(offset=1, partition=1))
    assert not flight.is_unconfirmed(msg(offset=0, partition=0, topic="other"))
    assert flight.is_unconfirmed(msg(offset=2, partition=0))
    assert not flight.is_unconfirmed(msg(offset=40, partition=0))  # breaks it: ended
    assert not flight.is_unconfirmed(msg(offset=3, partition=0))
    assert flight.is_unconfirmed(msg(offset=None, partition=0))
    assert flight.is_unconfirmed(msg(offset=0, partition=0))
    flight.polled()
    assert not flight.is_unconfirmed(msg(offset=1, partition=0))


def test_unconfirmed_reports_resend_their_records_and_plain_acks_count(
    make_parts: Callable[..., Parts],
) -> None:
    """Served through the tickets: the chain's records go to custody to be resent
    (counted unconfirmed and as possible duplicates, a degrade asked for); a report of
    another partition, and the one that breaks the chain, are acknowledged. After the
    poll, offset 0 of that partition is a plain acknowledgement again."""
    p = make_parts()
    flight, client = p.flight, with_client(p)
    for s in range(6):
        assert flight.produce(rec(s))
    cb = [c.callback for c in client.calls]
    cb[0](None, msg(offset=None, partition=0))
    cb[1](None, msg(offset=0, partition=0))
    cb[2](None, msg(offset=5, partition=1))
    cb[3](None, msg(offset=1, partition=0))
    cb[4](None, msg(offset=9, partition=0))
    assert [r[5] for r in p.custody.failed] == [0, 1, 3]
    assert flight.unconfirmed == 3
    assert flight.possible_dups == 3
    assert flight.acked == 2
    assert p.requests.take_degrade() is not None
    assert flight.outstanding() == 1
    flight.polled()
    cb[5](None, msg(offset=0, partition=0))
    assert flight.acked == 3
    assert flight.outstanding() == in_use(flight) == 0
