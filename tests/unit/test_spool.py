"""The SQLite spool: codec, FIFO, accounting, lock, corruption, persisted identity."""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsdk.errors import ConfigError, SpoolCorruptError, SpoolError, SpoolLockedError
from logsdk.spool import Spool, decode_headers, encode_headers
from logsdk.spool._codec import row_size
from logsdk.spool._rows import id_runs
from logsdk.spool._state import read_state

#: Pure functions: Hypothesis's per-example deadline (200 ms) only fails them when the
#: machine is loaded (seen: id_runs over 200 ids at a load average of 38).
PURE = settings(deadline=None)
headers_st = st.lists(
    st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=50))), max_size=6
)


@PURE
@given(headers_st)
def test_header_codec_round_trips(headers: list[tuple[str, bytes | None]]) -> None:
    """Any list of (str, bytes|None) headers survives encode/decode unchanged."""
    assert decode_headers(encode_headers(headers)) == headers


@PURE
@given(st.sets(st.integers(min_value=1, max_value=200)))
def test_id_runs_cover_exactly_the_ids(ids: set[int]) -> None:
    """Runs of consecutive ids, sorted, disjoint, not adjacent, covering exactly the ids."""
    runs = id_runs(list(ids) + list(ids))  # duplicates collapse
    assert {i for lo, hi in runs for i in range(lo, hi + 1)} == ids
    assert all(lo <= hi for lo, hi in runs)
    assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(runs))


