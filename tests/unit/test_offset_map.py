"""The offset map: commit the oldest unfinished offset, never a run inferred from acks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logsdk.consumer import Record
from logsdk.consumer._offsets import Chunk, OffsetMap, RangeSet, encode_completed, ranges_for
from logsdk.consumer._records import RecordBatch, RecordColumns, columns_of

TP = ("t", 0)


def chunk(om: OffsetMap, offsets: list[int]) -> Chunk:
    records = [Record("t", 0, o, None, b"v") for o in offsets]
    epoch, kept = om.admit(TP, records)
    assert epoch is not None
    c = Chunk(TP, epoch, kept, 1)
    assert om.register(c)
    return c


def test_commit_point_is_oldest_unfinished() -> None:
    """Out-of-order completion: commit stays at the oldest unfinished chunk, done ranges beyond."""
    om = OffsetMap()
    om.assign(TP, start=0)
    a, b, c = chunk(om, [0, 1, 2]), chunk(om, [5, 6]), chunk(om, [7, 9])  # 3-4, 8: holes
    om.complete(b, 2)
    om.complete(c, 2)
    point = om.commit_points()[TP]
    assert point.offset == 0
    assert point.ranges == [(5, 10)]
    om.complete(a, 3)
    point = om.commit_points()[TP]
    assert point.offset == 10
    assert point.ranges == []


def test_holes_do_not_move_the_commit_point() -> None:
    """A gap in delivered offsets (markers, compaction) is not 'completed' by neighbours."""
    om = OffsetMap()
    om.assign(TP, start=0)
    a = chunk(om, [0, 1])
    b = chunk(om, [10, 11])
    om.complete(b, 2)
    assert om.point(TP) is not None
    assert om.point(TP).offset == 0
    om.complete(a, 2)
    assert om.point(TP).offset == 12  # type: ignore[union-attr]


def test_stale_epoch_completions_are_discarded() -> None:
    """Work handed out before a revoke/reassign never moves the new owner's commit point."""
    om = OffsetMap()
    om.assign(TP, start=0)
    old = chunk(om, [0, 1, 2])
    om.revoke(TP)
    om.assign(TP, start=0)
    assert not om.complete(old, 3)
    assert om.discarded == 3
    assert om.commit_points(force=True)[TP].offset == 0


def test_partial_completion_in_key_mode() -> None:
    """A chunk split across key lanes completes only when all its records did."""
    om = OffsetMap()
    om.assign(TP, start=0)
    c = chunk(om, [0, 1, 2, 3])
    om.complete(c, 3)
    assert om.point(TP).offset == 0  # type: ignore[union-attr]
    om.complete(c, 1)
    assert om.point(TP).offset == 4  # type: ignore[union-attr]


def test_skip_ranges_from_metadata_are_skipped_and_carried() -> None:
    """Offsets a previous owner completed are skipped, and kept in metadata until passed."""
    text, _ = encode_completed(0, [(3, 5), (8, 9)])
    om = OffsetMap()
    om.assign(TP, start=0, skip=ranges_for(0, text))
    c = chunk(om, [0, 1, 2, 3, 4, 5])
    assert [r.offset for r in c.records] == [0, 1, 2, 5]
    assert om.point(TP).ranges == [(3, 5), (8, 9)]  # type: ignore[union-attr]
    om.complete(c, 4)
    point = om.point(TP)
    assert point is not None
    assert point.offset == 6
    assert point.ranges == [(8, 9)]


def test_invalidate_blocks_until_rewind() -> None:
    """After an exactly-once failure nothing is admitted or committed until the rewind."""
    om = OffsetMap()
    epoch = om.assign(TP, start=0)
    c = chunk(om, [0, 1])
    assert om.invalidate(TP, epoch)
    assert not om.invalidate(TP, epoch)
    assert om.admit(TP, [Record("t", 0, 2, None, None)]) == (None, [])
    assert om.commit_points(force=True) == {}
    assert not om.complete(c, 2)
    om.rewind(TP, 0)
    assert om.commit_points(force=True)[TP].offset == 0


