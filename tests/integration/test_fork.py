"""A producer used in a forked child starts afresh there: its own client, threads, slot of
spool_dir, producer id and seqs; the parent's records stay the parent's. Real os.fork(),
real broker; every record counted, and a reader deduping by (producer, seq) keeps all."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from logsdk import LogConsumer, LogProducer
from logsdk.spool import Spool
from logsdk.testing import check_delivery, read_topic
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import wait_until

pytestmark = [
    pytest.mark.integration,
    # Python 3.12+ warns on every fork() of a process that runs threads; forking one that
    # runs a producer's threads is the very case these tests show to be handled.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


def _in_child(fn: Callable[[], None]) -> int:
    """Fork; run ``fn`` in the child and leave with 0 (1 on any exception, 2 on a hang
    past 60 s, so a hang is a failure, not a stuck suite). Returns the child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import signal

            signal.alarm(60)
            fn()
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _wait(pid: int, timeout: float = 90) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    raise AssertionError("the forked child did not finish")


@pytest.mark.parametrize("buffer", ["memory", "shm"])
@pytest.mark.parametrize("first_send", ["before_fork", "after_fork"])
def test_forked_child_sends_under_its_own_identity(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
    buffer: str,
    first_send: str,
) -> None:
    """The parent sends (or not) before fork(); the child sends 100 and closes, quickly;
    the parent goes on sending and closes. Every record arrives once: 100 under the child's
    producer id, the parent's under its own, no (producer, seq) pair shared.

    With "before_fork", the parent's client is connected (a first flush) and holds 100
    records in flight at the fork. A fork while its threads start (connecting, seeding
    their random generator) is another case: the child may find a lock held for ever
    (docs/engineering/processes-and-shutdown.md; tests/fault/test_fork_resolver.py)."""
    topic = fresh_topic(2)
    p = make_producer(
        kafka_broker.bootstrap_servers, topic, tmp_path, buffer=buffer, shm_bytes=1 << 20
    )
    parent_id = p.producer_id
    if first_send == "before_fork":
        for i in range(100):
            p.send(b"parent-%d" % i)
        assert p.flush(30) == 0
        for i in range(100, 200):
            p.send(b"parent-%d" % i)
    result = tmp_path / "child.txt"

    def child() -> None:
        for i in range(100):
            p.send(b"child-%d" % i)
        assert p.flush(30) == 0
        t0 = time.monotonic()
        p.close(10)
        s = p.stats()
        result.write_text(f"{s['producer_id']} {s['slot']} {s['sent']} {time.monotonic() - t0}")

    pid = _in_child(child)
    for i in range(200, 300):
        p.send(b"parent-%d" % i)
    assert _wait(pid) == 0
    assert p.flush(30) == 0
    p.close()
    child_id, slot, sent, close_s = result.read_text().split()
    assert child_id != parent_id
    assert (int(slot), int(sent)) == (1, 100)
    assert float(close_s) < 5.0
    msgs = read_topic(kafka_broker.bootstrap_servers, topic)
    rep = check_delivery(msgs)
    n_parent = 300 if first_send == "before_fork" else 100
    assert rep.unique == n_parent + 100
    assert rep.duplicates == 0
    assert rep.missing(child_id, range(100)) == []
    values = sorted(m.value() or b"" for m in msgs)
    assert len(values) == n_parent + 100
    assert sum(v.startswith(b"child-") for v in values) == 100


def test_a_child_that_never_uses_the_producer_leaves_the_parent_alone(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
) -> None:
    """A forked child that only closes the inherited producer (as dictConfig in gunicorn's
    post_fork does) returns at once, takes no slot, and the parent delivers everything."""
    topic = fresh_topic(1)
    p = make_producer(kafka_broker.bootstrap_servers, topic, tmp_path)
    for i in range(1000):
        p.send(b"%d" % i)

    def child() -> None:
        t0 = time.monotonic()
        assert p.flush(5) == 0  # nothing accepted in this process
        p.close(10)
        assert time.monotonic() - t0 < 1.0

    assert _wait(_in_child(child)) == 0
    for i in range(1000, 2000):
        p.send(b"%d" % i)
    assert p.flush(30) == 0
    assert p.stats()["slot"] == 0
    p.close()
    assert not (tmp_path / "slots").exists()
    rep = check_delivery(read_topic(kafka_broker.bootstrap_servers, topic))
    assert rep.missing(p.producer_id, range(2000)) == []


