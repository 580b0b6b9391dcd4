"""SQLiteSink: rows and offsets in one transaction, compare-and-set fencing, dedupe."""

from __future__ import annotations

import os
import pickle
import sqlite3
import threading
from pathlib import Path

import pytest

from logsdk.consumer import Record
from logsdk.errors import ConfigError, FencedError
from logsdk.sinks import SQLiteSink
from logsdk.sinks import _sqlite as sink_module
from tests.conftest import exit_codes, wait_until

TP = ("logs", 0)


def recs(offsets: range, partition: int = 0, producer: bytes | None = None) -> list[Record]:
    out = []
    for o in offsets:
        headers = (
            [] if producer is None else [("logsdk.producer", producer), ("logsdk.seq", b"%d" % o)]
        )
        out.append(Record("logs", partition, o, None, b"v%d" % o, headers, 1))
    return out


def rows(path: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(path) as conn:
        got = conn.execute("SELECT partition, offset FROM records ORDER BY 1, 2").fetchall()
    conn.close()
    return [(int(p), int(o)) for p, o in got]


def test_commit_writes_rows_and_offsets_together(tmp_path: Path) -> None:
    """After commit the rows are there and the stored offset is the next one to read."""
    with SQLiteSink(tmp_path / "s.db") as sink:
        assert sink.stored_offsets([TP]) == {}
        sink.process(recs(range(0, 5)))
        sink.commit({TP: 5})
        assert sink.stored_offsets([TP, ("logs", 1)]) == {TP: 5}
        assert sink.count() == 5


def test_rollback_drops_the_batch(tmp_path: Path) -> None:
    """rollback() after process() leaves neither rows nor offsets behind."""
    with SQLiteSink(tmp_path / "s.db") as sink:
        sink.process(recs(range(0, 5)))
        sink.rollback(RuntimeError("boom"))
        sink.process(recs(range(0, 2)))
        sink.commit({TP: 2})
        assert rows(tmp_path / "s.db") == [(0, 0), (0, 1)]


def test_zombie_commit_is_fenced(tmp_path: Path) -> None:
    """A batch starting below the stored offset (another owner wrote it) is refused."""
    with SQLiteSink(tmp_path / "s.db") as new_owner, SQLiteSink(tmp_path / "s.db") as zombie:
        new_owner.process(recs(range(0, 10)))
        new_owner.commit({TP: 10})
        zombie.process(recs(range(0, 5)))
        with pytest.raises(FencedError, match="another owner"):
            zombie.commit({TP: 5})
        zombie.rollback(FencedError("x"))
        assert rows(tmp_path / "s.db") == [(0, o) for o in range(10)]
        assert new_owner.stored_offsets([TP]) == {TP: 10}


def test_holes_above_the_stored_offset_are_allowed(tmp_path: Path) -> None:
    """Offsets may skip (transaction markers): a batch may start above the stored offset."""
    with SQLiteSink(tmp_path / "s.db") as sink:
        sink.process(recs(range(0, 3)))
        sink.commit({TP: 3})
        sink.process(recs(range(5, 7)))
        sink.commit({TP: 7})
        # An empty batch (a dead-lettered record) only moves the offset forward.
        sink.process([])
        sink.commit({TP: 8})
        sink.process([])
        with pytest.raises(FencedError):
            sink.commit({TP: 8})
        assert sink.stored_offsets([TP]) == {TP: 8}


def test_dedupe_on_producer_headers(tmp_path: Path) -> None:
    """With dedupe, a record whose (producer, seq) is stored already is skipped."""
    with SQLiteSink(tmp_path / "s.db", dedupe=True) as sink:
        sink.process(recs(range(0, 5), producer=b"p1"))
        sink.commit({TP: 5})
        # The producer resent seq 3 and 4 (new offsets 5, 6, but seq taken from offset).
        again = [
            Record("logs", 0, 5 + i, None, b"dup", [("logsdk.producer", b"p1"), ("logsdk.seq", s)])
            for i, s in enumerate([b"3", b"4", b"9"])
        ]
        sink.process(again)
        sink.commit({TP: 8})
        assert sink.count() == 6
        assert sink.deduplicated == 2


def test_threads_commit_partitions_in_parallel(tmp_path: Path) -> None:
    """Several threads, one partition each, each with its own staged batch."""
    with SQLiteSink(tmp_path / "s.db") as sink:

        def work(p: int) -> None:
            for start in range(0, 200, 20):
                sink.process(recs(range(start, start + 20), partition=p))
                sink.commit({("logs", p): start + 20})

        threads = [threading.Thread(target=work, args=(p,)) for p in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(rows(tmp_path / "s.db")) == [(p, o) for p in range(4) for o in range(200)]


def test_pickled_copy_reconnects(tmp_path: Path) -> None:
    """A pickled sink (executor='process') writes to the same database."""
    with SQLiteSink(tmp_path / "s.db") as sink:
        copy = pickle.loads(pickle.dumps(sink))
        copy.process(recs(range(0, 2)))
        copy.commit({TP: 2})
        copy.close()
        assert sink.stored_offsets([TP]) == {TP: 2}


def test_bad_arguments(tmp_path: Path) -> None:
    """Bad settings raise ConfigError saying what to change."""
    with pytest.raises(ConfigError, match="database file"):
        SQLiteSink(":memory:")
    with pytest.raises(ConfigError, match="identifier"):
        SQLiteSink(tmp_path / "s.db", table="x; drop")
    with pytest.raises(ConfigError, match="synchronous"):
        SQLiteSink(tmp_path / "s.db", synchronous="sometimes")


def test_large_batch_rows_and_header_columns(tmp_path: Path) -> None:
    """Batches over the multi-row INSERT size keep every row and field, in order."""
    batch = recs(range(0, 150), producer=b"p1")  # 2 x 64 rows per statement + 22 singly
    batch[3].headers = [("logsdk.seq", b"bad"), ("other", b"x")]
    batch[4].headers = []
    with SQLiteSink(tmp_path / "s.db") as sink:
        sink.process(batch[:100])
        sink.process(batch[100:])
        sink.commit({TP: 150})
        assert sink.count() == 150
    with sqlite3.connect(tmp_path / "s.db") as conn:
        got = conn.execute(
            "SELECT offset, value, timestamp, producer, seq FROM records ORDER BY rowid"
        ).fetchall()
    conn.close()
    assert [g[0] for g in got] == list(range(150))
    assert got[0] == (0, b"v0", 1, "p1", 0)
    assert got[3] == (3, b"v3", 1, None, None)
    assert got[4] == (4, b"v4", 1, None, None)
    assert got[149] == (149, b"v149", 1, "p1", 149)


@pytest.mark.parametrize("kinds", ["mixed", "bytes", "none", "empty", "str", "int"])
def test_keys_and_values_are_stored_as_they_came(tmp_path: Path, kinds: str) -> None:
    """Keys and values (bound as bytearrays, None as a NaN that SQLite stores as NULL)
    are stored as they came, through both the 64-row statement and the single-row one:
    None stays NULL, b"" an empty BLOB, bytes stay bytes; a column of other types (a str
    column a Spark query wrote, ints with a 0) is bound as it is, as before."""
    pick = {
        "mixed": lambda o: (None, b"", b"k%d" % o)[o % 3],
        "bytes": lambda o: b"k%d" % o,
        "none": lambda o: None,
        "empty": lambda o: b"",
        "str": lambda o: (None, "", f"k{o}")[o % 3],
        "int": lambda o: (None, 0, o)[o % 3],
    }[kinds]
    batch = [Record("logs", 0, o, pick(o), pick(o + 1), [], 1) for o in range(70)]
    with SQLiteSink(tmp_path / "s.db") as sink:
        sink.process(batch)
        sink.commit({TP: 70})
    with sqlite3.connect(tmp_path / "s.db") as conn:
        got = conn.execute(
            "SELECT key, value, typeof(key), typeof(value) FROM records ORDER BY offset"
        ).fetchall()
    conn.close()
    assert [(k, v) for k, v, _, _ in got] == [(r.key, r.value) for r in batch]
    stored = {"blob", "null"} if kinds not in ("str", "int") else {"text", "integer", "null"}
    assert all({tk, tv} <= stored for _, _, tk, tv in got)


@pytest.mark.parametrize("returning", [True, False])
def test_dedupe_within_a_batch_and_across_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, returning: bool
) -> None:
    """Dedupe keeps the first copy of each (producer, seq), whether the copies are in one
    batch or in two, keeps rows without the headers, and over 256 pairs (several dedupe
    statements) too; with RETURNING (SQLite >= 3.35) and row by row (older SQLite)."""
    monkeypatch.setattr(sink_module, "_RETURNING", returning)

    def rec(offset: int, producer: bytes | None, seq: int) -> Record:
        hs = (
            [] if producer is None else [("logsdk.producer", producer), ("logsdk.seq", b"%d" % seq)]
        )
        return Record("logs", 0, offset, None, b"%d" % offset, hs, 1)

    first = [rec(o, b"p1", o % 300) for o in range(600)]  # seqs 0..299 twice
    first += [rec(600, None, 0), rec(601, None, 0)]  # no headers: both kept
    first += [rec(602, b"p2", 5)]
    second = [rec(603, b"p2", 5), rec(604, b"p2", 6), rec(605, b"p1", 299)]
    with SQLiteSink(tmp_path / "s.db", dedupe=True) as sink:
        sink.process(first)
        sink.commit({TP: 603})
        assert sink.count() == 300 + 2 + 1
        assert sink.deduplicated == 300
        sink.process(second)
        sink.commit({TP: 606})
        assert sink.count() == 304
        assert sink.deduplicated == 302
    with sqlite3.connect(tmp_path / "s.db") as conn:
        got = [o for (o,) in conn.execute("SELECT offset FROM records ORDER BY offset")]
    conn.close()
    assert got == [*range(300), 600, 601, 602, 604]


def test_producer_and_seq_headers_last_of_a_name_wins(tmp_path: Path) -> None:
    """The producer and seq columns take the last header of each name, whether the two
    end the list in LogProducer's order (the fast path) or not."""
    p, s = "logsdk.producer", "logsdk.seq"
    cases = [
        ([(p, b"a"), (s, b"1")], ("a", 1)),
        ([(s, b"9"), (p, b"a"), (s, b"2")], ("a", 2)),
        ([(p, b"a"), (p, b"b"), (s, b"3")], ("b", 3)),
        ([(p, b"a"), (s, b"4"), ("x", b"y")], ("a", 4)),
        ([(s, b"5"), (p, b"c")], ("c", 5)),
        ([(p, b"a"), (s, b"not a number")], ("a", None)),
        ([("x", b"y")], (None, None)),
        ([], (None, None)),
    ]
    with SQLiteSink(tmp_path / "s.db") as sink:
        producers, seqs = sink._header_columns([hs for hs, _ in cases])
    assert list(zip(producers, seqs, strict=True)) == [want for _, want in cases]


def test_a_seq_header_beyond_int64_or_not_a_number_is_stored_without_dedupe(
    tmp_path: Path,
) -> None:
    """A logsdk.seq header no LogProducer writes (beyond int64, not a number) cannot stop
    the sink: the record is stored with no dedupe key, twice if sent twice."""
    odd = [b"%d" % (1 << 64), b"12abc", b"-%d" % (1 << 70)]
    records = [
        Record("logs", 0, i, None, b"v%d" % i, [("logsdk.producer", b"p"), ("logsdk.seq", s)], 1)
        for i, s in enumerate(odd + odd)
    ]
    with SQLiteSink(tmp_path / "s.db", dedupe=True) as sink:
        sink.process(records)
        sink.commit({})
        assert sink.count() == 6


#: Children forked while the parent's threads commit, and how long they all have to
#: commit a batch of their own and leave.
FORKS = 20
CHILDREN_TIMEOUT_S = 30.0


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_while_threads_commit_writes_through_a_connection_of_its_own(
    tmp_path: Path,
) -> None:
    """Two threads commit batches while the main thread forks: each child's own commit
    returns and lands (the write lock a parent thread held at the fork, and the parent's
    connections, are never the child's), and the parent's commits go on."""
    sink = SQLiteSink(tmp_path / "s.db")
    stop = threading.Event()
    committed = [0, 0]

    def writer(partition: int) -> None:
        while not stop.is_set():
            o = committed[partition]
            sink.process(recs(range(o, o + 20), partition))
            sink.commit({("logs", partition): o + 20})
            committed[partition] = o + 20

    def commits_go_on() -> None:
        n = sum(committed)
        wait_until(lambda: sum(committed) > n, 10, "the threads' commits", 0.001)

    threads = [threading.Thread(target=writer, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    pids: list[int] = []
    try:
        for i in range(FORKS):
            commits_go_on()  # each fork falls while the threads commit
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    tp = ("logs", 100 + i)
                    sink.process(recs(range(3), 100 + i))
                    sink.commit({tp: 3})
                    code = 0 if sink.stored_offsets([tp]) == {tp: 3} else 3
                finally:
                    os._exit(code)
            pids.append(pid)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        codes = exit_codes(pids, CHILDREN_TIMEOUT_S)
    assert codes == [0] * FORKS, f"{codes.count(None)} of {FORKS} children hung: {codes}"
    assert sink.count() == sum(committed) + 3 * FORKS
    sink.close()


#: A process of the test below: waits for the go file, makes the sink, says how.
MAKE_SINK = """
import os, sys, time
from logsdk.sinks import SQLiteSink
path, go = sys.argv[1:3]
open(f"{go}.ready.{os.getpid()}", "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
try:
    SQLiteSink(path).close()
except Exception as exc:
    print(repr(exc))
"""


def test_sinks_made_at_once_by_several_processes_on_a_new_file_all_open(tmp_path: Path) -> None:
    """Six processes (members of one consumer group, Spark tasks) make a SQLiteSink on the
    same new file at the same moment, five times: each opens (they wait for each other's
    journal mode and schema within busy_timeout). Before, 35 of 180 failed "database is
    locked": SQLite skips the busy handler where waiting could deadlock."""
    import subprocess
    import sys

    errors = []
    for i in range(5):
        path, go = tmp_path / f"sink{i}.db", tmp_path / f"go{i}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", MAKE_SINK, str(path), str(go)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(6)
        ]
        ready = f"go{i}.ready.*"
        wait_until(lambda: len(list(tmp_path.glob(ready))) == 6, 60, "all ready")  # noqa: B023
        go.touch()  # all at once
        errors += [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [e for e in errors if e] == []
    assert rows(tmp_path / "sink0.db") == []
