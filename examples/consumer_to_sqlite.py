"""Consume a topic into SQLite exactly once: rows and offsets in one transaction (SQLiteSink).

    python examples/consumer_to_sqlite.py              # embedded broker, seeds 1000 records
    python examples/consumer_to_sqlite.py --bootstrap localhost:9092 --topic app-logs \\
        --group archiver --db logs.db --idle-timeout 10

Stop it any time (Ctrl-C, or SIGKILL) and run it again: it resumes from the offsets
stored *in the database*, so every record is stored once. ``dedupe=True`` also drops
the duplicates an at-least-once producer may have sent (same ``logsdk.producer`` and
``logsdk.seq`` headers). It stops after ``--expect`` rows, after ``--idle-timeout``
seconds without a new row, or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
import time
from typing import Any

from logsdk import LogConsumer
from logsdk.sinks import SQLiteSink


def seed(bootstrap: str, topic: str, n: int, spool_dir: str) -> None:
    """Send n JSON log records with a LogProducer (for the self-contained run)."""
    from logsdk import LogProducer

    with LogProducer(bootstrap, topic, spool_dir) as p:
        for i in range(n):
            p.send({"level": ("INFO", "WARNING", "ERROR")[i % 3], "message": f"event {i}"})
        p.flush(30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", help="Kafka bootstrap servers (default: an embedded broker)")
    ap.add_argument("--topic", default="app-logs")
    ap.add_argument("--group", default="sqlite-archiver")
    ap.add_argument("--db", default="logs.db", help="SQLite file (default logs.db)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--expect", type=int, default=None, help="stop once the table has N rows")
    ap.add_argument("--idle-timeout", type=float, default=5.0, help="stop after S s without rows")
    ap.add_argument("-X", dest="kafka_config", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    conf: dict[str, Any] = dict(item.split("=", 1) for item in args.kafka_config)
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            import tempfile

            from logsdk.testing import EmbeddedBroker, create_topic

            broker = stack.enter_context(EmbeddedBroker())
            bootstrap = broker.bootstrap_servers
            conf = {**broker.client_config("consumer"), **conf}
            create_topic(bootstrap, args.topic, 3)
            seed(bootstrap, args.topic, 1000, stack.enter_context(tempfile.TemporaryDirectory()))
            args.expect = args.expect or 1000
        sink = stack.enter_context(SQLiteSink(args.db, dedupe=True))
        consumer = LogConsumer(
            bootstrap_servers=bootstrap,
            group_id=args.group,
            topics=[args.topic],
            handler=sink,
            semantics="exactly_once",
            workers=args.workers,
            kafka_config=conf,
        )
        before = sink.count()
        print(f"{args.db}: {before} row(s) before; consuming {args.topic} as {args.group}")
        with consumer, contextlib.suppress(KeyboardInterrupt):
            wait(consumer, sink, args.expect, args.idle_timeout)
        if consumer.error is not None:
            print(f"consumer stopped: {consumer.error}", file=sys.stderr)
            return 1
        rows, distinct = count(args.db, sink.table)
        print(f"{args.db}: {rows} row(s), {distinct} distinct (producer, seq); +{rows - before}")
        return 0 if rows == distinct else 1


def wait(consumer: LogConsumer, sink: SQLiteSink, expect: int | None, idle: float) -> None:
    """Until ``expect`` rows, or ``idle`` seconds without a new one once assigned."""
    deadline = time.monotonic() + 60
    while not consumer.stats()["assigned"]:  # a group join may take a few seconds
        if consumer.error is not None or time.monotonic() > deadline:
            return
        time.sleep(0.1)
    last, last_change = sink.count(), time.monotonic()
    while consumer.error is None:
        n = sink.count()
        if expect is not None and n >= expect:
            return
        if n != last:
            last, last_change = n, time.monotonic()
        elif time.monotonic() - last_change > idle:
            return
        time.sleep(0.1)


def count(db: str, table: str) -> tuple[int, int]:
    """Rows, and distinct (producer, seq) identities among them."""
    conn = sqlite3.connect(db)
    try:
        rows, distinct = conn.execute(
            f"SELECT count(*), count(DISTINCT producer || ':' || seq) FROM [{table}]"
        ).fetchone()
    finally:
        conn.close()
    return int(rows), int(distinct)


if __name__ == "__main__":
    sys.exit(main())
