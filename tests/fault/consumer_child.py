"""The consumer process of the kill tests.

``python consumer_child.py MODE BOOTSTRAP TOPIC GROUP DB [REBALANCE [RATE]]``

MODE ``alo``: at-least-once; the handler appends every processed (partition, offset) to
the SQLite file DB (one transaction per batch), duplicates included.
MODE ``eos``: exactly-once into SQLiteSink(DB), with a handler that fails at random.
REBALANCE: LogConsumer's ``rebalance`` (its default when left out). RATE: eos only, at most
this many records a second per worker (the handler takes that long), so that a run of
records outlasts the group changes a test makes.
Runs until SIGTERM (graceful: then prints its ``stats()`` as one JSON line) or SIGKILL;
SIGUSR1 writes every thread's stack to stderr.
"""

from __future__ import annotations

import faulthandler
import json
import random
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

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
    rate = 0.0  # records/s per worker: 0 is as fast as it goes

    def process(self, records: Sequence[Record]) -> None:
        if self.rng.random() < 0.05:
            raise RuntimeError("random handler failure in process")
        if self.rate:
            time.sleep(len(records) / self.rate)
        super().process(records)

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.rng.random() < 0.03:
            raise RuntimeError("random handler failure in commit")
        super().commit(offsets)


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # a test dumps a stuck member's threads
    mode, bootstrap, topic, group, db = sys.argv[1:6]
    options: dict[str, Any] = {}
    if len(sys.argv) > 6:
        options["rebalance"] = sys.argv[6]
    # Under the consumer group protocol the broker sets the session's timings.
    kafka_config: dict[str, str | int] = (
        {}
        if options.get("rebalance") == "consumer"
        else {"session.timeout.ms": 2000, "heartbeat.interval.ms": 300}
    )
    if mode == "alo":
        handler: object = Progress(db)
        semantics = "at_least_once"
    else:
        sink = FlakySink(db)
        if len(sys.argv) > 7:
            sink.rate = float(sys.argv[7])
        handler = sink
        semantics = "exactly_once"
    consumer = LogConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        topics=[topic],
        handler=handler,  # type: ignore[arg-type]
        semantics=semantics,
        workers=4,
        max_retries=50,
        retry_backoff=0.005,
        kafka_config=kafka_config,
        **options,
    )
    consumer.run()
    print(json.dumps(consumer.stats()), flush=True)


if __name__ == "__main__":
    main()
