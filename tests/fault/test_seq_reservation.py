"""Seq reservations crossed while records are spooled and replayed: none refused, none lost,
no seq naming two records.

Seqs are reserved on disk in blocks, by the pump, ahead of need (logsdk.producer._identity).
A review found send() reserving them on its own thread, on the SQLite connection the pump
was writing: once per block while spooling, accepted records vanished. These tests cross
the block boundary: hundreds of times with a small block (``LOGSDK_TEST_SEQ_BLOCK``) while
the network is cut and healed, and once at the real block size (2^20) with Kafka
unreachable for the whole run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from logsdk import LogProducer
from logsdk.producer._identity import _SEQ_BLOCK, ENV_SEQ_BLOCK
from logsdk.testing import EmbeddedBroker, create_topic, free_port, read_topic
from logsdk.testing._check import identity
from tests.conftest import FAST, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]

BrokerFactory = Callable[..., EmbeddedBroker]


def _values_by_identity(
    bootstrap: str, topic: str, timeout: float
) -> dict[tuple[str, int], set[bytes]]:
    """Every (producer, seq) in ``topic`` with the set of values its copies carry."""
    seen: dict[tuple[str, int], set[bytes]] = defaultdict(set)
    for msg in read_topic(bootstrap, topic, timeout=timeout):
        ident = identity(msg)
        assert ident is not None, "a record without the logsdk headers"
        seen[ident].add(msg.value() or b"")
    return seen


def test_small_blocks_crossed_hundreds_of_times_during_cuts(
    broker_factory: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of 64 seqs; 4 threads send 25,000 records each while the network is cut
    twice (records spooled, then replayed), another thread calls flush() throughout and
    a third closes the producer: no send refused, every accepted record in Kafka, and
    each (producer, seq) names one record only (its copies all carry one value)."""
    monkeypatch.setenv(ENV_SEQ_BLOCK, "64")
    broker = broker_factory(durable=True, proxy=True)
    topic = create_topic(broker.bootstrap_servers, "reservations", 3)
    p = LogProducer(broker.bootstrap_servers, topic, tmp_path, **FAST)
    per_thread, threads = 25_000, 4
    refused: list[BaseException] = []
    sending = threading.Event()
    sending.set()

    def sender(t: int) -> None:
        try:
            for i in range(per_thread):
                p.send(b"%d-%d" % (t, i), key=b"%d" % (i % 24))
                if i % 500 == 0:
                    time.sleep(0.01)  # about 2 s of sending per thread, across the cuts
        except BaseException as exc:  # every refusal is a failure of the test
            refused.append(exc)

    flushes: list[int] = []

    def flusher() -> None:
        while sending.is_set():
            flushes.append(p.flush(0.5))

    workers = [threading.Thread(target=sender, args=(t,)) for t in range(threads)]
    fl = threading.Thread(target=flusher)
    try:
        for w in [*workers, fl]:
            w.start()
        # Two cuts while the senders run: records go to the spool, then are replayed
        # while the senders go on (RECOVERING), and again.
        for _ in range(2):
            wait_until(lambda: p.stats()["sent"] > 0, 30, "sending started")
            broker.cut()
            wait_until(lambda: p.stats()["state"] == "DEGRADED", 30, "degraded by the cut")
            wait_until(lambda: p.stats()["spooled"] > 0, 30, "records spooled")
            broker.heal()
            wait_until(lambda: p.stats()["state"] != "DEGRADED", 60, "recovering")
        for w in workers:
            w.join(120)
        sending.clear()
        fl.join(120)
        stats = p.stats()
        closer = threading.Thread(target=p.close, args=(60,))
        closer.start()
        closer.join(90)
        assert not closer.is_alive()
    finally:
        sending.clear()
        p.close(5)
    accepted = per_thread * threads
    assert refused == []
    assert stats["sent"] == accepted
    assert stats["dropped"] == 0
    assert stats["rejected"] == 0
    assert stats["spooled"] > 0, stats
    assert stats["replayed"] > 0, stats
    # 100,000 records, 64 seqs a block: over 1,500 reservations crossed.
    assert stats["next_seq"] >= accepted
    final = p.stats()
    assert final["undelivered"] == 0, final
    seen = _values_by_identity(broker.bootstrap_servers, topic, timeout=120)
    twice = {k: v for k, v in seen.items() if len(v) != 1}
    assert twice == {}, f"seqs naming two records: {list(twice.items())[:5]}"
    values = {v for vs in seen.values() for v in vs}
    expected = {b"%d-%d" % (t, i) for t in range(threads) for i in range(per_thread)}
    assert values == expected, f"missing {len(expected - values)}"
    assert len(seen) == accepted


def test_more_than_a_block_spooled_with_kafka_unreachable_then_delivered_once(
    broker_factory: BrokerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """1.1M records (more than one reservation of 2^20 seqs) through a producer whose
    Kafka is unreachable for the whole run, then close(5): none refused, all 1.1M in the
    spool and close() says so. The next producer on the spool_dir delivers every one,
    once."""
    n = 1_100_000
    assert n > _SEQ_BLOCK
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens there
    p = LogProducer(nowhere, "reservations", tmp_path, **FAST)
    try:
        for i in range(n):
            p.send(b"%d" % i)
        stats = p.stats()
    finally:
        with caplog.at_level(logging.WARNING, logger="logsdk.producer"):
            p.close(5)
    assert stats["sent"] == n
    assert stats["dropped"] == 0
    assert stats["rejected"] == 0
    assert stats["seq_waits"] == 0
    final = p.stats()
    assert final["spool_records"] == n, final
    assert final["errors"].get("lost_on_close", 0) == 0, final
    kept = [r.getMessage() for r in caplog.records if "kept in the spool" in r.getMessage()]
    assert kept, "close() did not say where the records are"
    assert kept[-1].startswith(f"close(): {n} record(s) not delivered"), kept
    assert not [r for r in caplog.records if "lost" in r.getMessage()]

    broker = broker_factory()
    topic = create_topic(broker.bootstrap_servers, "reservations", 3)
    with LogProducer(broker.bootstrap_servers, topic, tmp_path, **FAST) as p2:
        assert p2.stats()["recovered_at_start"] == n
        assert p2.flush(600) == 0
    seen = _values_by_identity(broker.bootstrap_servers, topic, timeout=300)
    assert len(seen) == n
    assert all(len(v) == 1 for v in seen.values())
    assert {int(next(iter(v))) for v in seen.values()} == set(range(n))
    pids = {pid for pid, _ in seen}
    assert len(pids) == 1
    seqs = sorted(s for _, s in seen)
    assert seqs == list(range(n))