@pytest.mark.parametrize("n", [0, 1, 9, 10, 1234, 5000])
def test_append_any_batch_size_round_trips_with_sizes(tmp_path: Path, n: int) -> None:
    """Rows of every shape come back unchanged, in order, with the size row_size gives."""
    blobs = [None, b"", b"k", b"v" * 300]
    hdr = encode_headers([("a", b"xx"), ("b", None)])
    rows = [
        ("t", blobs[i % 4], blobs[(i // 4) % 4], hdr if i % 3 else None, i % 2 or None, i)
        for i in range(n)
    ]
    sp = Spool(tmp_path).open()
    try:
        sp.append(rows)
        got = sp.read_after(0, n + 1)
        assert [tuple(g[1:7]) for g in got] == rows
        assert [g[7] for g in got] == [row_size(r) for r in rows]
        assert sp.count == n
        assert sp.bytes == sum(row_size(r) for r in rows)
        # Deleting a few runs (and an id already gone) keeps the accounting exact.
        ids = [g[0] for g in got]
        gone = ids[1::3] + ids[:1]
        sp.delete(gone)
        sp.delete(ids[:1])
        left = [r for r, i in zip(rows, ids, strict=True) if i not in set(gone)]
        assert sp.count == len(left)
        assert sp.bytes == sum(row_size(r) for r in left)
    finally:
        sp.close()


@pytest.mark.parametrize("kind", ["bytes", "none", "empty", "memoryview"])
def test_columns_of_one_kind_round_trip(tmp_path: Path, kind: str) -> None:
    """A column that is all bytes, all None, all empty or all memoryview (the ring's
    recovered rows) takes its own path to SQLite's parameters: each comes back as it went
    in (b"" stays b"", None stays None), with the right sizes."""
    hdr = encode_headers([("h", b"1")])
    blob: dict[str, object] = {
        "bytes": b"v" * 200,
        "none": None,
        "empty": b"",
        "memoryview": memoryview(b"m" * 50),
    }
    v = blob[kind]
    rows = [("t", v, v, v if kind != "bytes" else hdr, 7, i) for i in range(1111)]
    sp = Spool(tmp_path).open()
    try:
        sp.append(rows)
        got = sp.read_after(0, 2000)
        plain = None if v is None else bytes(v)
        want_h = hdr if kind == "bytes" else plain
        assert [g[2:5] for g in got] == [(plain, plain, want_h)] * len(rows)
        assert sp.bytes == sum(g[7] for g in got) == sum(map(row_size, rows))
    finally:
        sp.close()


def _rows(n: int, start: int = 0) -> list[tuple[str, bytes, bytes, None, int, int]]:
    return [("t", b"k", b"v" * 10, None, 1000 + i, i) for i in range(start, start + n)]


def test_fifo_and_accounting(tmp_path: Path) -> None:
    """Rows come back oldest first; count and bytes follow appends and deletes."""
    sp = Spool(tmp_path).open()
    try:
        rows = _rows(10)
        sp.append(rows)
        assert sp.count == 10
        assert sp.bytes == sum(row_size(r) for r in rows)
        got = sp.read_after(0, 4)
        assert [r[6] for r in got] == [0, 1, 2, 3]
        sp.delete([r[0] for r in got])
        assert sp.count == 6
        assert [r[6] for r in sp.read_after(0, 100)] == [4, 5, 6, 7, 8, 9]
        assert sp.drop_oldest(1) == 1
        assert sp.count == 5
        assert sp.bytes == sum(row_size(r) for r in rows[5:])
    finally:
        sp.close()


def test_rows_survive_reopen(tmp_path: Path) -> None:
    """Committed rows and the producer id are there after close and reopen."""
    sp = Spool(tmp_path).open()
    pid = sp.producer_id
    sp.append(_rows(3))
    sp.reserve_seq(500)
    sp.close()
    sp2 = Spool(tmp_path).open()
    try:
        assert sp2.producer_id == pid
        assert sp2.seq_reserved == 500
        assert sp2.count == 3
    finally:
        sp2.close()


def test_second_open_is_locked(tmp_path: Path) -> None:
    """A second spool on the same dir gets SpoolLockedError naming the owner pid."""
    sp = Spool(tmp_path).open()
    try:
        with pytest.raises(SpoolLockedError, match="pid"):
            Spool(tmp_path).open()
    finally:
        sp.close()
    Spool(tmp_path).open().close()  # free again after close


def test_corrupt_file_moved_aside(tmp_path: Path) -> None:
    """A corrupt database is renamed aside and a fresh spool starts; the id is kept."""
    sp = Spool(tmp_path).open()
    pid = sp.producer_id
    sp.close()
    (tmp_path / "spool.db").write_bytes(b"this is not a database" * 100)
    sp2 = Spool(tmp_path).open()
    try:
        assert sp2.corrupt_files_moved == 1
        assert sp2.count == 0
        assert sp2.producer_id == pid
        assert list(tmp_path.glob("spool.db.corrupt-*"))
    finally:
        sp2.close()


def _damaged(tmp_path: Path, rows: int = 3000, *, keep_summary: bool) -> list[int]:
    """A closed spool of ``rows`` rows of 1000 bytes (ids 1..rows, seq = id - 1) with one
    page in the middle of its table overwritten, as a disk error would; the file's mtime
    kept. Without the clean-close summary, the next open runs quick_check. Returns the ids."""
    sp = Spool(tmp_path).open()
    sp.reserve_seq(rows)
    sp.append([("t", None, bytes(1000), None, 1, i) for i in range(rows)])
    sp.close()
    db = tmp_path / "spool.db"
    st_ = db.stat()
    with db.open("r+b") as f:
        f.seek(st_.st_size // 2 // 4096 * 4096)
        f.write(b"\xff" * 4096)
    os.utime(db, ns=(st_.st_atime_ns, st_.st_mtime_ns))
    if not keep_summary:
        state = json.loads((tmp_path / "state.json").read_text())
        state.pop("closed")
        (tmp_path / "state.json").write_text(json.dumps(state))
    return list(range(1, rows + 1))


def _ids_and_seqs(sp: Spool) -> list[tuple[int, int]]:
    return [(r[0], r[6]) for r in sp.read_after(0, 10**6)]


def test_a_damaged_file_found_at_open_is_set_aside_and_every_readable_row_kept(
    tmp_path: Path,
) -> None:
    """quick_check fails at open: the file is set aside (kept), and every row that can still
    be read is copied into a fresh spool under its own id and seq; the ids that could not
    be read are counted, and all the others are there."""
    ids = _damaged(tmp_path, keep_summary=False)
    sp = Spool(tmp_path).open()
    try:
        assert sp.corrupt_files_moved == 1
        assert list(tmp_path.glob("spool.db.corrupt-*"))
        got = _ids_and_seqs(sp)
        assert all(seq == rid - 1 for rid, seq in got)
        kept = {rid for rid, _ in got}
        assert 0 < len(kept) < len(ids)
        assert sp.count == len(kept)
        assert sp.unreadable_ids >= len(ids) - len(kept)
        assert sp.unreadable_ids < 20  # one 4 KiB page holds a few rows, not the table
        assert sp.seq_reserved >= len(ids)
        sp.append([("t", None, b"new", None, 1, len(ids))])
        assert sp.read_after(len(ids), 10)[0][0] > len(ids)  # ids stay above the old ones
    finally:
        sp.close()


def test_a_damaged_file_under_a_relative_spool_dir_is_salvaged_leaving_no_file_beside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spool_dir given as a relative path (it raised ValueError: "relative path can't be
    expressed as a file URI", and the open failed): the damaged file is set aside and its
    readable rows are kept; the read-only look at it makes no -wal/-shm beside it."""
    monkeypatch.chdir(tmp_path)
    spool_dir = Path("spool #1?x=%41 é")
    spool_dir.mkdir(mode=0o700)
    ids = _damaged(spool_dir, keep_summary=False)
    sp = Spool(spool_dir).open()
    try:
        assert sp.corrupt_files_moved == 1
        assert 0 < sp.count < len(ids)
    finally:
        sp.close()
    assert len(list(spool_dir.glob("spool.db.corrupt-*"))) == 1  # no -wal/-shm of it


def test_a_damaged_page_found_by_a_read_rebuilds_the_open_spool(tmp_path: Path) -> None:
    """The clean-close summary lets open skip quick_check; the damaged page is found by a
    read (SpoolCorruptError). rebuild() sets the file aside and goes on with the readable
    rows, under the same ids, in the same (open) spool."""
    ids = _damaged(tmp_path, keep_summary=True)
    sp = Spool(tmp_path).open()
    try:
        assert sp.corrupt_files_moved == 0
        with pytest.raises(SpoolCorruptError) as info:
            sp.read_after(0, 10**6)
        assert info.value.corrupt
        sp.rebuild(str(info.value))
        assert sp.corrupt_files_moved == 1
        got = _ids_and_seqs(sp)
        kept = {rid for rid, _ in got}
        assert 0 < len(kept) < len(ids)
        assert sp.count == len(kept)
        assert sp.unreadable_ids >= len(ids) - len(kept)
        assert sp.delete_through(max(kept)) == len(kept)
        assert sp.count == 0
        assert not sp.holds_rows()
    finally:
        sp.close()


def test_gauges_never_go_below_zero(tmp_path: Path) -> None:
    """Gauges that are off (rows gone behind the spool's back) are counted again from the
    table when a delete would take them below zero, never shown negative."""
    sp = Spool(tmp_path).open()
    try:
        sp.append([("t", None, b"x", None, 1, i) for i in range(10)])
        sp.rows.count, sp.rows.bytes = 3, 10  # as if other writes had been lost
        sp.delete(range(1, 11))
        assert (sp.count, sp.bytes) == (0, 0)
        sp.append([("t", None, b"x", None, 1, 10)])
        sp.rows.count = 0  # the gauge says empty, the table does not
        assert sp.holds_rows()
        assert sp.count == 1
    finally:
        sp.close()


def _gauges(sp: Spool) -> tuple[int, int, int, int]:
    return sp.count, sp.bytes, sp.rows.garbage, sp.top_id


def test_clean_close_lets_the_next_open_skip_the_full_file_checks(tmp_path: Path) -> None:
    """After a clean close the next open trusts the summary it left (same gauges, no
    quick_check); the summary is gone from state.json as soon as a spool is open, so a
    crash then leads to a full check."""
    sp = Spool(tmp_path).open()
    assert sp.checked_at_open  # a new spool: checked
    sp.append(_rows(50))
    sp.delete_through(sp.read_after(0, 20)[-1][0])  # a watermark with garbage below it
    want = _gauges(sp)
    sp.close()
    assert "closed" in json.loads((tmp_path / "state.json").read_text())
    sp2 = Spool(tmp_path).open()
    try:
        assert not sp2.checked_at_open
        assert _gauges(sp2) == want
        assert "closed" not in json.loads((tmp_path / "state.json").read_text())
        sp2.append(_rows(1, 50))
    finally:
        sp2.rows.detach().close()  # type: ignore[union-attr]  # a crash: no close()
        sp2.close()
    sp3 = Spool(tmp_path).open()
    try:
        assert sp3.checked_at_open
        assert sp3.count == 31
    finally:
        sp3.close()


def test_summary_that_cannot_be_removed_is_not_used_and_the_id_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """state.json cannot be rewritten at open (disk full): the summary left by the clean
    close is ignored (a full check), and the producer id stays what it was."""
    sp = Spool(tmp_path).open()
    pid = sp.producer_id
    sp.append(_rows(5))
    sp.close()

    def refuse(self: Spool) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Spool, "_write_state", refuse)
    sp2 = Spool(tmp_path).open()
    try:
        assert sp2.producer_id == pid
        assert sp2.checked_at_open
        assert sp2.count == 5
    finally:
        sp2.rows.detach().close()  # type: ignore[union-attr]  # close() would write the state
        sp2.close()


def test_a_file_changed_after_a_clean_close_is_checked_again(tmp_path: Path) -> None:
    """Rows added by someone else after a clean close (the file grows): the summary no
    longer matches the file, so the open checks and counts the table."""
    sp = Spool(tmp_path).open()
    sp.append(_rows(10))
    sp.close()
    conn = sqlite3.connect(tmp_path / "spool.db")
    with conn:
        conn.executemany(
            "INSERT INTO records_all (topic, value, ts, seq, size) VALUES ('t', ?, 0, ?, 1100)",
            [(bytes(1000), 100 + i) for i in range(100)],
        )
    conn.close()
    sp2 = Spool(tmp_path).open()
    try:
        assert sp2.checked_at_open
        assert sp2.count == 110
        assert sp2.bytes == sum(row_size(r) for r in _rows(10)) + 100 * 1100
    finally:
        sp2.close()


def test_delete_counts_only_the_rows_still_there(tmp_path: Path) -> None:
    """A late acknowledgement of rows when_full="drop_oldest" dropped meanwhile: delete()
    returns only the rows that left the spool now (the producer counts them replayed)."""
    sp = Spool(tmp_path).open()
    try:
        sp.append(_rows(10))
        ids = [r[0] for r in sp.read_after(0, 10)]
        assert sp.drop_oldest(1) == 1  # the oldest row goes by policy
        assert sp.delete(ids[:4]) == 3
        assert sp.count == 6
        assert sp.delete_through(ids[5]) == 2
        assert sp.count == 4
    finally:
        sp.close()


def test_summary_saying_empty_while_rows_remain_is_not_trusted(tmp_path: Path) -> None:
    """Gauges that had drifted to 0 at a clean close: the open sees a row above the
    watermark, checks and counts the table, so those rows are replayed, not stranded."""
    sp = Spool(tmp_path).open()
    sp.append(_rows(7))
    sp.rows.count = 0  # a drifted gauge, as a bug would leave it
    sp.close()
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["closed"]["count"] == 0
    sp2 = Spool(tmp_path).open()
    try:
        assert sp2.checked_at_open
        assert sp2.count == 7
    finally:
        sp2.close()


def test_gauges_that_disagree_with_the_table_are_recounted(tmp_path: Path) -> None:
    sp = Spool(tmp_path).open()
    try:
        sp.append(_rows(3))
        sp.rows.count, sp.rows.bytes = 7, 1
        sp.recount_if_off()
        assert (sp.count, sp.bytes) == (3, sum(row_size(r) for r in _rows(3)))
    finally:
        sp.close()


def test_rejected_rows_kept(tmp_path: Path) -> None:
    """Rows moved to 'rejected' leave the FIFO but stay inspectable with their error."""
    sp = Spool(tmp_path).open()
    try:
        sp.append(_rows(2))
        first = sp.read_after(0, 1)[0][0]
        sp.move_to_rejected([(first, "too large")])
        assert sp.count == 1
        assert sp.rejected_count() == 1
        conn = sqlite3.connect(tmp_path / "spool.db")
        assert conn.execute("SELECT error FROM rejected").fetchone() == ("too large",)
        conn.close()
    finally:
        sp.close()


def test_bad_settings() -> None:
    """Unknown synchronous mode and a non-positive cap are ConfigErrors."""
    with pytest.raises(ConfigError, match="synchronous"):
        Spool("/tmp/x", synchronous="SOMETIMES")
    with pytest.raises(ConfigError, match="spool_max_bytes"):
        Spool("/tmp/x", max_bytes=0)


def test_ids_keep_growing_when_the_spool_empties(tmp_path: Path) -> None:
    """An emptied spool does not number from 1 again (the replay cursor is past those ids);
    delete_through removes exactly the rows up to an id and keeps the accounting."""
    sp = Spool(tmp_path).open()
    try:
        sp.append(_rows(3))
        ids = [r[0] for r in sp.read_after(0, 10)]
        assert sp.delete_through(ids[-1]) == 3
        assert (sp.count, sp.bytes) == (0, 0)
        sp.append(_rows(2))
        again = [r[0] for r in sp.read_after(0, 10)]
        assert again == [ids[-1] + 1, ids[-1] + 2]
        assert sp.delete_through(again[0]) == 1
        assert sp.count == 1
        assert sp.bytes == sum(row_size(r) for r in _rows(2)[1:])
        assert sp.delete_through(again[0]) == 0
    finally:
        sp.close()


def _rows_in_file(path: Path, table: str) -> list[int]:
    conn = sqlite3.connect(path / "spool.db")
    try:
        return [int(s) for (s,) in conn.execute(f"SELECT seq FROM {table} ORDER BY id")]
    finally:
        conn.close()


def test_delete_through_moves_a_watermark_and_truncates_once_nothing_is_left(
    tmp_path: Path,
) -> None:
    """Acknowledged rows leave the spool at once (reads, counts, the ``records`` view, a
    reopen); the table keeps them until no row is left above the watermark, then empties;
    ids never go back below the watermark, even in an emptied table after a reopen."""
    sp = Spool(tmp_path).open()
    try:
        sp.append(_rows(5))
        ids = [r[0] for r in sp.read_after(0, 10)]
        assert sp.delete_through(ids[2]) == 3
        assert [r[6] for r in sp.read_after(0, 10)] == [3, 4]
        assert [r[6] for r in sp.read_replay(0, 10)] == [b"3", b"4"]  # seq as header bytes
        assert (sp.count, sp.bytes) == (2, sum(row_size(r) for r in _rows(5)[3:]))
        assert _rows_in_file(tmp_path, "records") == [3, 4]
        assert _rows_in_file(tmp_path, "records_all") == [0, 1, 2, 3, 4]  # not yet deleted
    finally:
        sp.close()
    sp = Spool(tmp_path).open()  # the watermark is in the database: it survives a restart
    try:
        assert (sp.count, [r[6] for r in sp.read_after(0, 10)]) == (2, [3, 4])
        assert sp.delete_through(ids[4]) == 2
        assert (sp.count, sp.bytes) == (0, 0)
        assert _rows_in_file(tmp_path, "records_all") == []  # truncated
    finally:
        sp.close()
    sp = Spool(tmp_path).open()
    try:
        sp.append(_rows(1))
        assert [r[0] for r in sp.read_after(0, 10)] == [ids[4] + 1]
    finally:
        sp.close()


def test_acknowledged_rows_below_the_watermark_are_deleted_past_a_quarter_of_the_cap(
    tmp_path: Path,
) -> None:
    """With rows still to replay, the acknowledged ones are deleted for real by the next
    append once they hold a quarter of spool_max_bytes, so new rows reuse their pages."""
    rows = _rows(40)
    cap = sum(map(row_size, rows)) * 2
    sp = Spool(tmp_path, max_bytes=cap).open()
    try:
        sp.append(rows)
        ids = [r[0] for r in sp.read_after(0, 100)]
        sp.delete_through(ids[4])  # 5 rows: under a quarter of the cap
        sp.append(_rows(1, start=40))
        assert len(_rows_in_file(tmp_path, "records_all")) == 41
        sp.delete_through(ids[24])  # 25 rows: over it, but no append yet
        assert len(_rows_in_file(tmp_path, "records_all")) == 41
        sp.append(_rows(1, start=41))
        assert _rows_in_file(tmp_path, "records_all") == list(range(25, 42))
        assert _rows_in_file(tmp_path, "records") == list(range(25, 42))
        assert (sp.count, sp.bytes) == (17, sum(map(row_size, _rows(17, start=25))))
    finally:
        sp.close()


def test_a_spool_written_before_the_watermark_opens_with_its_rows(tmp_path: Path) -> None:
    """A spool whose rows are in a table ``records`` (logsdk before the watermark): the
    table becomes ``records_all``, a view takes its name, every row is still there."""
    conn = sqlite3.connect(tmp_path / "spool.db")
    conn.execute(
        "CREATE TABLE records (id INTEGER PRIMARY KEY, topic TEXT, key BLOB, value BLOB, "
        "headers BLOB, ts INTEGER, seq INTEGER, size INTEGER)"
    )
    conn.execute(
        "CREATE TABLE rejected (id INTEGER PRIMARY KEY, topic TEXT, key BLOB, value BLOB, "
        "headers BLOB, ts INTEGER, seq INTEGER, error TEXT, at FLOAT)"
    )
    conn.executemany(
        "INSERT INTO records VALUES (?, 't', NULL, ?, NULL, 0, ?, 70)",
        [(7 + i, b"v%d" % i, i) for i in range(3)],
    )
    conn.commit()
    conn.close()
    sp = Spool(tmp_path).open()
    try:
        assert (sp.count, sp.bytes) == (3, 210)
        assert [r[6] for r in sp.read_after(0, 10)] == [0, 1, 2]
        assert sp.delete_through(7) == 1
        assert _rows_in_file(tmp_path, "records") == [1, 2]
    finally:
        sp.close()


@pytest.mark.parametrize(
    ("content", "found"),
    [
        ('{"producer_id": "p", "seq_reserved": 5}', "ok"),
        ('{"producer_id": "p"}', "ok"),
        (None, "missing"),
        ("LINK", "link"),
        ("DIR", "directory"),
        ("{not json", "malformed"),
        ("[1, 2]", "malformed"),
        ('{"producer_id": 7}', "malformed"),
        ('{"producer_id": "p", "seq_reserved": "5"}', "malformed"),
        ('{"producer_id": "p", "seq_reserved": true}', "malformed"),
    ],
)
def test_state_json_has_one_reader_that_never_follows_a_link(
    tmp_path: Path, content: str | None, found: str
) -> None:
    """read_state, the one reader of state.json (spool, check, CLI): the file is usable
    only as a JSON object with a text producer_id and an integer seq_reserved, never
    through a symbolic link; otherwise it says why. The spool's open refuses a link or a
    directory in its place."""
    state = tmp_path / "state.json"
    if content == "LINK":
        real = tmp_path / "elsewhere.json"
        real.write_text('{"producer_id": "p"}')
        state.symlink_to(real)
    elif content == "DIR":
        state.mkdir()
    elif content is not None:
        state.write_text(content)
    got = read_state(tmp_path)
    assert got.found == found
    assert (got.producer_id == "p") == (found == "ok")
    assert (got.problem is None) == (found == "ok")
    if found in ("link", "directory"):
        with pytest.raises(SpoolError, match=r"state\.json is a symbolic link or a directory"):
            Spool(tmp_path).open()
