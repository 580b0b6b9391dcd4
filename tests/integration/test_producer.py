"""LogProducer against a real broker: delivery, headers, bad input, spool, overflow, disk."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import sqlite3
import subprocess
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from logsdk import LogProducer
from logsdk.errors import (
    BufferFullError,
    ConfigError,
    RecordTooLargeError,
    SerializationError,
    SpoolError,
    SpoolFullError,
    SpoolLockedError,
)
from logsdk.integrations.logging import KafkaHandler
from logsdk.spool import Spool
from logsdk.testing import (
    EmbeddedBroker,
    check_delivery,
    create_topic,
    free_port,
    producer_hooks,
    read_topic,
)
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import FAST, InterruptAfterProduce, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.each_broker]


def test_delivers_everything_with_headers(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Every record arrives once, with logsdk.producer/logsdk.seq headers, in order."""
    topic = fresh_topic(3)
    with LogProducer(kafka.bootstrap_servers, topic, tmp_path) as p:
        for i in range(5000):
            p.send({"i": i}, key=str(i % 7), headers={"app": "test"})
        assert p.flush(30) == 0
        pid = p.producer_id
        assert p.stats()["acked"] == 5000
    msgs = read_topic(kafka.bootstrap_servers, topic)
    rep = check_delivery(msgs)
    assert rep.unique == 5000
    assert rep.duplicates == 0
    assert rep.missing(pid, range(5000)) == []
    assert rep.order_violations == 0
    assert ("app", b"test") in (msgs[0].headers() or [])


def test_value_types(kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path) -> None:
    """bytes, str and dict values are sent as bytes, UTF-8 and compact JSON."""
    topic = fresh_topic(1)
    with LogProducer(kafka.bootstrap_servers, topic, tmp_path) as p:
        p.send(b"raw")
        p.send("tëxt")
        p.send({"a": 1, "b": [1, 2]})
        assert p.flush(10) == 0
    values = [m.value() for m in read_topic(kafka.bootstrap_servers, topic)]
    assert values == [b"raw", "tëxt".encode(), b'{"a":1,"b":[1,2]}']


