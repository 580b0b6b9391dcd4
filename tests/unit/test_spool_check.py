"""`logsdk spool check`: each check passes on a sound spool and fails on one damaged on
purpose; the check writes nothing and leaves a live producer's slot working."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from logsdk.cli import main
from logsdk.errors import SpoolError
from logsdk.spool import Spool, _check
from logsdk.spool._check import CheckResult, check_spool_dir

ROOT = Path(__file__).resolve().parents[2]


def make_spool(directory: Path, rows: int = 3, reserve: int = 100, value: bytes = b"v") -> None:
    """A spool closed cleanly: ``rows`` records with seqs 0.., seqs reserved up to
    ``reserve``."""
    spool = Spool(directory).open()
    try:
        spool.reserve_seq(reserve)
        spool.append([("t", None, value, None, 1_000 + i, i) for i in range(rows)])
    finally:
        spool.close()


@contextlib.contextmanager
def damage(directory: Path) -> Iterator[sqlite3.Connection]:
    """A writing connection to the spool's database, committed and closed at the end."""
    conn = sqlite3.connect(directory / "spool.db")
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def state(directory: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((directory / "state.json").read_text())
    return doc


def write_state(directory: Path, doc: dict[str, Any]) -> None:
    (directory / "state.json").write_text(json.dumps(doc))  # an existing file: mode kept


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def only_problems(result: CheckResult) -> list[str]:
    return [p.split(": ", 1)[1] for p in result.problems]


def test_a_clean_spool_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two sound slots: no problem, one line per slot with its figures, exit 0."""
    make_spool(tmp_path)
    make_spool(tmp_path / "slots" / "1", rows=2)
    result = check_spool_dir(tmp_path)
    assert result.ok, result.problems
    assert [(s.slot, s.live, s.records, s.seq_range) for s in result.slots] == [
        (0, False, 3, (0, 2)),
        (1, False, 2, (0, 1)),
    ]
    assert main(["spool", "check", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"note: slot 0 ({tmp_path}): free; 3 record(s) (195 bytes), seq 0..2, 0 rejected; "
        "the summary of the last close matches",
        f"note: slot 1 ({tmp_path}/slots/1): free; 2 record(s) (130 bytes), seq 0..1, "
        "0 rejected; the summary of the last close matches",
        "2 slot(s) checked, 0 problem(s)",
    ]


def test_a_path_with_unusual_characters_is_read_and_nothing_is_written(tmp_path: Path) -> None:
    """A space, '#', '?', '%' and non-ASCII in the path: the slot is read (no problem), no
    file is created or changed, and the next open still trusts the summary of the close."""
    directory = tmp_path / "a b#c?d%20é"
    make_spool(directory)
    before = snapshot(directory)
    stat_before = os.stat(directory / "spool.db")
    result = check_spool_dir(directory)
    assert result.ok, result.problems
    assert result.slots[0].records == 3
    assert snapshot(directory) == before
    assert os.stat(directory / "spool.db").st_mtime_ns == stat_before.st_mtime_ns
    spool = Spool(directory).open()
    try:
        assert not spool.checked_at_open  # the summary still stood
        assert spool.count == 3
    finally:
        spool.close()


def test_a_seq_held_twice_is_a_problem(tmp_path: Path) -> None:
    """Two rows above the watermark with one seq."""
    make_spool(tmp_path)
    with damage(tmp_path) as conn:
        conn.execute(
            "INSERT INTO records_all (id, topic, value, ts, seq, size) "
            "VALUES (9, 't', x'76', 1, 1, 65)"
        )
    result = check_spool_dir(tmp_path)
    assert only_problems(result) == [
        "seq 1 is held by 2 rows of records_all above the watermark (1 seq(s) held more than once)"
    ]


def test_a_seq_in_rejected_and_in_records_is_a_problem(tmp_path: Path) -> None:
    """A rejected row with the seq of a row still spooled."""
    make_spool(tmp_path)
    with damage(tmp_path) as conn:
        conn.execute(
            "INSERT INTO rejected (topic, value, ts, seq, error, at) "
            "VALUES ('t', x'76', 1, 2, 'MSG_SIZE_TOO_LARGE', 0)"
        )
    result = check_spool_dir(tmp_path)
    assert only_problems(result) == [
        "seq 2 is held 2 times by rows of rejected and records_all above the watermark "
        "together (1 seq(s) so)"
    ]
    assert result.slots[0].rejected == 1


@pytest.mark.parametrize("table", ["records_all", "rejected"])
def test_a_seq_not_below_the_reservation_is_a_problem(tmp_path: Path, table: str) -> None:
    """A row whose seq is the reservation itself: a restart would use that seq again."""
    make_spool(tmp_path, reserve=1 << 20)
    extra = ", error, at" if table == "rejected" else ", size"
    with damage(tmp_path) as conn:
        conn.execute(
            f"INSERT INTO {table} (id, topic, value, ts, seq{extra}) "
            f"VALUES (9, 't', x'76', 1, {(1 << 20) + 1}, {'0, 0' if table == 'rejected' else 65})"
        )
    result = check_spool_dir(tmp_path)
    assert only_problems(result) == [
        f"seq 1048577 in {table} is not below seq_reserved 1048576 in state.json",
        f"seq 1048577 in {table} is not below seq_reserved 1048576 in the identity table",
    ]
    assert result.problems[0] == (
        f"slot 0 ({tmp_path}): seq 1048577 in {table} is not below seq_reserved 1048576 "
        "in state.json"
    )


def test_a_producer_id_that_differs_from_the_database_is_a_problem(tmp_path: Path) -> None:
    """state.json names another producer than the identity table."""
    make_spool(tmp_path)
    doc = state(tmp_path)
    db_id = doc["producer_id"]
    write_state(tmp_path, {**doc, "producer_id": "0" * 32})
    result = check_spool_dir(tmp_path)
    assert only_problems(result) == [
        f"producer_id {'0' * 32} in state.json differs from {db_id} in the identity table"
    ]


def test_a_database_reservation_behind_the_file_is_a_problem(tmp_path: Path) -> None:
    """The database is written first: its reservation is never behind state.json's."""
    make_spool(tmp_path, reserve=100)
    write_state(tmp_path, {**state(tmp_path), "seq_reserved": 200})
    result = check_spool_dir(tmp_path)
    assert only_problems(result) == [
        "seq_reserved 100 in the identity table is below 200 in state.json (the database "
        "is written first, so it is never behind: was spool.db replaced?)"
    ]


def test_a_database_reservation_ahead_of_the_file_is_a_note(tmp_path: Path) -> None:
    """Ahead: a reservation cut short between its two writes, which the next open
    completes; said, not a problem."""
    make_spool(tmp_path, reserve=100)
    write_state(tmp_path, {**state(tmp_path), "seq_reserved": 50})
    result = check_spool_dir(tmp_path)
    assert result.ok, result.problems
    assert any("seq_reserved 100 in the identity table is ahead of 50" in n for n in result.notes)


def test_a_summary_that_disagrees_with_the_table_is_a_problem(tmp_path: Path) -> None:
    """A row deleted behind the summary's back, the file's mtime put back: the summary
    still describes the file, and its count is wrong."""
    make_spool(tmp_path)
    closed = state(tmp_path)["closed"]
    db = tmp_path / "spool.db"
    with damage(tmp_path) as conn:
        conn.execute("DELETE FROM records_all WHERE id = (SELECT max(id) FROM records_all)")
    os.utime(db, ns=(os.stat(db).st_atime_ns, closed["mtime_ns"]))
    assert not (tmp_path / "spool.db-wal").exists()
    assert os.stat(db).st_size == closed["size"]
    result = check_spool_dir(tmp_path)
    assert only_problems(result) == [
        "the summary of the last clean close in state.json says 3 record(s), 195 bytes, "
        "watermark 0, and still describes spool.db; its table holds 2 record(s), 130 bytes, "
        "watermark 0 (the next open would take the summary's)"
    ]


def test_a_changed_file_makes_the_summary_a_note(tmp_path: Path) -> None:
    """The file changed since the close: the summary is not used, counts are as found."""
    make_spool(tmp_path)
    with damage(tmp_path) as conn:
        conn.execute("DELETE FROM records_all WHERE id = (SELECT max(id) FROM records_all)")
    result = check_spool_dir(tmp_path)
    assert result.ok, result.problems
    assert "2 record(s)" in result.notes[0]
    assert "counts as found (the summary of the last close no longer describes" in result.notes[0]


def test_a_corrupt_page_fails_integrity_check(tmp_path: Path) -> None:
    """Bytes overwritten in the middle of a closed database of a few thousand rows."""
    make_spool(tmp_path, rows=3000, value=b"x" * 200)
    db = tmp_path / "spool.db"
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.seek(size // 2 // 4096 * 4096 + 100)
        f.write(b"\xa5" * 2000)
    result = check_spool_dir(tmp_path)
    assert not result.ok
    assert result.problems[0].startswith(f"slot 0 ({tmp_path}): integrity_check failed: ")
    assert all("\n" not in p for p in result.problems)


def test_a_file_that_is_not_a_database_is_a_problem(tmp_path: Path) -> None:
    """A header overwritten: one problem, the reason SQLite gives."""
    make_spool(tmp_path)
    with (tmp_path / "spool.db").open("r+b") as f:
        f.write(b"\0" * 100)
    assert only_problems(check_spool_dir(tmp_path)) == [
        "spool.db cannot be read: file is not a database"
    ]


def test_a_group_writable_file_is_a_problem(tmp_path: Path) -> None:
    """The rules of check_private: a file others could write."""
    make_spool(tmp_path)
    (tmp_path / "spool.db").chmod(0o664)
    (problem,) = only_problems(check_spool_dir(tmp_path))
    assert "spool.db is writable by group or others (mode 0664)" in problem


def test_a_link_instead_of_a_file_is_a_problem(tmp_path: Path) -> None:
    """state.json replaced by a symbolic link to a copy of itself."""
    make_spool(tmp_path)
    copy = tmp_path / "elsewhere.json"
    (tmp_path / "state.json").rename(copy)
    (tmp_path / "state.json").symlink_to(copy)
    (problem,) = only_problems(check_spool_dir(tmp_path))
    assert "state.json is a symbolic link or not a regular file" in problem


def test_a_corrupt_file_moved_aside_is_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Named, with its size; not a problem (exit 0)."""
    make_spool(tmp_path)
    aside = tmp_path / "spool.db.corrupt-20240101-000000-abcdef"
    aside.write_bytes(b"junk")
    aside.chmod(0o600)
    assert main(["spool", "check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        f"note: slot 0 ({tmp_path}): spool.db.corrupt-20240101-000000-abcdef (4 bytes): a "
        "damaged spool a producer moved aside; inspect or delete it\n" in out
    )
    assert out.endswith("1 slot(s) checked, 0 problem(s)\n")


def test_a_live_slot_is_checked_and_keeps_working(tmp_path: Path) -> None:
    """A slot held by a live Spool (this thread's): reported live with its pid, no false
    problem, nothing the producer needs disturbed: it appends and closes afterwards."""
    spool = Spool(tmp_path).open()
    try:
        spool.reserve_seq(100)
        spool.append([("t", None, b"v", None, 1, i) for i in range(5)])
        result = check_spool_dir(tmp_path)
        assert result.ok, result.problems
        (slot,) = result.slots
        assert (slot.live, slot.pid, slot.records) == (True, os.getpid(), 5)
        assert "counts as found (no summary while a producer holds it)" in result.notes[0]
        spool.append([("t", None, b"v", None, 1, 5)])
        assert spool.count == 6
    finally:
        spool.close()
    result = check_spool_dir(tmp_path)
    assert result.ok, result.problems
    assert result.slots[0].live is False
    assert result.notes[0].endswith("the summary of the last close matches")


def test_a_live_producer_mid_reservation_is_a_note(tmp_path: Path) -> None:
    """The database's reservation ahead of state.json while a producer holds the slot
    (what a check sees between reserve_seq's two writes): explained, not a problem."""
    spool = Spool(tmp_path).open()
    try:
        spool.reserve_seq(100)
        with damage(tmp_path) as conn:  # the database half of a reservation to 200
            conn.execute("UPDATE identity SET seq_reserved = 200")
        result = check_spool_dir(tmp_path)
        assert result.ok, result.problems
        assert any(
            "seq_reserved 200 in the identity table is ahead of 100 in state.json: a live "
            "producer is reserving seqs" in n
            for n in result.notes
        )
    finally:
        spool.close()


def test_a_slot_left_by_a_killed_producer_is_read_from_its_wal(tmp_path: Path) -> None:
    """A producer killed without closing leaves its rows in the WAL: the check sees them,
    reports no problem, and creates no file."""
    script = textwrap.dedent(
        """
        import os, sys
        from logsdk.spool import Spool
        spool = Spool(sys.argv[1]).open()
        spool.reserve_seq(100)
        spool.append([("t", None, b"v", None, 1, i) for i in range(7)])
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, cwd=ROOT)
    assert (tmp_path / "spool.db-wal").stat().st_size > 0
    names = sorted(p.name for p in tmp_path.iterdir())
    result = check_spool_dir(tmp_path)
    assert result.ok, result.problems
    assert (result.slots[0].live, result.slots[0].records) == (False, 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == names


@pytest.mark.parametrize("changes", [1, 3])
def test_a_slot_that_changes_under_the_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changes: int
) -> None:
    """The database file changing under a read of a closed slot (a producer opening and
    closing it meanwhile): read again; after three such reads, not judged (a note), since a
    torn read could show damage that is not there."""
    make_spool(tmp_path)
    db = tmp_path / "spool.db"
    real = _check._read_db
    reads = []

    def read_while_it_changes(path: Path, immutable: bool) -> Any:
        reads.append(immutable)
        snap = real(path, immutable)
        if len(reads) <= changes:
            st = os.stat(db)
            os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        return snap

    monkeypatch.setattr(_check, "_read_db", read_while_it_changes)
    result = check_spool_dir(tmp_path)
    assert result.ok, result.problems
    if changes == 1:
        assert reads == [True, True]
        assert result.slots[0].records == 3
    else:
        assert reads == [True, True, True]
        assert result.slots[0].records is None
        assert "not judged: spool.db changed under each of 3 reads" in result.notes[0]


def test_not_a_spool_dir_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing dir, or one without a spool: exit 2, one line, no traceback."""
    with pytest.raises(SpoolError, match="does not exist"):
        check_spool_dir(tmp_path / "nope")
    assert main(["spool", "check", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"logsdk: error: {tmp_path / 'nope'} does not exist\n"
    assert main(["spool", "check", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"logsdk: error: {tmp_path} is not a spool dir (no spool.db in it or in its slots)\n"
    )


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json: one object, the same findings, exit 1 with a problem."""
    make_spool(tmp_path)
    write_state(tmp_path, {**state(tmp_path), "producer_id": "0" * 32})
    assert main(["spool", "check", str(tmp_path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["slots_checked"], doc["problems"]) == (False, 1, 1)
    (slot,) = doc["slots"]
    assert (slot["live"], slot["records"], slot["seq_range"]) == (False, 3, [0, 2])
    assert [f["severity"] for f in slot["findings"]] == ["note", "problem"]


def test_the_command_as_a_subprocess(tmp_path: Path) -> None:
    """`python -m logsdk.cli spool check DIR`: exit 0 and the summary line on a sound
    spool; exit 1 and the problem's one line on a damaged one."""
    make_spool(tmp_path, reserve=10)

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "logsdk.cli", "spool", "check", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )

    out = run()
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout.splitlines()[-1] == "1 slot(s) checked, 0 problem(s)"
    with damage(tmp_path) as conn:
        conn.execute("UPDATE records_all SET seq = 10 WHERE seq = 2")
    out = run()
    assert (out.returncode, out.stderr) == (1, "")
    assert out.stdout.splitlines()[1:] == [
        f"problem: slot 0 ({tmp_path}): seq 10 in records_all is not below seq_reserved 10 "
        "in state.json",
        f"problem: slot 0 ({tmp_path}): seq 10 in records_all is not below seq_reserved 10 "
        "in the identity table",
        "1 slot(s) checked, 2 problem(s)",
    ]
