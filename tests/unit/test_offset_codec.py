"""The commit-metadata codec: completed offsets beyond the commit point, within 4096 bytes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsdk.consumer import decode_completed, encode_completed
from logsdk.consumer._offsets import RangeSet, ranges_for


@st.composite
def base_and_ranges(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    base = draw(st.integers(0, 2**48))
    gaps = draw(st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 10_000)), max_size=300))
    ranges, prev = [], base
    for gap, length in gaps:
        start = prev + gap
        ranges.append((start, start + length))
        prev = start + length
    return base, ranges


@settings(max_examples=300, deadline=None)
@given(base_and_ranges())
def test_round_trip_and_size_bound(case: tuple[int, list[tuple[int, int]]]) -> None:
    """Any range list decodes to the prefix that was kept, and the text is <= 4096 bytes."""
    base, ranges = case
    text, kept = encode_completed(base, ranges)
    assert len(text.encode("utf-8")) <= 4096
    got_base, got = decode_completed(text)
    assert got_base == base
    assert got == ranges[:kept]


def test_truncation_keeps_the_lowest_ranges() -> None:
    """Too many ranges for the bound: the lowest are kept (a restart reaches them first)."""
    rnd = random.Random(7)
    base, ranges, prev = 1_000_000, [], 1_000_000
    for _ in range(20_000):
        start = prev + rnd.randint(1, 5000)
        prev = start + rnd.randint(1, 5000)
        ranges.append((start, prev))
    text, kept = encode_completed(base, ranges)
    assert 0 < kept < len(ranges)
    assert len(text) <= 4096
    assert decode_completed(text)[1] == ranges[:kept]
    # Maximal: one more range would not fit.
    assert len(encode_completed(base, ranges[: kept + 1], max_bytes=10**9)[0]) > 4096


def test_smaller_bound_is_honoured() -> None:
    """max_bytes is a hard limit, whatever it is."""
    ranges = [(10 + 3 * i, 11 + 3 * i) for i in range(5000)]
    for bound in (64, 300, 1000):
        text, kept = encode_completed(5, ranges, max_bytes=bound)
        assert len(text) <= bound
        assert decode_completed(text)[1] == ranges[:kept]


@pytest.mark.parametrize(
    "text",
    ["", "hello", "lsdk1:", "lsdk1:!!!!", "lsdk1:AAAA", "lsdk1:Af____8P", "other:lsdk1:AA"],
)
def test_foreign_or_corrupt_metadata_is_ignored(text: str) -> None:
    """Metadata we did not write (or that is corrupt) means nothing is skipped."""
    assert ranges_for(5, text) == []
    assert ranges_for(5, None) == []


def test_metadata_for_another_commit_point_is_ignored() -> None:
    """Ranges written for offset 100 are not trusted when the committed offset is 90."""
    text, _ = encode_completed(100, [(105, 110)])
    assert ranges_for(100, text) == [(105, 110)]
    assert ranges_for(90, text) == []


def test_bad_ranges_are_rejected() -> None:
    """Unsorted or empty ranges are a programming error, not silently encoded."""
    with pytest.raises(ValueError, match="sorted"):
        encode_completed(10, [(20, 25), (15, 18)])
    with pytest.raises(ValueError, match="sorted"):
        encode_completed(10, [(5, 8)])


def test_range_set() -> None:
    """RangeSet answers membership, clips to a floor and prunes what is behind it."""
    rs = RangeSet([(10, 12), (11, 15), (20, 21)])
    assert [o for o in range(25) if o in rs] == [10, 11, 12, 13, 14, 20]
    assert rs.above(13) == [(13, 15), (20, 21)]
    rs.prune(15)
    assert rs.above(0) == [(20, 21)]
