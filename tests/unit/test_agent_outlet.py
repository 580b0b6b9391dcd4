"""``LogProducer(delivery="agent")`` without a broker: send() only writes the ring, a reader
standing in for the agent takes the records, flush()/close() wait for it and say what is
left, and a forked child writes a ring of its own."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.errors import BufferFullError
from logsdk.integrations.logging import KafkaHandler
from logsdk.shm._reader import RingReader, ring_names
from tests.conftest import exit_codes

# Nothing listens here: a client made by mistake would only fail to connect.
NOWHERE = "127.0.0.1:1"


def producer(tmp_path: Path, **kw: object) -> LogProducer:
    return LogProducer(NOWHERE, "logs", tmp_path, delivery="agent", **kw)  # type: ignore[arg-type]


def take_all(reader: RingReader) -> list[tuple[int, tuple]]:  # type: ignore[type-arg]
    return reader.take(1_000_000, alive=reader.writer_alive())


def test_send_writes_only_the_ring_no_thread_no_file_no_client(tmp_path: Path) -> None:
    """No thread, no file under spool_dir, and the records in the ring with their seqs."""
    before = threading.active_count()
    p = producer(tmp_path)
    try:
        for i in range(100):
            p.send(b"v%d" % i, key=b"k")
        assert threading.active_count() == before
        assert list(tmp_path.iterdir()) == []
        [name] = ring_names(tmp_path)
        reader = RingReader(name)
        try:
            assert reader.producer_id == p.producer_id
            got = take_all(reader)
            assert [r[5] for _, r in got] == list(range(100))
            assert got[7][1][2] == b"v7"
        finally:
            reader.close()
        assert p.stats()["sent"] == 100
    finally:
        p.close(0)


def test_flush_waits_for_the_agent_and_says_what_is_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without an agent flush() returns what is left and warns; once a reader settled
    everything, flush() returns 0 and close() unlinks the ring."""
    caplog.set_level(logging.WARNING, "logsdk")
    p = producer(tmp_path)
    assert "no logsdk agent drains spool root" in caplog.text
    for i in range(10):
        p.send(b"x%d" % i)
    assert p.flush(0.05) == 10
    [name] = ring_names(tmp_path)
    reader = RingReader(name)
    try:
        reader.settle([pos for pos, _ in take_all(reader)])
        assert p.flush(1.0) == 0
    finally:
        reader.close()
    p.close(1.0)
    assert ring_names(tmp_path) == []


def test_close_with_records_left_keeps_the_ring_for_the_agent(tmp_path: Path) -> None:
    """close() with no agent: the ring stays, with every record, for the agent."""
    p = producer(tmp_path)
    for i in range(5):
        p.send(b"y%d" % i)
    p.close(0.05)
    [name] = ring_names(tmp_path)
    reader = RingReader(name)
    try:
        assert not reader.writer_alive()
        assert [r[5] for _, r in reader.take(100, alive=False)] == [0, 1, 2, 3, 4]
    finally:
        reader.close()
        reader.unlink()


def fill(p: LogProducer) -> int:
    """Send until the ring refuses (``when_full="raise"``): how many were accepted."""
    for n in range(10_000):
        try:
            p.send(b"z" * 200)
        except BufferFullError:
            return n
    raise AssertionError("the ring never filled up")


def test_a_full_ring_follows_when_full(tmp_path: Path) -> None:
    """No agent, a small ring: drop_newest counts drops, raise raises."""
    p = producer(tmp_path, shm_bytes=64 * 1024, when_full="drop_newest")
    q = producer(tmp_path, shm_bytes=64 * 1024, when_full="raise")
    try:
        for _ in range(300):
            p.send(b"z" * 200)
        assert p.stats()["dropped"] > 0
        assert 200 < fill(q) < 300  # 64 KiB hold about 280 frames of 200 bytes
    finally:
        for x in (p, q):
            x.close(0)
        for name in ring_names(tmp_path):
            r = RingReader(name)
            r.close()
            r.unlink()