def test_unserialisable_value_raises_before_acceptance(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A set, an object or a dict holding one raises TypeError and is not counted as sent."""
    with LogProducer(kafka.bootstrap_servers, fresh_topic(1), tmp_path) as p:
        for bad in ({1, 2}, object(), {"x": object()}, 3.5):
            with pytest.raises(TypeError):
                p.send(bad)  # type: ignore[arg-type]
        with pytest.raises(SerializationError, match="reserved"):
            p.send("x", headers={"logsdk.seq": b"1"})
        # Kafka timestamps are int64 milliseconds: anything else is refused at send(),
        # not later by the spool or librdkafka, where it would stop the pump.
        for ts in (-1, 1 << 63, True, 1.5, "0"):
            with pytest.raises(ConfigError, match="timestamp"):
                p.send("x", timestamp=ts)  # type: ignore[arg-type]
        assert p.stats()["sent"] == 0


def test_record_too_large_is_rejected_and_rest_flows(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A record above message_max_bytes raises, is counted, and never blocks the others."""
    topic = fresh_topic(1)
    with LogProducer(kafka.bootstrap_servers, topic, tmp_path, message_max_bytes=10_000) as p:
        p.send("before")
        with pytest.raises(RecordTooLargeError, match="10000"):
            p.send(b"x" * 20_000)
        p.send("after")
        assert p.flush(10) == 0
        assert p.stats()["rejected"] == 1
        assert p.stats()["errors"]["record_too_large"] == 1
    got = [m.value() for m in read_topic(kafka.bootstrap_servers, topic)]
    assert got == [b"before", b"after"]


def test_in_flight_table_gives_every_ticket_back_and_is_reused(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The records in flight sit in a table of tickets (their delivery callbacks): once
    every report is in, every slot is empty and every ticket free, a record librdkafka
    refuses gives its ticket back at once, and a second burst reuses the table instead of
    growing it."""
    topic = fresh_topic(2)
    with LogProducer(
        kafka.bootstrap_servers,
        topic,
        tmp_path,
        kafka_config={"message.max.bytes": 5000},  # librdkafka's own limit, below the SDK's
    ) as p:
        for i in range(3000):
            p.send(b"first-%d" % i)
        assert p.flush(30) == 0
        hooks = producer_hooks(p)
        peak, free = hooks.ticket_table()
        assert 0 < peak <= 3000
        assert free == peak
        with pytest.raises(RecordTooLargeError, match="librdkafka refused"):
            p.send(b"x" * 8000)
        assert hooks.ticket_table() == (peak, peak)
        for i in range(peak):
            p.send(b"second-%d" % i)
        assert p.flush(30) == 0
        assert hooks.ticket_table() == (peak, peak)  # no ticket was made: the free ones served
        assert p.stats()["acked"] == 3000 + peak
    assert len(read_topic(kafka.bootstrap_servers, topic)) == 3000 + peak


def test_a_closed_producer_is_freed_without_the_cyclic_collector(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The ticket classes name their producer; close() lets go of it, so a closed producer
    and its in-flight table are freed by reference counting when the application drops
    it (before, only by a full collection: 100k tickets after a burst)."""
    topic = fresh_topic(1)
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for buffer in ("memory", "shm"):
            p = LogProducer(
                kafka.bootstrap_servers,
                topic,
                tmp_path / buffer,
                buffer=buffer,
            )
            try:
                for i in range(2000):
                    p.send(b"%d" % i)
                assert p.flush(30) == 0
                assert producer_hooks(p).ticket_table()[0] > 0
            finally:
                p.close()  # no fixture may hold it: the test drops its last reference
            gone = weakref.ref(p)
            del p
            assert gone() is None, f"buffer={buffer}: the closed producer is still referenced"
    finally:
        if enabled:
            gc.enable()
    assert len(read_topic(kafka.bootstrap_servers, topic)) == 4000


def test_an_interrupt_right_after_produce_never_reuses_the_seq(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A signal handler's exception (KeyboardInterrupt) surfaces in send() when a call
    returns, so it may come right after produce() handed the record to librdkafka: that
    record is delivered, so its seq must never serve the next record (the dedupe headers
    would then drop one of two different records). Injected at exactly that instant by a
    wrapper around the real client."""
    topic = fresh_topic(1)
    with LogProducer(kafka.bootstrap_servers, topic, tmp_path) as p:
        p.send(b"before")
        assert p.flush(30) == 0
        with (
            producer_hooks(p).client_wrapped(InterruptAfterProduce),
            pytest.raises(KeyboardInterrupt),
        ):
            p.send(b"interrupted")
        p.send(b"after")
        assert p.flush(30) == 0
    got = read_topic(kafka.bootstrap_servers, topic)
    seqs = {m.value(): dict(m.headers() or [])["logsdk.seq"] for m in got}
    assert set(seqs) == {b"before", b"interrupted", b"after"}  # handed over: delivered
    assert len(set(seqs.values())) == 3, seqs  # three records, three seqs


def test_second_producer_on_same_dir_takes_its_own_slot(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Two producers on one spool dir never share a spool: the second takes slot 1, with a
    producer id of its own; a Spool opened on a held slot gets SpoolLockedError."""
    topic = fresh_topic(1)
    with (
        LogProducer(kafka.bootstrap_servers, topic, tmp_path) as a,
        LogProducer(kafka.bootstrap_servers, topic, tmp_path) as b,
    ):
        assert (a.stats()["slot"], b.stats()["slot"]) == (0, 1)
        assert a.producer_id != b.producer_id
        with pytest.raises(SpoolLockedError, match=str(tmp_path)):
            Spool(tmp_path).open()


def test_corrupt_spool_producer_still_starts(
    kafka: KafkaTarget,
    fresh_topic: Callable[..., str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A corrupt spool file is moved aside, logged, and the producer works."""
    topic = fresh_topic(1)
    (tmp_path / "spool.db").write_bytes(b"\x00garbage" * 512)
    with caplog.at_level(logging.ERROR, logger="logsdk.spool"):
        p = LogProducer(kafka.bootstrap_servers, topic, tmp_path)
    with p:
        p.send("ok")
        assert p.flush(10) == 0
        assert p.stats()["spool_corrupt_files"] == 1
    assert "corrupt" in caplog.text
    assert list(tmp_path.glob("spool.db.corrupt-*"))
    assert len(read_topic(kafka.bootstrap_servers, topic)) == 1


def test_damage_at_rest_is_set_aside_and_every_readable_record_delivered(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A clean close lets the next open skip quick_check, so a page damaged while the
    spool sat closed (its mtime kept, as a disk error would) is found by the replay's read.
    The pump sets the file aside and rebuilds the spool from every row it can read: those
    are delivered, the ids it could not read are counted, and the producer keeps working
    (a record sent after it is delivered too)."""
    topic = fresh_topic(1)
    sp = Spool(tmp_path).open()
    sp.reserve_seq(2000)  # as a producer does before it uses a seq
    sp.append([(topic, None, bytes(1000), None, 1, i) for i in range(2000)])
    sp.close()
    db = tmp_path / "spool.db"
    st = db.stat()
    with db.open("r+b") as f:
        f.seek(st.st_size // 2 // 4096 * 4096)
        f.write(b"\xff" * 4096)  # one page in the middle of the table
    os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns))
    with LogProducer(kafka.bootstrap_servers, topic, tmp_path, **FAST) as p:
        p.send("accepted after the damage")
        assert p.flush(60) == 0
        s = p.stats()
    assert s["spool_corrupt_files"] == 1
    assert s["errors"]["spool_rebuilt"] == 1
    assert s["alarm"] is None
    aside = [
        f for f in tmp_path.glob("spool.db.corrupt-*") if not f.name.endswith(("-wal", "-shm"))
    ]
    assert len(aside) == 1, aside
    rep = check_delivery(read_topic(kafka.bootstrap_servers, topic))
    (pid,) = rep.seqs
    missing = rep.missing(pid, range(2001))
    assert 0 < len(missing) <= s["spool_unreadable"] < 20, (missing, s["spool_unreadable"])
    assert rep.unique == 2000 - len(missing) + 1
    assert rep.duplicates == 0


def _dead_bootstrap() -> tuple[str, int]:
    port = free_port()
    return f"127.0.0.1:{port}", port


def test_broker_down_whole_run_then_new_producer_delivers(
    broker_factory: Callable[..., EmbeddedBroker],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
) -> None:
    """With Kafka down throughout, close() leaves every record in the spool; a new
    producer on that dir delivers all of them once the broker is up, by its flush()."""
    bootstrap, port = _dead_bootstrap()
    p = make_producer(bootstrap, "down", tmp_path, **FAST)
    for i in range(3000):
        p.send(f"r{i}")
    pid = p.producer_id
    p.close(timeout=0)  # Kafka is down: no use waiting for it
    stats = p.stats()
    assert stats["state"] == "CLOSED"
    assert stats["spool_records"] == 3000
    assert stats["acked"] == 0
    # Every record handed to a client came back through its failed or purged report:
    # no ticket is still taken, no record still in the in-flight table.
    size, free = producer_hooks(p).ticket_table()
    assert free == size
    broker = broker_factory(port=port)
    create_topic(broker.bootstrap_servers, "down", 2)
    with LogProducer(broker.bootstrap_servers, "down", tmp_path, **FAST) as p2:
        assert p2.producer_id == pid
        assert p2.flush(30) == 0
        assert p2.stats()["replayed"] == 3000
    rep = check_delivery(read_topic(broker.bootstrap_servers, "down"))
    assert rep.missing(pid, range(3000)) == []
    assert rep.order_violations == 0


def test_every_field_arrives_as_sent_by_every_path(
    broker_factory: Callable[..., EmbeddedBroker],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
) -> None:
    """Key, value, headers and timestamp arrive as sent, whichever way the record went:
    spooled and replayed, straight to librdkafka, or queued behind it while its queue was
    full. (produce() is called with positional arguments on the hot paths: a wrong order
    would put a field in the wrong place, which only a record read back can show.)"""
    bootstrap, port = _dead_bootstrap()
    ts0 = 1_600_000_000_000

    def send(p: LogProducer, i: int) -> None:
        p.send(f"v{i}", key=f"k{i}", headers=[("app", f"h{i}")], timestamp=ts0 + i)

    p = make_producer(bootstrap, "fields", tmp_path, **FAST)
    for i in range(300):
        send(p, i)  # Kafka is down: these are replayed by the next producer
    pid = p.producer_id
    p.close(timeout=0)
    broker = broker_factory(port=port)
    create_topic(broker.bootstrap_servers, "fields", 2)
    # A librdkafka queue of 5 records: most live sends find it full and queue behind it.
    tiny = {**FAST, "kafka_config": {**FAST["kafka_config"], "queue.buffering.max.messages": 5}}
    with LogProducer(broker.bootstrap_servers, "fields", tmp_path, **tiny) as p2:
        wait_until(lambda: p2.stats()["spool_records"] == 0, 30, "the spool to drain")
        for i in range(300, 600):
            send(p2, i)
        assert p2.flush(30) == 0
        assert p2.stats()["replayed"] == 300
    msgs = read_topic(broker.bootstrap_servers, "fields")
    assert len(msgs) == 600
    seen, seqs = set(), set()
    for m in msgs:
        i = int((m.value() or b"")[1:])  # value b"v<i>"
        seen.add(i)
        assert m.key() == f"k{i}".encode()
        hdrs = m.headers() or []
        assert [h for h, _ in hdrs] == ["app", "logsdk.producer", "logsdk.seq"]
        assert hdrs[:2] == [("app", f"h{i}".encode()), ("logsdk.producer", pid.encode())]
        seqs.add(int(hdrs[2][1]))
        assert m.timestamp()[1] == ts0 + i
    assert seen == set(range(600))
    assert len(seqs) == 600


@pytest.mark.parametrize("policy", ["drop_newest", "drop_oldest", "raise", "block"])
def test_overflow_policies_count_every_record(
    broker_factory: Callable[..., EmbeddedBroker], tmp_path: Path, policy: str
) -> None:
    """With a tiny spool cap and Kafka down, sent = spooled + dropped (+ buffered); once
    Kafka is back, a new producer delivers what the spool kept: sent = acked + dropped."""
    bootstrap, port = _dead_bootstrap()
    refused = 0
    kw: dict[str, Any] = {**FAST, "spool_max_bytes": 40_000, "when_full": policy}
    kw["max_block_s"] = 0.2
    kw["buffer_max_records"] = 200
    p = LogProducer(bootstrap, "cap", tmp_path, **kw)
    try:
        for i in range(2000):
            try:
                p.send(b"x" * 100, key=str(i))
            except (SpoolFullError, BufferFullError):
                refused += 1
                if refused == 5:
                    break  # the policy is shown; "block" would wait max_block_s per record
        p.flush_durable(5)
        s = p.stats()
        assert s["sent"] + refused == (2000 if refused < 5 else i + 1)
        assert s["spool_bytes"] <= 40_000
        assert s["sent"] == s["spool_records"] + s["dropped"] + s["buffered"]
        if policy.startswith("drop"):
            assert s["dropped"] > 0
            assert refused == 0
        else:
            assert refused > 0
            assert s["dropped"] == 0
    finally:
        p.close(timeout=1.0)  # Kafka stays down: what memory holds cannot wait for it
    closed = p.stats()
    kept = closed["spool_records"]
    lost_on_close = closed["errors"].get("lost_on_close", 0)
    assert closed["sent"] == kept + closed["dropped"] + lost_on_close
    broker = broker_factory(port=port)
    create_topic(broker.bootstrap_servers, "cap", 1)
    with LogProducer(broker.bootstrap_servers, "cap", tmp_path, **FAST) as p2:
        assert p2.flush(30) == 0
        assert p2.stats()["acked"] == kept
    assert len(read_topic(broker.bootstrap_servers, "cap")) == kept
    assert closed["sent"] == kept + closed["dropped"] + lost_on_close


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root/CAP_SYS_ADMIN): {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_full_disk_keeps_records_in_memory_then_spools(
    broker_factory: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    """On a full disk the spool raises an alarm, records stay in memory (none lost, none
    reported durable), and everything is spooled, then delivered, once space returns."""
    bootstrap, port = _dead_bootstrap()
    with _tmpfs(tmp_path / "small", "400k") as spool_dir:
        p = LogProducer(bootstrap, "disk", spool_dir, **FAST)
        try:
            for i in range(1500):
                p.send(os.urandom(500), key=str(i))
            wait_until(lambda: p.stats()["alarm"] is not None, 20, "the disk-full alarm")
            s = p.stats()
            assert s["spooled"] < 1500
            assert s["spool_records"] == s["spooled"]
            assert s["buffered"] == 1500 - s["spooled"]
            assert s["errors"]["spool_io"] >= 1
            subprocess.run(["mount", "-o", "remount,size=16m", str(spool_dir)], check=True)
            # The pump clears the alarm right after the commit that spooled the last rows:
            # wait for both, not for the count alone.
            wait_until(
                lambda: p.stats()["spool_records"] == 1500 and p.stats()["alarm"] is None,
                20,
                "everything spooled, the alarm cleared",
            )
            broker = broker_factory(port=port)
            create_topic(broker.bootstrap_servers, "disk", 1, exist_ok=True)
            wait_until(lambda: p.stats()["acked"] == 1500, 30, "delivery after recovery")
        finally:
            p.close()
    rep = check_delivery(read_topic(broker.bootstrap_servers, "disk"))
    assert rep.unique == 1500


def test_replayed_record_kafka_refuses_is_set_aside_once_the_disk_works(
    broker_factory: Callable[..., EmbeddedBroker],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A spooled record Kafka refuses on replay (too large for this producer's
    ``message_max_bytes``) is moved to the rejected table; while the disk refuses that
    move (an injected ENOSPC, three times) the alarm is up and the row stays in custody.
    Then the move succeeds, the alarm clears, and the records around it are delivered."""
    bootstrap, port = _dead_bootstrap()
    big = b"x" * 50_000
    p = make_producer(bootstrap, "refused", tmp_path, message_max_bytes=100_000, **FAST)
    for value in (b"first", big, b"last"):
        p.send(value)
    p.close(timeout=0)
    calls = {"failed": 0}
    real = Spool.move_to_rejected

    def full_disk(self: Spool, pairs: Any) -> None:
        if calls["failed"] < 3:
            calls["failed"] += 1
            raise SpoolError("injected: [Errno 28] No space left on device")
        real(self, pairs)

    monkeypatch.setattr(Spool, "move_to_rejected", full_disk)
    broker = broker_factory(port=port)
    create_topic(broker.bootstrap_servers, "refused", 1, exist_ok=True)
    p = LogProducer(bootstrap, "refused", tmp_path, message_max_bytes=10_000, **FAST)
    try:
        wait_until(lambda: p.stats()["alarm"] is not None, 30, "the disk alarm")
        s = p.stats()
        assert s["spool_records"] >= 1  # the refused row is still in custody
        assert s["state"] == "RECOVERING"
        wait_until(
            lambda: (s := p.stats())["state"] == "ONLINE" and s["spool_records"] == 0,
            30,
            "the refused row set aside, the rest replayed",
        )
        s = p.stats()
        assert calls["failed"] == 3
        assert s["alarm"] is None
        assert s["rejected"] == 1  # counted once, however many times the move was retried
        assert s["errors"]["spool_io"] == 3
        assert s["replayed"] == 2
    finally:
        p.close()
    conn = sqlite3.connect(tmp_path / "spool.db")
    try:
        rows = conn.execute("SELECT value, error FROM rejected").fetchall()
    finally:
        conn.close()
    assert [v for v, _ in rows] == [big]
    assert "too large" in rows[0][1].lower() or "size" in rows[0][1].lower()
    got = [m.value() for m in read_topic(broker.bootstrap_servers, "refused")]
    assert got == [b"first", b"last"]


def test_partial_commit_to_a_full_spool_keeps_order_and_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records handed back by librdkafka, more than a capped spool can take, with the
    first append failing (an injected ENOSPC): no record is held twice (sent == spooled +
    buffered; before the fix the part that did not fit was put back twice: 18 + 84 for
    60), and the spool holds a prefix of them in send order. Records sent meanwhile are
    refused while the spool is full (``block``), so the backlog stays behind them."""
    bootstrap, _ = _dead_bootstrap()
    real = Spool.append_columns
    calls = {"n": 0}

    def first_fails(self: Spool, cols: Any, total_bytes: int | None = None) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise SpoolError("injected: [Errno 28] No space left on device")
        real(self, cols, total_bytes)

    monkeypatch.setattr(Spool, "append_columns", first_fails)
    p = LogProducer(bootstrap, "partial", tmp_path, spool_max_bytes=20_000, max_block_s=0.2, **FAST)
    try:
        for i in range(60):  # ONLINE: into librdkafka, handed back by the degrade
            p.send(b"%04d" % i + b"x" * 996)
        wait_until(lambda: p.stats()["alarm"] is not None, 30, "the injected disk error")
        tiny = 0
        for _ in range(20):  # DEGRADED: into the backlog behind the 60, or refused
            with contextlib.suppress(BufferFullError):  # when_full="block": spool full
                p.send(b"tiny")
                tiny += 1
        wait_until(
            lambda: (s := p.stats())["alarm"] is None and s["spool_records"] > 0,
            30,
            "the retried append",
        )
        s = p.stats()
        assert s["sent"] == 60 + tiny
        assert s["spooled"] + s["buffered"] == 60 + tiny, s
        conn = sqlite3.connect(tmp_path / "spool.db")
        try:
            seqs = [r[0] for r in conn.execute("SELECT seq FROM records ORDER BY id")]
        finally:
            conn.close()
        assert seqs == list(range(len(seqs))), seqs
        assert 0 < len(seqs) < 60
    finally:
        p.close(timeout=0)


def test_spool_survives_as_plain_sqlite(
    make_producer: Callable[..., LogProducer], tmp_path: Path
) -> None:
    """The spool is an ordinary SQLite file an operator can inspect."""
    bootstrap, _ = _dead_bootstrap()
    p = make_producer(bootstrap, "inspect", tmp_path, **FAST)
    p.send("hello")
    p.close(timeout=0)
    conn = sqlite3.connect(tmp_path / "spool.db")
    try:
        assert conn.execute("SELECT value FROM records").fetchall() == [(b"hello",)]
    finally:
        conn.close()


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_kafka_handler_writes_json_records(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path, background: bool
) -> None:
    """KafkaHandler sends timestamp, level, logger, message, exception, extra, host, pid;
    in background mode the same, with the message and traceback as they were at the call
    (the record's arguments are changed right after it)."""
    topic = fresh_topic(1)
    handler = KafkaHandler(
        bootstrap_servers=kafka.bootstrap_servers,
        topic=topic,
        spool_dir=tmp_path,
        background=background,
    )
    logger = logging.getLogger("app.handler-test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        who = ["world"]
        logger.info("hello %s", who, extra={"user": "ann"})
        who[0] = "changed after the call"
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
        handler.flush()
    finally:
        logger.removeHandler(handler)
        handler.close()
    docs = [json.loads(m.value() or b"") for m in read_topic(kafka.bootstrap_servers, topic)]
    assert [d["message"] for d in docs] == ["hello ['world']", "failed"]
    assert docs[0]["level"] == "INFO"
    assert docs[0]["logger"] == "app.handler-test"
    assert docs[0]["extra"] == {"user": "ann"}
    assert docs[0]["pid"] == os.getpid()
    assert docs[0]["host"]
    assert "ValueError: boom" in docs[1]["exception"]
    assert handler.dropped == 0


def test_secrets_never_logged(
    make_producer: Callable[..., LogProducer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A SASL password passed through kafka_config appears in no log line and no repr."""
    bootstrap, _ = _dead_bootstrap()
    with caplog.at_level(logging.DEBUG):
        p = make_producer(
            bootstrap,
            "secret",
            tmp_path,
            **{**FAST, "kafka_config": {"sasl.username": "u", "sasl.password": "hunter2"}},
        )
        p.send("x")
        assert "hunter2" not in repr(p)
        p.close(timeout=0)
    assert "hunter2" not in caplog.text


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_kafka_handler_emits_without_the_handler_lock_and_keeps_filters(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path, background: bool
) -> None:
    """KafkaHandler.handle() takes no handler lock (emit() is thread-safe): a log call goes
    through while another thread holds that lock. Filters still apply, and the SDK's own
    loggers are never shipped."""
    topic = fresh_topic(1)
    handler = KafkaHandler(
        bootstrap_servers=kafka.bootstrap_servers,
        topic=topic,
        spool_dir=tmp_path,
        background=background,
    )
    handler.addFilter(lambda r: "secret" not in r.getMessage())
    logger = logging.getLogger("app.lockless")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with handler.lock:  # type: ignore[union-attr]
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        assert held.wait(10)
        done = threading.Event()

        def log_lines() -> None:
            logger.info("kept")
            logger.info("a secret line")
            logging.getLogger("logsdk.anything").warning("the SDK's own line")
            handler.handle(logging.getLogger("logsdk").makeRecord(
                "logsdk", logging.WARNING, __file__, 1, "own", None, None))  # fmt: skip
            done.set()

        threading.Thread(target=log_lines).start()
        assert done.wait(10), "a log call waited for the handler's lock"
    finally:
        release.set()
        holder.join()
        logger.removeHandler(handler)
        handler.close()
    docs = [json.loads(m.value() or b"") for m in read_topic(kafka.bootstrap_servers, topic)]
    assert [d["message"] for d in docs] == ["kept"]
    assert handler.dropped == 0


_LEFT_OPEN = """
import sys
from logsdk import LogProducer
bootstrap, topic, spool, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
p = LogProducer(bootstrap, topic, spool)
for i in range(n):
    p.send(b"%d" % i)
print("sent", flush=True)
"""


def test_a_producer_left_open_delivers_at_exit_and_says_it_was_open(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A script that sends 20k records and exits without closing its LogProducer: the exit
    closes it (the records go to Kafka, none lost with the process's memory) and a warning
    says it was left open. With Kafka unreachable, the exit takes its 5 s budget at most
    and the records wait in the spool, where the next producer finds them."""
    import sys
    import time

    topic = fresh_topic(2)
    out = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN, kafka.bootstrap_servers, topic,
         str(tmp_path / "up"), "20000"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "was still open at exit" in out.stderr
    rep = check_delivery(read_topic(kafka.bootstrap_servers, topic))
    assert rep.unique == 20_000  # at least once: a copy is possible, a loss is not

    bootstrap, _ = _dead_bootstrap()
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN, bootstrap, topic, str(tmp_path / "down"), "3000"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    assert "was still open at exit" in out.stderr
    assert "3000 record(s) not delivered" in out.stderr
    assert took < 30, took  # the exit's budget is 5 s; start-up and the spool's commit aside
    spool = Spool(tmp_path / "down").open()
    try:
        assert spool.count == 3000
    finally:
        spool.close()