def test_a_free_slot_with_leftovers_is_delivered_by_the_next_producer(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
) -> None:
    """Slot 2 holds records of a process that is gone (under the slot's own producer id):
    the next producer on spool_dir takes slot 0, its health thread's first look (Kafka
    answers) starts a drain of slot 2, and its flush() delivers slot 2's records too,
    under their own producer id and seqs; the slot is empty afterwards."""
    topic = fresh_topic(1)
    leftover = Spool(tmp_path / "slots" / "2").open()
    orphan_id = leftover.producer_id
    leftover.append([(topic, None, b"left-%d" % i, None, 1_700_000_000_000, i) for i in range(50)])
    leftover.close()
    p = make_producer(kafka_broker.bootstrap_servers, topic, tmp_path)
    assert p.stats()["slot"] == 0
    wait_until(lambda: p.stats()["draining_slots"] == 1, 30, "a drain of slot 2")
    p.send(b"own")
    assert p.flush(30) == 0
    p.close()
    rep = check_delivery(read_topic(kafka_broker.bootstrap_servers, topic))
    assert rep.missing(orphan_id, range(50)) == []
    assert rep.missing(p.producer_id, range(1)) == []
    again = Spool(tmp_path / "slots" / "2").open()
    try:
        assert again.count == 0
        assert again.producer_id == orphan_id
    finally:
        again.close()


#: A directory name with what a ``file:`` URI reads as syntax: a space, '#' (fragment), '?'
#: (query), '%' (an escape: "%41" is "A"), and a non-ASCII letter.
URI_HOSTILE = "spool dir #1?mode=rw&x=%41 é"