def test_a_forked_child_writes_a_ring_and_an_id_of_its_own(tmp_path: Path) -> None:
    """The child's records go to a new ring under a new producer id; the parent's ring
    holds only the parent's."""
    p = producer(tmp_path)
    p.send(b"parent")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            p.send(b"child")
            code = 0 if p.producer_id not in ("", None) else 1
            p.close(0)
        finally:
            os._exit(code)
    assert exit_codes([pid], 10) == [0]
    names = ring_names(tmp_path)
    assert len(names) == 2
    values = {}
    for name in names:
        r = RingReader(name)
        try:
            values[r.producer_id] = [row[2] for _, row in r.take(10, alive=False)]
        finally:
            r.close()
    assert values[p.producer_id] == [b"parent"]
    assert sorted(values.values()) == [[b"child"], [b"parent"]]
    p.close(0)
    for name in ring_names(tmp_path):
        r = RingReader(name)
        r.close()
        r.unlink()


def test_the_logging_handler_passes_delivery_through(tmp_path: Path) -> None:
    """KafkaHandler(delivery="agent") owns an agent-mode producer."""
    h = KafkaHandler(
        bootstrap_servers=NOWHERE,
        topic="logs",
        spool_dir=tmp_path,
        delivery="agent",
        close_timeout=0.1,
        flush_timeout=0.1,
    )
    try:
        assert h.producer.config.delivery == "agent"
        h.emit(logging.LogRecord("app", logging.INFO, __file__, 1, "hello", None, None))
        [name] = ring_names(tmp_path)
        r = RingReader(name)
        try:
            [(_, row)] = take_all(r)
            assert b"hello" in (row[2] or b"")
        finally:
            r.close()
    finally:
        h.close()
        for name in ring_names(tmp_path):
            r = RingReader(name)
            r.close()
            r.unlink()


def test_the_structlog_and_loguru_adapters_pass_delivery_through(tmp_path: Path) -> None:
    """KafkaProcessor and KafkaSink own an agent-mode producer when given delivery="agent"."""
    from logsdk.integrations.loguru import KafkaSink
    from logsdk.integrations.structlog import KafkaProcessor

    kw = {"bootstrap_servers": NOWHERE, "spool_dir": tmp_path, "delivery": "agent"}
    proc = KafkaProcessor(topic="a", close_timeout=0.1, **kw)
    sink = KafkaSink(topic="b", close_timeout=0.1, **kw)
    try:
        assert proc.producer.config.delivery == "agent"
        assert sink.producer.config.delivery == "agent"
        proc.send({"event": "hi", "logger": "app"})
        topics = set()
        for name in ring_names(tmp_path):
            r = RingReader(name)
            try:
                topics |= {row[0] for _, row in take_all(r)}
            finally:
                r.close()
        assert topics == {"a"}
    finally:
        proc.close()
        sink.stop()
        for name in ring_names(tmp_path):
            r = RingReader(name)
            r.close()
            r.unlink()


def test_a_process_that_exits_without_close_leaves_its_records_in_the_ring(
    tmp_path: Path,
) -> None:
    """No close(), no agent: the exit waits at most about a second, and the ring keeps every
    record for the agent."""
    import subprocess
    import sys
    import time

    code = (
        "import sys\nfrom logsdk import LogProducer\n"
        "p = LogProducer('127.0.0.1:1', 'logs', sys.argv[1], delivery='agent')\n"
        "for i in range(5):\n    p.send(b'%d' % i)\n"
    )
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=30)
    assert time.monotonic() - t0 < 10
    [name] = ring_names(tmp_path)
    r = RingReader(name)
    try:
        assert [row[5] for _, row in r.take(10, alive=r.writer_alive())] == [0, 1, 2, 3, 4]
    finally:
        r.close()
        r.unlink()
