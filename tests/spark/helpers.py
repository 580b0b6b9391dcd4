"""Helpers for the spark_sink tests (importable by Spark's Python workers too)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from logsdk.sinks import SQLiteSink

QUERY_TIMEOUT = 120.0


class RecordingSink(SQLiteSink):
    """SQLiteSink that appends a line to ``log`` each time ``rollback`` runs."""

    def __init__(self, path: str | Path, log: str | Path) -> None:
        super().__init__(path)
        self.log = str(log)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "log": self.log}

    def rollback(self, error: BaseException) -> None:
        with open(self.log, "a") as f:
            f.write(f"rollback: {error}\n")
        super().rollback(error)


def stored_rows(db: Path, table: str = "records") -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of every row in the sink table, sorted ([] before any)."""
    if not db.exists():
        return []
    conn = sqlite3.connect(db, timeout=30)
    try:
        return sorted(conn.execute(f"SELECT topic, partition, offset FROM [{table}]").fetchall())
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []  # the sink has not created its tables yet
        raise
    finally:
        conn.close()


def stored_values(db: Path, table: str = "records") -> list[bytes]:
    """The value of every row in the sink table, in no particular order."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        return [bytes(v) for (v,) in conn.execute(f"SELECT value FROM [{table}]")]
    finally:
        conn.close()


def next_batch(db: Path, sink_id: str) -> int:
    """The next batch id SQLiteSink at ``db`` stores for ``sink_id`` (0 before any)."""
    if not db.exists():
        return 0
    conn = sqlite3.connect(db, timeout=30)
    try:
        row = conn.execute(
            "SELECT next_offset FROM logsdk_offsets WHERE topic = ? AND partition = 0",
            ("spark-batch:" + sink_id,),
        ).fetchone()
    except sqlite3.OperationalError:
        return 0  # tables not created yet
    finally:
        conn.close()
    return 0 if row is None else int(row[0])


def assert_exactly(rows: list[tuple[str, int, int]], expected: dict[tuple[str, int], int]) -> None:
    """Each partition holds offsets 0..n-1 exactly once (no loss, no duplicate, no gap)."""
    got: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in rows:
        got.setdefault((topic, partition), []).append(offset)
    assert sorted(got) == sorted(expected), f"partitions {sorted(got)} != {sorted(expected)}"
    for tp, n in expected.items():
        offsets = got[tp]
        assert len(offsets) == len(set(offsets)), f"{tp}: {len(offsets) - len(set(offsets))} dups"
        assert offsets == list(range(n)), f"{tp}: {len(offsets)} offsets, want 0..{n - 1}"


def wait_for(cond: Any, timeout: float, what: str, step: float = 0.2) -> None:
    """Poll ``cond`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)
