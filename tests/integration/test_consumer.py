"""LogConsumer against a real broker: backpressure, key ordering, poison records, rebalances."""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from logsdk import LogConsumer, Record
from logsdk.errors import PoisonRecordError
from logsdk.sinks import SQLiteSink
from logsdk.testing import read_topic
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.consumer_helpers import produce, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.each_broker]


class Collect:
    """Records what it processed; ``delay`` s per record for the first ``slow`` records."""

    def __init__(self, delay: float = 0.0, slow: int = 0) -> None:
        self.delay = delay
        self.slow = slow
        self.lock = threading.Lock()
        self.seen: list[tuple[int, int]] = []
        self.sizes: list[int] = []  # records per call

    def process(self, records: Sequence[Record]) -> None:
        if self.delay:
            time.sleep(self.delay * len(records) * (1 if self.count() < self.slow else 0.05))
        with self.lock:
            self.seen.extend((r.partition, r.offset) for r in records)
            self.sizes.append(len(records))

    def count(self) -> int:
        with self.lock:
            return len(self.seen)


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"{field} not in /proc/self/status")


def test_backpressure_bounds_queue_and_memory(
    kafka: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """A slow handler: queue depth stays within queue_size, RSS bounded, member never leaves."""
    # The mock cluster keeps about 5 MiB of a partition and needs a session timeout over
    # 3 s (max.poll.interval.ms may not be below it): 16 partitions and 4 s there.
    partitions, max_poll_ms = (16, 4000) if kafka.kind == "mock" else (3, 3000)
    topic = fresh_topic(partitions)
    n, value_bytes, queue_size = 1800, 32 * 1024, 200
    produce(
        kafka.client_config("producer"), topic, n, partitions=partitions, value_bytes=value_bytes
    )
    # Slow at first (~100 records/s: the queue stays full, partitions get paused),
    # then fast enough to pass 56 MiB through quickly.
    handler = Collect(delay=0.02, slow=500)
    rss_before = _vm("VmRSS")
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter
    config = {**kafka.client_config("consumer"), "max.poll.interval.ms": max_poll_ms}
    c = LogConsumer(
        group_id=f"bp-{topic}",
        topics=[topic],
        handler=handler,
        workers=2,
        queue_size=queue_size,
        queue_bytes=8 * 1024 * 1024,
        max_batch=20,
        kafka_config=config,
    )
    depths, rss = [], []
    started = time.monotonic()
    with c:
        deadline = time.monotonic() + 60
        while handler.count() < n and time.monotonic() < deadline:
            depths.append(c.stats()["queue_depth"])
            rss.append(_vm("VmRSS"))
            time.sleep(0.02)
        stats = c.stats()
    elapsed = time.monotonic() - started
    assert handler.count() >= n
    assert len(set(handler.seen)) == n
    # The run outlasted max.poll.interval.ms, yet the member stayed in the group.
    assert elapsed > max_poll_ms / 1000
    assert stats["assignments"] == 1
    assert stats["revocations"] == 0
    assert stats["lost"] == 0
    assert stats["paused"] >= 2
    assert stats["resumed"] >= 2
    assert max(depths) <= queue_size
    assert stats["max_queue_depth"] <= queue_size
    # 1800 x 32 KiB = 56 MiB went through; the bound is 200 x 32 KiB queued plus
    # librdkafka's prefetch (4 MiB here) and its fetch buffers, well under half of it.
    # Each further broker adds a librdkafka thread whose fetch buffers live in a glibc
    # arena of its own, which keeps freed pages: on the 3-broker mock cluster the growth
    # was 21.5-25.3 MiB (11.3 with MALLOC_ARENA_MAX=1), on one broker 15.2.
    brokers = kafka.mock.brokers if kafka.mock is not None else 1
    bound = (24 + 4 * (brokers - 1)) * 1024 * 1024
    growth = max(max(rss), _vm("VmHWM")) - rss_before
    assert growth < bound, f"peak RSS grew by {growth / 2**20:.1f} MiB ({brokers} brokers)"


def test_byte_bound_holds_with_large_records(
    kafka: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """64 KiB records, a 2 MiB byte bound far below the record bound, a slow handler:
    the queue never holds more than the byte bound plus one record."""
    topic = fresh_topic(1)
    # The mock cluster keeps about the last 5 MiB of a partition: 70 records there (4.4 MiB,
    # still over twice the byte bound), 300 (19 MiB) on the embedded broker.
    n = 70 if kafka.kind == "mock" else 300
    value_bytes, queue_bytes = 64 * 1024, 2 * 1024 * 1024
    produce(kafka.client_config("producer"), topic, n, partitions=1, value_bytes=value_bytes)
    handler = Collect(delay=0.005)
    c = LogConsumer(
        group_id=f"bytes-{topic}",
        topics=[topic],
        handler=handler,
        workers=1,
        queue_size=10_000,
        queue_bytes=queue_bytes,
        max_batch=4,
        kafka_config=kafka.client_config("consumer"),
    )
    with c:
        wait_until(lambda: handler.count() >= n, 60, "every record handled", step=0.05)
        stats = c.stats()
    assert sorted(handler.seen) == [(0, o) for o in range(n)]  # each once, none lost
    record = value_bytes + 8  # the value plus its "seq:" prefix
    assert stats["max_queue_bytes"] > queue_bytes // 2  # the bound was reached, not idle
    assert stats["max_queue_bytes"] <= queue_bytes + record, stats["max_queue_bytes"]


@pytest.mark.parametrize("ordering", ["partition", "none"])
def test_no_handler_call_gets_more_than_max_batch(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], ordering: str
) -> None:
    """One partition polled 1000 records at a time, max_batch=7: every call gets at most 7
    records (a poll's run is queued as several chunks), and all arrive once, in order."""
    topic = fresh_topic(1)
    n = 3000
    produce(kafka.client_config("producer"), topic, n, partitions=1)
    handler = Collect()
    c = LogConsumer(
        group_id=f"maxb-{topic}",
        topics=[topic],
        handler=handler,
        workers=2,
        ordering=ordering,  # type: ignore[arg-type]
        max_batch=7,
        kafka_config=kafka.client_config("consumer"),
    )
    with c:
        wait_until(lambda: handler.count() >= n, 60, "every record handled", step=0.05)
    assert max(handler.sizes) <= 7
    assert sorted(handler.seen) == [(0, o) for o in range(n)]
    if ordering == "partition":
        assert handler.seen == sorted(handler.seen)


def test_key_ordering_across_8_workers(kafka: KafkaTarget, fresh_topic: Callable[..., str]) -> None:
    """ordering='key': a key's records are processed one at a time, in offset order."""
    topic = fresh_topic(3)
    n, keys = 6000, 24
    produce(
        kafka.client_config("producer"),
        topic,
        n,
        partitions=3,
        key=lambda i: b"k%d" % (i % keys),
    )
    lock = threading.Lock()
    in_flight: set[bytes | None] = set()
    order: dict[tuple[int, bytes | None], list[int]] = {}
    violations: list[str] = []
    threads: set[str] = set()

    def process(records: Sequence[Record]) -> None:
        mine = {r.key for r in records}
        with lock:
            threads.add(threading.current_thread().name)
            clash = mine & in_flight
            if clash:
                violations.append(f"keys {clash} processed concurrently")
            in_flight.update(mine)
        time.sleep(random.random() * 0.002)
        with lock:
            for r in records:
                order.setdefault((r.partition, r.key), []).append(r.offset)
            in_flight.difference_update(mine)

    handler = type("H", (), {"process": staticmethod(process)})()
    c = LogConsumer(
        group_id=f"key-{topic}",
        topics=[topic],
        handler=handler,
        workers=8,
        ordering="key",
        max_batch=50,
        kafka_config=kafka.client_config("consumer"),
    )
    with c:
        wait_until(lambda: c.stats()["processed"] >= n, 60, f"{n} records processed")
    assert violations == []
    assert sum(len(v) for v in order.values()) == n
    for key, offsets in order.items():
        assert offsets == sorted(offsets), f"{key} out of order"
        assert len(set(offsets)) == len(offsets)
    assert len(threads) > 1, "work did not spread over the workers"


def poison_handler(seen: list[int]) -> Callable[[Record], None]:
    def handle(r: Record) -> None:
        if (r.value or b"").startswith(b"poison"):
            raise ValueError(f"cannot parse {r.value!r}")
        seen.append(r.offset)

    return handle


def test_poison_record_goes_to_dead_letter_topic(
    kafka: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """A record that always fails is retried, then dead-lettered with its error in headers."""
    topic, dlt = fresh_topic(1), fresh_topic(1)
    n, poison = 500, {100, 333}
    produce(
        kafka.client_config("producer"),
        topic,
        n,
        partitions=1,
        value=lambda i: b"poison %d" % i if i in poison else b"ok %d" % i,
    )
    seen: list[int] = []
    runs: collections.Counter[int] = collections.Counter()  # handler runs holding a poison one

    class Batches:
        def process(self, records: Sequence[Record]) -> None:
            runs.update(r.offset for r in records if r.offset in poison)
            for r in records:
                poison_handler(seen)(r)

    c = LogConsumer(
        group_id=f"dlt-{topic}",
        topics=[topic],
        handler=Batches(),
        dead_letter_topic=dlt,
        max_retries=2,
        retry_backoff=0.01,
        kafka_config=kafka.client_config("consumer"),
    )
    with c:
        wait_until(lambda: c.stats()["committed"].get(f"{topic}[0]") == n, 60, "all committed")
        stats = c.stats()
    assert stats["dead_lettered"] == 2
    assert stats["retries"] >= 4
    assert set(seen) == set(range(n)) - poison
    dead = read_topic(kafka.bootstrap_servers, dlt)
    assert sorted(m.value() or b"" for m in dead) == [b"poison 100", b"poison 333"]
    for m in dead:
        headers = dict(m.headers() or [])
        assert headers["logsdk.dlt.topic"] == topic.encode()
        assert headers["logsdk.dlt.partition"] == b"0"
        assert int(headers["logsdk.dlt.offset"]) in poison
        # Its failed batch's run counts too: 4 (batch, alone, 2 retries), 3 in a batch of one.
        assert int(headers["logsdk.dlt.attempts"]) == runs[int(headers["logsdk.dlt.offset"])]
        assert int(headers["logsdk.dlt.attempts"]) in (3, 4)
        assert headers["logsdk.dlt.error_type"] == b"ValueError"
        assert b"cannot parse" in headers["logsdk.dlt.error"]
        assert headers["logsdk.producer"] == b"test-producer"


def test_poison_record_without_dlt_stops_with_clear_error(
    kafka: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """Without a dead-letter topic the consumer stops on the poison record; nothing is skipped."""
    topic = fresh_topic(1)
    n = 300
    produce(
        kafka.client_config("producer"),
        topic,
        n,
        partitions=1,
        value=lambda i: b"poison" if i == 150 else b"ok",
    )
    seen: list[int] = []
    c = LogConsumer(
        group_id=f"nodlt-{topic}",
        topics=[topic],
        handler=poison_handler(seen),
        max_retries=1,
        retry_backoff=0.01,
        kafka_config=kafka.client_config("consumer"),
    )
    with pytest.raises(
        PoisonRecordError,
        match=r"\[0\]@150 failed [23] times.*dead_letter_topic",  # 3: in a batch
    ) as e:
        c.run(timeout=60)
    assert e.value.offset == 150
    assert isinstance(c.error, PoisonRecordError)
    committed = c.stats()["committed"].get(f"{topic}[0]", 0)
    assert committed <= 150, "the commit moved past a record that was never processed"
    assert set(range(150)) <= set(seen)
    assert 150 not in seen


def _sink_rows(path: Path) -> list[tuple[int, int]]:
    conn = sqlite3.connect(path)
    try:
        return [(int(p), int(o)) for p, o in conn.execute("SELECT partition, offset FROM records")]
    finally:
        conn.close()


class SlowSink(SQLiteSink):
    """SQLiteSink that takes a little time per batch, so rebalances land mid-run."""

    def process(self, records: Sequence[Record]) -> None:
        time.sleep(0.1)
        super().process(records)


@pytest.mark.slow
def test_rebalance_exactly_once_no_duplicate_no_gap(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """3 consumers, one joining late and one leaving mid-run: each record stored exactly once."""
    topic = fresh_topic(6)
    n = 30_000
    produce(kafka.client_config("producer"), topic, n // 2, partitions=6)
    db = tmp_path / "sink.db"
    sinks = [SlowSink(db) for _ in range(3)]

    def consumer(i: int) -> LogConsumer:
        return LogConsumer(
            group_id=f"rb-{topic}",
            topics=[topic],
            handler=sinks[i],
            semantics="exactly_once",
            workers=3,
            max_batch=100,
            kafka_config=kafka.client_config("consumer"),
        )

    c1, c2, c3 = consumer(0), consumer(1), consumer(2)
    try:
        c1.start()
        c2.start()
        wait_until(lambda: len(_sink_rows(db)) >= n // 5, 60, "first fifth stored", step=0.1)
        c3.start()  # joins late
        wait_until(lambda: c3.stats()["assignments"] > 0, 30, "late member assigned", step=0.1)
        produce(kafka.client_config("producer"), topic, n // 2, partitions=6, start_seq=n // 2)
        wait_until(lambda: c3.stats()["processed"] > 0, 30, "late member processing", step=0.1)
        assert len(_sink_rows(db)) < n, "the run ended before the member left"
        c2.stop()  # leaves mid-run
        wait_until(lambda: len(_sink_rows(db)) >= n, 90, "all records stored", step=0.2)
        time.sleep(1.0)  # anything still in flight would land now and show as a duplicate
    finally:
        for c in (c1, c2, c3):
            c.stop()
        for s in sinks:
            s.close()
    rows = _sink_rows(db)
    dupes = len(rows) - len(set(rows))
    assert dupes == 0, f"{dupes} duplicates"
    assert set(rows) == {(i % 6, i // 6) for i in range(n)}
    assert c1.stats()["revocations"] >= 2  # c3 joining and c2 leaving both moved partitions


def test_process_executor_exactly_once(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """executor='process': handlers run in child processes with the same exactly-once result."""
    topic = fresh_topic(2)
    n = 3000
    produce(kafka.client_config("producer"), topic, n, partitions=2)
    db = tmp_path / "sink.db"
    with SQLiteSink(db) as sink:
        c = LogConsumer(
            group_id=f"proc-{topic}",
            topics=[topic],
            handler=sink,
            semantics="exactly_once",
            executor="process",
            workers=2,
            kafka_config=kafka.client_config("consumer"),
        )
        with c:
            wait_until(lambda: sink.count() >= n, 90, "all records stored", step=0.1)
            # A child stores its batch before its result reaches this process's counters.
            wait_until(lambda: c.stats()["processed"] >= n, 30, "all counted", step=0.05)
            assert c.stats()["processed"] == n
        rows = _sink_rows(db)
    assert sorted(rows) == sorted({(i % 2, i // 2) for i in range(n)})


class _Hang:
    """A handler that never returns (a hung sink); it marks a file once it is running."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def process(self, records: Sequence[Record]) -> None:
        Path(self.marker).write_text("running")
        time.sleep(600)


def test_stop_kills_a_hung_process_handler_within_its_timeout(
    kafka: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """executor='process' with a handler call that never returns: stop(timeout) returns
    about then, and no handler process is left running."""
    topic = fresh_topic(1)
    produce(kafka.client_config("producer"), topic, 10, partitions=1)
    marker = tmp_path / "running"
    before = set(multiprocessing.active_children())  # other tests' children are not ours
    c = LogConsumer(
        group_id=f"hang-{topic}",
        topics=[topic],
        handler=_Hang(str(marker)),
        executor="process",
        workers=1,
        kafka_config=kafka.client_config("consumer"),
    )
    c.start()
    try:
        wait_until(marker.exists, 90, "the handler running in its process", step=0.1)
        children = [p for p in multiprocessing.active_children() if p not in before]
        assert children
    finally:
        t0 = time.monotonic()
        c.stop(timeout=3)
        took = time.monotonic() - t0
    assert took < 10, f"stop(timeout=3) took {took:.1f}s"
    # is_alive() can say True for a moment while the pool's own thread reaps the process.
    wait_until(
        lambda: not any(p.is_alive() for p in children), 5, "no handler process left", step=0.05
    )
    assert c.stats()["processed"] == 0


def test_error_events_among_records_are_skipped(
    kafka: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """Partition-EOF events come back from consume() between records: none is lost."""
    topic = fresh_topic(2)
    n = 500
    produce(kafka.client_config("producer"), topic, n, partitions=2)
    handler = Collect()
    config = {**kafka.client_config("consumer"), "enable.partition.eof": True}
    c = LogConsumer(
        group_id=f"eof-{topic}", topics=[topic], handler=handler, workers=2, kafka_config=config
    )
    with c:
        wait_until(lambda: handler.count() >= n or c.error is not None, 60, "all records")
        assert c.error is None
        produce(kafka.client_config("producer"), topic, n, partitions=2)
        wait_until(lambda: handler.count() >= 2 * n or c.error is not None, 60, "more records")
        stats = c.stats()
    assert sorted(handler.seen) == [(p, o) for p in range(2) for o in range(n)]
    assert stats["error"] is None


#: Set while _SlowToPickle is being pickled; pickling goes on once _PICKLE_GATE is set.
_PICKLING = threading.Event()
_PICKLE_GATE = threading.Event()


class _SlowToPickle:
    """A handler whose pickling (what start() does first for executor='process') waits
    for _PICKLE_GATE: start() is held half way through building the consumer."""

    def process(self, records: Sequence[Record]) -> None:
        """Nothing to do: no record is produced."""

    def __getstate__(self) -> dict[str, object]:
        _PICKLING.set()
        _PICKLE_GATE.wait(30)
        return {}


def test_stop_during_start_waits_for_it_and_leaves_nothing_running(
    kafka: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """stop() on another thread while start() is half way: it waits for the start and
    takes everything down (it used to see a half-built consumer and return at once,
    after which start() went on to leave the fetch thread polling)."""
    topic = fresh_topic(1)
    _PICKLING.clear()
    _PICKLE_GATE.clear()
    before = set(threading.enumerate())
    c = LogConsumer(
        group_id=f"startstop-{topic}",
        topics=[topic],
        handler=_SlowToPickle(),
        executor="process",
        workers=2,
        kafka_config=kafka.client_config("consumer"),
    )
    starter = threading.Thread(target=c.start, name="test-start")
    stopper = threading.Thread(target=c.stop, kwargs={"timeout": 30}, name="test-stop")
    try:
        starter.start()
        assert _PICKLING.wait(30), "start() did not reach the handler's pickling"
        stopper.start()
        stopper.join(0.5)  # stop() runs now, while start() is held
    finally:
        _PICKLE_GATE.set()
        starter.join(60)
        stopper.join(60)
    assert not starter.is_alive()
    assert not stopper.is_alive()
    assert c.stats()["state"] == "stopped"
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == []
