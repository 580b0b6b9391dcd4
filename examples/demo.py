"""`make demo`: the whole pipeline on the embedded broker, with faults, counted end to end.

1. A LogProducer sends JSON log records while the (durable) embedded broker is
   SIGKILLed and restarted: records go to the spool while it is down and are
   replayed when it is back. A live line shows state, sent, acked, spooled, replayed.
2. A LogConsumer (exactly-once into SQLite, in a child process) reads them; the child
   is SIGKILLed midway and restarted.
3. A plain confluent-kafka reader and the SQLite sink are counted: every record the
   producer accepted must be there, and the sink must hold each exactly once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RECORDS = 20_000
TOPIC = "demo-logs"


def _progress(p: object, stop: threading.Event) -> None:
    from logsdk import LogProducer

    assert isinstance(p, LogProducer)
    tty = sys.stdout.isatty()  # a live line on a terminal, one line a second in a log
    while not stop.wait(0.2 if tty else 1.0):
        s = p.stats()
        print(
            f"{chr(13) if tty else ''}  state={s['state']:<10} sent={s['sent']:>6} "
            f"acked={s['acked']:>6} spooled={s['spooled']:>6} replayed={s['replayed']:>6}",
            end="" if tty else "\n",
            flush=True,
        )


def produce(bootstrap: str, broker: object, spool: Path) -> dict[str, object]:
    """Send RECORDS JSON records, killing the broker at 30% and restarting it 2 s later."""
    from logsdk import LogProducer
    from logsdk.testing import EmbeddedBroker

    assert isinstance(broker, EmbeddedBroker)
    print(f"[1/3] producing {RECORDS} records; the broker is SIGKILLed at 30%, back 2 s later")
    p = LogProducer(bootstrap, TOPIC, spool, stall_timeout_s=3, probe_interval_s=0.2)
    stop = threading.Event()
    ticker = threading.Thread(target=_progress, args=(p, stop), daemon=True)
    ticker.start()
    restart: threading.Timer | None = None
    try:
        for i in range(RECORDS):
            if i == RECORDS * 3 // 10:
                broker.kill()
                restart = threading.Timer(2.0, broker.restart)
                restart.start()
            level = ("INFO", "WARNING", "ERROR")[i % 3]
            p.send({"level": level, "logger": "demo", "message": f"record {i}", "n": i})
            if i % 500 == 0:
                time.sleep(0.1)  # a steady trickle, so the outage lands mid-stream
        if restart is not None:
            restart.join()
        # flush() means "in Kafka": it replays the spool now and returns 0 once Kafka
        # holds every record (close() would do the same within its own timeout).
        left = p.flush(60)
        if left:
            print(f"      flush(): {left} record(s) not yet in Kafka after 60 s")
    finally:
        stop.set()
        ticker.join()
        p.close()
    stats = p.stats()
    if sys.stdout.isatty():
        print()
    return stats


_CHILD = """
import signal, sys
from logsdk import LogConsumer
from logsdk.sinks import SQLiteSink
c = LogConsumer(sys.argv[1], "demo", [sys.argv[2]], SQLiteSink(sys.argv[3], dedupe=True),
                semantics="exactly_once", workers=2,
                kafka_config={"session.timeout.ms": 2000, "heartbeat.interval.ms": 300})
c.run()
"""


def _sink_counts(db: Path) -> tuple[int, int]:
    """(rows, distinct (producer, seq)) in the sink; (0, 0) before it exists."""
    if not db.exists():
        return 0, 0
    conn = sqlite3.connect(db, timeout=30)
    try:
        rows, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT producer || ':' || seq) FROM records"
        ).fetchone()
        return int(rows), int(distinct)
    except sqlite3.OperationalError:
        return 0, 0  # the table is not created yet
    finally:
        conn.close()


def consume(bootstrap: str, db: Path, expected: int) -> tuple[int, int, int]:
    """Run the consumer child, SIGKILL it once midway, restart it; wait for all rows."""
    print("[2/3] consuming exactly-once into SQLite; the consumer is SIGKILLed midway")
    cmd = [sys.executable, "-c", _CHILD, bootstrap, TOPIC, str(db)]
    kills = 0
    child = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows, _ = _sink_counts(db)
            if kills == 0 and rows >= expected // 3:
                child.send_signal(signal.SIGKILL)
                child.wait(10)
                kills += 1
                print(f"  consumer SIGKILLed with {rows} rows stored; restarting it")
                child = subprocess.Popen(cmd)
            if rows >= expected:
                break
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)
    rows, distinct = _sink_counts(db)
    return rows, distinct, kills


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.parse_args()
    logging.basicConfig(level=logging.ERROR, format="  %(name)s: %(message)s")
    # The client's own connection errors while the broker is down are expected here.
    logging.getLogger("logsdk.librdkafka").setLevel(logging.CRITICAL)
    from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, read_topic

    work = Path(tempfile.mkdtemp(prefix="logsdk-demo-"))
    t0 = time.monotonic()
    with EmbeddedBroker(durable=True) as broker:
        bootstrap = broker.bootstrap_servers
        print(f"embedded broker (durable) at {bootstrap}; work dir {work}")
        create_topic(bootstrap, TOPIC, 3)
        ps = produce(bootstrap, broker, work / "spool")
        print(
            f"  producer: sent={ps['sent']} acked={ps['acked']} spooled={ps['spooled']} "
            f"replayed={ps['replayed']} dropped={ps['dropped']} state={ps['state']}"
        )
        rows, distinct, kills = consume(bootstrap, work / "sink.db", int(str(ps["sent"])))
        print("[3/3] counting with a plain confluent-kafka reader")
        report = check_delivery(read_topic(bootstrap, TOPIC))
        pid = str(ps["producer_id"])
        lost = len(report.missing(pid, range(int(str(ps["sent"])))))
    print()
    print("summary")
    print(f"  records sent            {ps['sent']}")
    print(f"  spooled while down      {ps['spooled']}")
    print(f"  replayed from spool     {ps['replayed']}")
    print(f"  in Kafka (unique)       {report.unique}  (+{report.duplicates} wire duplicates)")
    print(f"  consumed into SQLite    {distinct}  (consumer SIGKILLed {kills}x)")
    print(f"  duplicates in SQLite    {rows - distinct}")
    print(f"  lost                    {lost + (int(str(ps['sent'])) - distinct)}")
    print(f"  order violations        {report.order_violations}")
    print(f"  took {time.monotonic() - t0:.1f}s")
    ok = (
        lost == 0
        and distinct == ps["sent"]
        and rows == distinct
        and report.order_violations == 0
        and ps["dropped"] == 0
    )
    print("OK: nothing lost, nothing repeated" if ok else "FAILED: see the counts above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
