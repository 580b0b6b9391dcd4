"""The SQLite spool: codec, FIFO, accounting, lock, corruption, persisted identity."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logsdk.errors import ConfigError, SpoolLockedError
from logsdk.spool import Spool, decode_headers, encode_headers
from logsdk.spool._spool import row_size

headers_st = st.lists(
    st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=50))), max_size=6
)


@given(headers_st)
def test_header_codec_round_trips(headers: list[tuple[str, bytes | None]]) -> None:
    """Any list of (str, bytes|None) headers survives encode/decode unchanged."""
    assert decode_headers(encode_headers(headers)) == headers


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