def test_stale_records_before_a_seek_are_dropped() -> None:
    """Records below the fetch position (from before a seek) are not admitted."""
    om = OffsetMap()
    om.assign(TP, start=5)
    _, kept = om.admit(TP, [Record("t", 0, o, None, None) for o in (3, 4, 5, 6)])
    assert [r.offset for r in kept] == [5, 6]


def test_admit_run_reads_offsets_only_when_some_may_be_dropped() -> None:
    """A run is admitted by first/last offset; offsets() is asked for only near a seek or skip."""
    om = OffsetMap()
    om.assign(TP, start=10, skip=[(20, 22)])
    calls: list[int] = []

    def offsets(offs: list[int]) -> Callable[[], list[int]]:
        def get() -> list[int]:
            calls.append(len(offs))
            return offs

        return get

    epoch = om.epoch(TP)
    assert om.admit_run(TP, 10, 14, offsets([10, 11, 12, 14])) == (epoch, None)
    assert calls == []
    # Overlaps the skip range [20, 22): only 19 and 22 are kept.
    assert om.admit_run(TP, 19, 22, offsets([19, 20, 21, 22])) == (epoch, [0, 3])
    # Below the fetch position (records from before a seek): dropped.
    assert om.admit_run(TP, 21, 22, offsets([21, 22])) == (epoch, [])
    assert om.admit_run(TP, 22, 25, offsets([22, 23, 25])) == (epoch, [1, 2])
    assert calls == [4, 2, 3]
    assert om.positions()[TP][0] == 26


def test_range_set_overlaps() -> None:
    s = RangeSet([(5, 8), (10, 12)])
    assert not s.overlaps(0, 5)
    assert s.overlaps(0, 6)
    assert s.overlaps(7, 9)
    assert not s.overlaps(8, 10)
    assert s.overlaps(11, 100)
    assert not s.overlaps(12, 100)


def test_record_batch_converts_once_and_only_when_read() -> None:
    """len() needs no conversion; the first read converts every item once."""
    converted: list[int] = []

    def convert(items: list[Any]) -> RecordColumns:
        converted.append(len(items))
        return columns_of([Record("t", 0, o, None, b"v") for o in items])

    batch = RecordBatch([3, 4, 5], convert)
    assert len(batch) == 3
    assert converted == []
    assert batch[0].offset == 3
    assert [r.offset for r in batch[1:]] == [4, 5]
    assert [r.offset for r in batch] == [3, 4, 5]
    assert batch == [Record("t", 0, o, None, b"v") for o in (3, 4, 5)]
    assert converted == [3]
    plain = RecordBatch([Record("t", 0, 1, None, None)])
    assert plain[0].offset == 1


def test_a_failed_commit_is_retried_at_the_next_interval() -> None:
    """commit_points() takes the moved partitions; after a failed commit mark_dirty()
    gives them back, so the next (unforced) round commits them again."""
    om = OffsetMap()
    other = ("t", 1)
    om.assign(TP, start=0)
    om.assign(other, start=0)
    om.complete(chunk(om, [0, 1]), 2)
    first = om.commit_points()
    assert first[TP].offset == 2
    assert om.commit_points() == {}  # nothing moved since
    om.mark_dirty(first)  # the commit failed
    assert om.commit_points()[TP].offset == 2


def test_commit_points_of_some_partitions_leave_the_others_pending() -> None:
    """A commit restricted to some partitions (a revoke) leaves the others to the next."""
    om = OffsetMap()
    other = ("t", 1)
    om.assign(TP, start=0)
    om.assign(other, start=0)
    om.complete(chunk(om, [0, 1]), 2)
    records = [Record("t", 1, o, None, b"v") for o in (0, 1, 2)]
    epoch, kept = om.admit(other, records)
    assert epoch is not None
    c = Chunk(other, epoch, kept, 1)
    assert om.register(c)
    om.complete(c, 3)
    assert set(om.commit_points(only={other})) == {other}
    assert om.commit_points()[TP].offset == 2
