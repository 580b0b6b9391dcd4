"""The consumer process of the kill tests.

``python consumer_child.py MODE BOOTSTRAP TOPIC GROUP DB``

MODE ``alo``: at-least-once; the handler appends every processed (partition, offset) to
the SQLite file DB (one transaction per batch), duplicates included.
MODE ``eos``: exactly-once into SQLiteSink(DB), with a handler that fails at random.
Runs until SIGTERM (graceful) or SIGKILL.
"""

from __future__ import annotations

import random
import sqlite3
import sys
import threading
import time
from collections.abc import Sequence

from logsdk import LogConsumer, Record
from logsdk.consumer import TopicPartition
from logsdk.sinks import SQLiteSink


class Progress:
    """At-least-once handler: records what it processed in a SQLite file."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS processed (partition INT, offset INT)")
        self.lock = threading.Lock()

    def process(self, records: Sequence[Record]) -> None:
        rows = [(r.partition, r.offset) for r in records]
        with self.lock:
            self.conn.execute("BEGIN")
            self.conn.executemany("INSERT INTO processed VALUES (?, ?)", rows)
            self.conn.execute("COMMIT")
        # At most ~25k records/s per worker: the run must outlast the test's two kills
        # on a fast, idle machine too (the kills land at 1/3 and 2/3 of the records).
        time.sleep(len(rows) / 25_000)


class FlakySink(SQLiteSink):
    """SQLiteSink whose process() and commit() fail at random (before writing anything)."""

    rng = random.Random()

    def process(self, records: Sequence[Record]) -> None:
        if self.rng.random() < 0.05:
            raise RuntimeError("random handler failure in process")
        super().process(records)

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.rng.random() < 0.03:
            raise RuntimeError("random handler failure in commit")
        super().commit(offsets)


def main() -> None:
    mode, bootstrap, topic, group, db = sys.argv[1:6]
    kafka_config = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 300}
    if mode == "alo":
        handler: object = Progress(db)
        semantics = "at_least_once"
    else:
        handler = FlakySink(db)
        semantics = "exactly_once"
    LogConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        topics=[topic],
        handler=handler,  # type: ignore[arg-type]
        semantics=semantics,
        workers=4,
        max_retries=50,
        retry_backoff=0.005,
        kafka_config=kafka_config,
    ).run()


if __name__ == "__main__":
    main()