def test_slots_under_a_path_with_uri_characters_are_drained_once(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """spool_dir's path holds a space, '#', '?', '%' and 'é': the records a gone process left
    in a free slot are delivered (counted in ``drained``, also once the drain is let go),
    draining_slots returns to 0, and an empty free slot is
    not drained (it was, at every scan, for ever) nor written to by the look into it."""
    caplog.set_level(logging.INFO, logger="logsdk.producer")
    topic = fresh_topic(1)
    root = tmp_path / URI_HOSTILE
    leftover = Spool(root / "slots" / "1").open()
    orphan_id = leftover.producer_id
    leftover.append([(topic, None, b"left-%d" % i, None, 1_700_000_000_000, i) for i in range(30)])
    leftover.close()
    empty = root / "slots" / "2"
    Spool(empty).open().close()
    sqlite_files = [empty / "spool.db-wal", empty / "spool.db-shm"]
    assert not any(f.exists() for f in sqlite_files)

    p = make_producer(kafka_broker.bootstrap_servers, topic, root)
    assert p.stats()["slot"] == 0
    wait_until(lambda: p.stats()["draining_slots"] == 1, 30, "a drain of slot 1")
    assert p.flush(30) == 0
    assert p.stats()["drained"] == 30  # the drain's acknowledgements, counted by p
    assert p.flush(30) == 0  # its look at the slots closes the finished drain, starts none
    s = p.stats()
    assert s["draining_slots"] == 0
    assert (s["drained"], s["drain_rejected"]) == (30, 0)  # kept once the drain is let go
    assert s["acked"] == 0  # p sent nothing of its own
    drained = [
        r.getMessage() for r in caplog.records if "left by another process" in r.getMessage()
    ]
    assert drained == [
        f"spool slot {root / 'slots' / '1'}: 30 record(s) left by another process; delivering them"
    ]
    assert not any(f.exists() for f in sqlite_files)
    p.close()
    rep = check_delivery(read_topic(kafka_broker.bootstrap_servers, topic))
    assert rep.missing(orphan_id, range(30)) == []
    assert list(tmp_path.iterdir()) == [root]  # nothing made beside it (a '?' cut the path)


def test_producers_take_the_lowest_free_slot(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Three live producers on one spool_dir hold slots 0, 1, 2; once the one on slot 1
    closed, the next one takes slot 1: slots stay bounded by the peak of live producers."""
    topic = fresh_topic(1)
    ps = [LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) for _ in range(3)]
    try:
        assert [p.stats()["slot"] for p in ps] == [0, 1, 2]
        assert len({p.producer_id for p in ps}) == 3
        ps[1].close()
        ps[1] = LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path)
        assert ps[1].stats()["slot"] == 1
    finally:
        for p in ps:
            p.close()
    assert sorted(os.listdir(tmp_path / "slots")) == ["1", "2"]


def _librdkafka_threads() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended since the listing (ENOENT, or ESRCH mid-exit)
            continue
    return sorted(n for n in names if n.startswith("rdk:"))


def test_a_producer_that_has_sent_nothing_runs_no_librdkafka_thread(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """What a gunicorn --preload master forks with, when it does not log: no librdkafka
    thread that could hold glibc's resolver lock at the fork (tests/fault/
    test_fork_resolver.py shows the child such a thread leaves). The first record makes
    the client, and it is delivered."""
    topic = fresh_topic(1)
    before = _librdkafka_threads()
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p:
        assert p.flush(5) == 0
        assert _librdkafka_threads() == before
        p.send(b"first")
        assert p.flush(30) == 0
        assert len(_librdkafka_threads()) > len(before)
    assert [m.value() for m in read_topic(kafka_broker.bootstrap_servers, topic)] == [b"first"]


def _churn_threads(n: int = 50) -> None:
    """Start and end ``n`` threads: glibc hands the stacks of the parent's threads (cached
    at the fork) to new ones and unmaps the surplus, where a join of an inherited
    librdkafka thread then reads (SIGSEGV seen in CI) or waits for a thread of the child."""
    done = threading.Event()
    threads = [threading.Thread(target=done.wait) for _ in range(n)]
    for t in threads:
        t.start()
    done.set()
    for t in threads:
        t.join()


def _consumer_with_dead_letters(bootstrap_servers: str, topic: str) -> LogConsumer:
    """A started consumer with a dead-letter topic: librdkafka's consumer and producer."""
    return LogConsumer(
        bootstrap_servers,
        f"group-{topic}",
        [topic],
        lambda r: None,
        dead_letter_topic=f"{topic}-dlt",
    ).start()


def test_a_child_collects_the_garbage_its_parent_left_without_crashing(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """What failed in CI: a LogConsumer with a dead-letter topic, stopped, lies in a
    reference cycle, not yet collected, when its process forks. The child's collector
    frees it, after the child ran threads of its own: a librdkafka client still alive in
    it (its threads did not follow the fork) must not be destroyed there, which joins
    threads that do not exist (without the fix, 5 of these 6 children died of SIGSEGV).
    Six children in a row exit cleanly."""
    topic = fresh_topic(1)
    was_enabled = gc.isenabled()
    gc.disable()  # the cycle below stays uncollected until the forks, as it did in CI
    try:
        c = _consumer_with_dead_letters(kafka_broker.bootstrap_servers, topic)
        c.stop(30)
        assert c.error is None
        cycle: list[object] = [c]
        cycle.append(cycle)
        del c, cycle

        def child() -> None:
            _churn_threads()
            gc.collect()

        codes = [_wait(_in_child(child)) for _ in range(6)]
    finally:
        if was_enabled:
            gc.enable()
    assert codes == [0] * 6


def test_a_stopped_consumer_leaves_no_librdkafka_thread(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """stop() frees the consumer's clients, its dead-letter producer's included: none is
    left running (and resolving broker names) until the collector finds it."""
    topic = fresh_topic(1)
    gc.collect()
    before = _librdkafka_threads()
    c = _consumer_with_dead_letters(kafka_broker.bootstrap_servers, topic)
    try:
        assert len(_librdkafka_threads()) > len(before)
    finally:
        c.stop(30)
    # None of the consumer's is left (another test's client may have ended meanwhile).
    assert Counter(_librdkafka_threads()) - Counter(before) == Counter()
