"""Count what a reader got: duplicates, gaps and order, by the logsdk headers.

This is the dedupe recipe too: a record is identified by its headers
(``logsdk.producer``, ``logsdk.seq``); keep the first occurrence, drop the rest.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Message

H_PRODUCER = "logsdk.producer"
H_SEQ = "logsdk.seq"


@dataclass
class DeliveryReport:
    """What a reader found in a topic."""

    total: int = 0
    unique: int = 0
    duplicates: int = 0
    without_headers: int = 0
    order_violations: int = 0
    #: ``(producer id, seq)`` of each record that came after a later one of its producer
    #: in its partition.
    order_violators: list[tuple[str, int]] = field(default_factory=list)
    seqs: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))

    def split_order_violators(
        self, unconfirmed: Mapping[str, Container[int]]
    ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """The records out of order, in two lists: those whose own delivery report was
        unconfirmed (``unconfirmed``: seqs per producer id), resent after a broker's
        "duplicate sequence" reply for a batch it did not store, so they land after records
        sent later (the one exception docs/guarantees.md names); and the others, which
        break the order."""
        late: list[tuple[str, int]] = []
        other: list[tuple[str, int]] = []
        for ident in self.order_violators:
            (late if ident[1] in unconfirmed.get(ident[0], ()) else other).append(ident)
        return late, other

    def missing(self, producer_id: str, expected: Iterable[int]) -> list[int]:
        """Sequence numbers in ``expected`` that no record of ``producer_id`` carried."""
        got = self.seqs.get(producer_id, set())
        return [s for s in expected if s not in got]


def identity(msg: Message) -> tuple[str, int] | None:
    """``(producer id, seq)`` of a record sent by a LogProducer, else None."""
    producer = seq = None
    raw = msg.headers() or []
    for name, val in raw.items() if isinstance(raw, dict) else raw:
        if name == H_PRODUCER and val is not None:
            producer = val.decode() if isinstance(val, bytes) else str(val)
        elif name == H_SEQ and val is not None:
            seq = int(val)
    if producer is None or seq is None:
        return None
    return producer, seq


def check_delivery(messages: Iterable[Message]) -> DeliveryReport:
    """Dedupe by (producer, seq) and check per-partition order of first occurrences.

    ``messages`` must come in offset order within each partition (as a reader
    returns them). Order holds when, within a partition, the first occurrences
    of one producer's records have increasing sequence numbers.
    """
    rep = DeliveryReport()
    last: dict[tuple[str, int, str], int] = {}
    for msg in messages:
        rep.total += 1
        ident = identity(msg)
        if ident is None:
            rep.without_headers += 1
            continue
        producer, seq = ident
        seen = rep.seqs[producer]
        if seq in seen:
            rep.duplicates += 1
            continue
        seen.add(seq)
        rep.unique += 1
        key = (msg.topic() or "", msg.partition() or 0, producer)
        if seq < last.get(key, -1):
            rep.order_violations += 1
            rep.order_violators.append((producer, seq))
        last[key] = max(seq, last.get(key, -1))
    return rep
