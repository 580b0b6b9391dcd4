"""The test proxy's fault modes without sockets: each armed, then given frames as the
proxy's event loop gives them, counting down what it was armed with."""

from __future__ import annotations

import struct

import pytest

from logsdk.testing._batches import batches
from logsdk.testing._faults import EarliestMisreports, MetadataFaults, ProduceDrops, ProduceHolds
from logsdk.testing._wire import Decoder, parse_produce
from tests.unit.test_proxy_codec import (
    LIST_OFFSETS_EARLIEST_V7,
    LIST_OFFSETS_LATEST_V7,
    LIST_OFFSETS_V7_RESPONSE,
    METADATA_V12_RESPONSE,
    PRODUCE_V10,
    produce_v3,
    record_batch,
)


def test_metadata_faults_change_the_armed_count_of_responses() -> None:
    """Armed for two, the error goes on the first two answers that list a wanted topic;
    an answer without one uses none; the third passes unchanged."""
    faults = MetadataFaults()
    assert faults.apply(METADATA_V12_RESPONSE, 12) == METADATA_V12_RESPONSE  # not armed
    faults.arm(1, 3, topics=["other"])
    assert faults.apply(METADATA_V12_RESPONSE, 12) == METADATA_V12_RESPONSE
    faults.arm(2, 3, topics=["cap"])
    for _ in range(2):
        assert struct.unpack_from(">h", faults.apply(METADATA_V12_RESPONSE, 12), 49) == (3,)
    assert faults.apply(METADATA_V12_RESPONSE, 12) == METADATA_V12_RESPONSE
    assert faults.done == 2


def test_metadata_faults_pass_what_they_cannot_read_and_refuse_bad_arguments() -> None:
    """A response it cannot read (cut short) passes unchanged and uses no count; a
    negative count or an error code outside int16 is refused."""
    faults = MetadataFaults()
    faults.arm(1, 5, topics=None)
    assert faults.apply(METADATA_V12_RESPONSE[:60], 12) == METADATA_V12_RESPONSE[:60]
    assert faults.done == 0
    with pytest.raises(ValueError, match="count"):
        faults.arm(-1, 5, None)
    with pytest.raises(ValueError, match="error_code"):
        faults.arm(1, 40_000, None)


def test_earliest_misreports_answer_the_armed_offset_for_the_asked_partitions() -> None:
    """While armed, an EARLIEST request of a wanted topic is noted and its answer says the
    armed offset; a LATEST request is not noted; once used up, nothing more is."""
    early = EarliestMisreports()
    assert early.asked(LIST_OFFSETS_EARLIEST_V7) is None  # not armed
    early.arm(7, count=1, topics=["other"])
    assert early.asked(LIST_OFFSETS_EARLIEST_V7) is None
    early.arm(7, count=1, topics=["cap"])
    assert early.asked(LIST_OFFSETS_LATEST_V7) is None
    asked = early.asked(LIST_OFFSETS_EARLIEST_V7)
    assert asked == (7, frozenset({("cap", 0)}))
    out = early.apply(LIST_OFFSETS_V7_RESPONSE, *asked)
    assert Decoder(out, 29).int64() == 7
    assert early.apply(LIST_OFFSETS_V7_RESPONSE, *asked) == LIST_OFFSETS_V7_RESPONSE
    assert early.done == 1
    with pytest.raises(ValueError, match="offset"):
        early.arm(-1, 1, None)


def test_drops_take_the_armed_requests_and_renumber_the_next_ones() -> None:
    """Two drops armed: two requests taken as lost (every version seen noted), the third
    passed with its batch moved down by the records lost before it."""
    drops = ProduceDrops()
    lost = [produce_v3([("t", [(0, record_batch(5, 0, seq, 2))])]) for seq in (0, 2)]
    nxt = produce_v3([("t", [(0, record_batch(5, 0, 4, 2))])])
    drops.arm(2)
    assert drops.armed == 2
    for frame in lost:
        req = parse_produce(frame)
        assert req is not None
        assert drops.take(frame, req)
    req = parse_produce(nxt)
    assert req is not None
    assert not drops.take(nxt, req)
    (b,) = batches(drops.renumber(nxt, req), *req.topics[0][1][0][1])
    assert b.base_seq == 0
    assert (drops.armed, drops.done, drops.versions) == (0, 2, frozenset({3}))


def test_drops_unarmed_pass_frames_as_they_are() -> None:
    """Nothing armed, nothing lost: the request is not taken and not rewritten."""
    drops = ProduceDrops()
    req = parse_produce(PRODUCE_V10)
    assert req is not None
    assert not drops.take(PRODUCE_V10, req)
    assert drops.renumber(PRODUCE_V10, req) is PRODUCE_V10
    assert drops.versions == frozenset({10})


def test_holds_begin_once_and_count_the_records_held() -> None:
    """Armed, the first request begins a hold (counted once); the next on a connection
    already held add their records; one on a connection not held passes; disarmed, no
    hold begins."""
    holds = ProduceHolds()
    req = parse_produce(PRODUCE_V10)
    assert req is not None
    assert not holds.take(PRODUCE_V10, req, held=False)  # not armed
    holds.arm()
    assert holds.take(PRODUCE_V10, req, held=False)
    assert holds.take(PRODUCE_V10, req, held=True)
    assert not holds.take(PRODUCE_V10, req, held=False)
    assert (holds.done, holds.records) == (1, 6)
    holds.arm()
    assert holds.records == 0
    holds.disarm()
    assert not holds.take(PRODUCE_V10, req, held=False)
    assert holds.done == 1
