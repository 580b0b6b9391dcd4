"""What a careless caller or a damaged disk hands the producer never crashes the process,
wedges delivery, or makes the dedupe drop records. Real broker; every record counted."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logsdk import LogProducer
from logsdk.consumer import Record
from logsdk.errors import ConfigError, SerializationError, SpoolError
from logsdk.producer._identity import ENV_SEQ_BLOCK
from logsdk.sinks import SQLiteSink
from logsdk.spool import Spool
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, free_port, read_topic
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import FAST, wait_until

pytestmark = pytest.mark.integration

SURROGATE = b"caf\xe9".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize(
    "topic", ["bad topic!", "x" * 250, ".", "..", "", "t\x00", f"t{SURROGATE}", 5, None]
)
def test_a_topic_kafka_refuses_is_refused_by_the_constructor(tmp_path: Path, topic: Any) -> None:
    """The default topic is checked by Kafka's rules before anything opens."""
    with pytest.raises(ConfigError, match="topic"):
        LogProducer("127.0.0.1:1", topic, tmp_path)
    assert not (tmp_path / "LOCK").exists()


def test_send_refuses_what_kafka_or_librdkafka_would_refuse_later(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Bad topics, header names, text with lone surrogates, NaN, a 100k-deep dict and
    timestamp 0 raise a typed error naming the field, before acceptance; the good records
    around them arrive, once, and the producer stays ONLINE."""
    topic = fresh_topic(1)
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(100_000):  # past the recursion limit of every Python (3.13 encodes 5000)
        node["a"] = {}
        node = node["a"]
    bad: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"topic": "bad topic!"}, ConfigError, "topic"),
        ({"topic": "x" * 300}, ConfigError, "topic"),
        ({"topic": "t\x00"}, ConfigError, "topic"),
        ({"topic": ["t"]}, ConfigError, "topic"),
        ({"headers": {SURROGATE: b"v"}}, SerializationError, "header name"),
        ({"headers": {"a\x00b": b"v"}}, SerializationError, "header name"),
        ({"headers": {"h": SURROGATE}}, SerializationError, "header"),
        ({"key": SURROGATE}, SerializationError, "key"),
        ({"timestamp": 0}, ConfigError, "timestamp"),
        ({"timestamp": -5}, ConfigError, "timestamp"),
        ({"timestamp": 1 << 63}, ConfigError, "timestamp"),
    ]
    values: list[tuple[Any, str]] = [
        (SURROGATE, "value"),
        ({"x": float("nan")}, "JSON"),
        ({"x": float("inf")}, "JSON"),
        (deep, "JSON"),
    ]
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p:
        p.send(b"first")
        for kw, err, field in bad:
            with pytest.raises(err, match=field):
                p.send(b"bad", **kw)
        for value, field in values:
            with pytest.raises(SerializationError, match=field):
                p.send(value)
        p.send(bytearray(b"second"))

        class Bytes(bytes):
            pass

        p.send(Bytes(b"third"))
        p.send(b"fourth", timestamp=1)
        assert p.flush(30) == 0
        assert p.state.value == "ONLINE"
        assert p.stats()["next_seq"] == 4
    got = [m.value() for m in read_topic(kafka_broker.bootstrap_servers, topic)]
    assert got == [b"first", b"second", b"third", b"fourth"]


def test_a_header_name_with_a_lone_surrogate_never_crashes_the_process(tmp_path: Path) -> None:
    """What used to end in SIGSEGV inside confluent-kafka's produce(): the child survives
    and reports the typed error."""
    code = textwrap.dedent(
        f"""
        from logsdk import LogProducer
        from logsdk.errors import SerializationError
        p = LogProducer("127.0.0.1:{free_port()}", "t", {str(tmp_path)!r})
        name = b"caf\\xe9".decode("utf-8", "surrogateescape")
        try:
            p.send(b"x", headers={{name: b"v"}})
        except SerializationError as exc:
            print("refused:", type(exc).__name__)
        p.close(0)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused: SerializationError" in out.stdout


def _plant(spool_dir: Path, rows: list[tuple[str, bytes]]) -> str:
    """Write rows straight into a spool, as an older version or another program might."""
    s = Spool(spool_dir).open()
    try:
        s.append([(t, None, v, None, 1_700_000_000_000, i) for i, (t, v) in enumerate(rows)])
        return s.producer_id
    finally:
        s.close()


def test_a_spooled_record_kafka_or_librdkafka_refuses_is_set_aside_and_replay_goes_on(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Rows whose topic Kafka refuses (a space) or librdkafka cannot take (a NUL) sit
    between good rows in a spool: each bad row goes to the rejected table once, every good
    row arrives exactly once, in order, and the producer ends ONLINE."""
    topic = fresh_topic(1)
    pid = _plant(
        tmp_path,
        [(topic, b"g0"), ("bad topic!", b"b1"), (topic, b"g2"), ("t\x00", b"b3"), (topic, b"g4")],
    )
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path, **FAST) as p:
        assert p.flush(30) == 0
        # flush() promises the records in Kafka; the pump goes ONLINE in the same step, after.
        wait_until(lambda: p.stats()["state"] == "ONLINE", 10, "ONLINE")
        s = p.stats()
        assert s["rejected"] == 2
        assert s["errors"].get("pump", 0) == 0
    conn = sqlite3.connect(tmp_path / "spool.db")
    try:
        rejected = [r[0] for r in conn.execute("SELECT value FROM rejected ORDER BY seq")]
    finally:
        conn.close()
    assert rejected == [b"b1", b"b3"]
    got = read_topic(kafka_broker.bootstrap_servers, topic)
    assert [m.value() for m in got] == [b"g0", b"g2", b"g4"]
    assert check_delivery(got).missing(pid, [0, 2, 4]) == []


def test_losing_state_json_never_makes_the_dedupe_drop_new_records(
    broker_factory: Callable[..., EmbeddedBroker],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
) -> None:
    """Kafka down, 5 records spooled; state.json deleted; the next producer replays them and
    sends 5 new ones: a SQLiteSink deduping by (producer, seq) stores all 10."""
    port = free_port()
    p = make_producer(f"127.0.0.1:{port}", "ids", tmp_path / "spool", **FAST)
    for i in range(5):
        p.send(b"old-%d" % i)
    p.close(0)
    (tmp_path / "spool" / "state.json").unlink()
    broker = broker_factory(port=port)
    create_topic(broker.bootstrap_servers, "ids", 1)
    with LogProducer(broker.bootstrap_servers, "ids", tmp_path / "spool", **FAST) as p2:
        for i in range(5):
            p2.send(b"new-%d" % i)
        assert p2.flush(30) == 0
    msgs = read_topic(broker.bootstrap_servers, "ids")
    pairs = {(dict(m.headers() or [])["logsdk.producer"], dict(m.headers() or [])["logsdk.seq"])
             for m in msgs}  # fmt: skip
    assert len(msgs) == 10
    assert len(pairs) == 10
    records = [
        Record(m.topic() or "", m.partition() or 0, m.offset() or 0, m.key(), m.value(),
               list(m.headers() or []), m.timestamp()[1])
        for m in msgs
    ]  # fmt: skip
    with SQLiteSink(tmp_path / "sink.db", dedupe=True) as sink:
        sink.process(records)
        sink.commit({})
        assert sink.count() == 10


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", "", "DIR"])
def test_a_damaged_state_json_is_recovered_from_the_database(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path, content: str
) -> None:
    """state.json that is a list, garbage, empty or a directory: the producer opens, keeps
    the producer id and seq reservation the database holds, and delivers."""
    topic = fresh_topic(1)
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p:
        p.send(b"a")
        pid, next_seq = p.producer_id, p.stats()["next_seq"]
    state = tmp_path / "state.json"
    state.unlink()
    if content == "DIR":
        state.mkdir()
    else:
        state.write_text(content)
    if content == "DIR":
        with pytest.raises(SpoolError, match=r"state\.json"):
            LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path)
        return
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p2:
        assert p2.producer_id == pid
        assert p2.stats()["next_seq"] >= next_seq
        p2.send(b"b")
        assert p2.flush(30) == 0
    got = read_topic(kafka_broker.bootstrap_servers, topic)
    assert [m.value() for m in got] == [b"a", b"b"]
    assert json.loads(state.read_text())["producer_id"] == pid


@pytest.mark.parametrize("leftovers", [False, True])
def test_a_kafka_config_typo_is_a_config_error_and_leaves_nothing_locked(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path, leftovers: bool
) -> None:
    """A property librdkafka refuses raises ConfigError in the constructor (also when the
    spool holds rows, which used to start the client later, in the pump), and the spool dir
    is free again: the corrected call in the same process works."""
    topic = fresh_topic(1)
    if leftovers:
        _plant(tmp_path, [(topic, b"left")])
    with pytest.raises(ConfigError, match=r"linger\.mss"):
        LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path, kafka_config={"linger.mss": 5})
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p:
        assert p.stats()["slot"] == 0
        p.send(b"ok")
        assert p.flush(30) == 0
    assert len(read_topic(kafka_broker.bootstrap_servers, topic)) == 1 + leftovers


def test_no_secret_in_repr(tmp_path: Path) -> None:
    """Every secret-bearing librdkafka property is hidden in the producer's repr."""
    secrets = {
        "sasl.password": "pw-1",
        "sasl.oauthbearer.config": "clientSecret=pw-2",
        "sasl.oauthbearer.client.secret": "pw-3",
        "ssl.key.password": "pw-4",
        "ssl.keystore.password": "pw-5",
        "sasl.username": "user",
    }
    p = LogProducer(f"127.0.0.1:{free_port()}", "t", tmp_path, kafka_config=secrets)
    try:
        text = repr(p) + repr(p.config)
    finally:
        p.close(0)
    for n in range(1, 6):
        assert f"pw-{n}" not in text
    assert "user" in text


@pytest.mark.parametrize("case", ["other_owner", "group_writable", "lock_link", "db_link"])
def test_a_spool_dir_another_user_could_write_is_refused(tmp_path: Path, case: str) -> None:
    """A spool dir owned by another user or writable by others, or a LOCK or spool.db that
    is a symbolic link, is refused with SpoolError; the link's target is left untouched."""
    import os

    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    target = tmp_path / "victim.txt"
    target.write_text("precious")
    if case == "other_owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the directory to another uid")
        os.chown(spool, 12345, 12345)
    elif case == "group_writable":
        spool.chmod(0o770)
    elif case == "lock_link":
        (spool / "LOCK").symlink_to(target)
    else:
        (spool / "spool.db").symlink_to(target)
    with pytest.raises(SpoolError, match=r"uid|writable|symbolic link"):
        LogProducer(f"127.0.0.1:{free_port()}", "t", spool)
    assert target.read_text() == "precious"


def test_kafka_handler_delivers_a_line_holding_undecodable_bytes(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A log line about a file whose name is not UTF-8 (a lone surrogate in Python) is
    delivered, not dropped; its JSON decodes back to the same text."""
    import logging

    from logsdk.integrations.logging import KafkaHandler

    topic = fresh_topic(1)
    handler = KafkaHandler(
        bootstrap_servers=kafka_broker.bootstrap_servers, topic=topic, spool_dir=tmp_path
    )
    log = logging.getLogger("hostile.surrogate")
    log.propagate = False  # pytest's own capture (and xdist's report) would choke on it
    log.addHandler(handler)
    try:
        log.warning("cannot open %s", f"/data/{SURROGATE}.txt")
    finally:
        log.removeHandler(handler)
        handler.close()
    assert handler.dropped == 0
    (msg,) = read_topic(kafka_broker.bootstrap_servers, topic)
    assert json.loads(msg.value() or b"")["message"] == f"cannot open /data/{SURROGATE}.txt"


def test_two_threads_closing_at_once_both_return_after_delivery(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    make_producer: Callable[..., LogProducer],
    tmp_path: Path,
) -> None:
    """Two threads call close() at once (an app's shutdown hook and its atexit): the second
    waits for the first, so when either returns every record is in Kafka."""

    topic = fresh_topic(1)
    p = make_producer(kafka_broker.bootstrap_servers, topic, tmp_path)
    for i in range(20_000):
        p.send(b"%d" % i)
    counts: list[int] = []

    def close() -> None:
        p.close(30)
        counts.append(p.stats()["acked"])

    threads = [threading.Thread(target=close) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert counts == [20_000, 20_000]
    assert len(read_topic(kafka_broker.bootstrap_servers, topic)) == 20_000


def test_a_failed_seq_reservation_is_retried_by_the_pump_and_never_reuses_a_seq(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seqs are reserved 10 at a time here, by the pump, ahead of need; its reservations
    fail while the disk is "full". send() takes seqs from memory: the first 10 go, the
    11th waits max_block_s for the pump and raises SpoolError (nothing advanced, the wait
    counted); once the disk has room the pump's retry succeeds and send() goes on; the next
    producer on the dir starts above every seq used, so no seq names two records."""
    monkeypatch.setenv(ENV_SEQ_BLOCK, "10")
    topic = fresh_topic(1)
    real = Spool.reserve_seq
    disk_full = threading.Event()
    disk_full.set()

    def full_disk(self: Spool, upto: int) -> None:
        if upto > 10 and disk_full.is_set():
            raise SpoolError("injected: [Errno 28] No space left on device")
        real(self, upto)

    monkeypatch.setattr(Spool, "reserve_seq", full_disk)
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path, max_block_s=1.5) as p:
        for i in range(10):
            p.send(b"a%d" % i)
        with pytest.raises(SpoolError, match="no sequence number reserved"):
            p.send(b"refused")
        stats = p.stats()
        assert stats["next_seq"] == 10
        assert stats["seq_waits"] == 1
        assert stats["errors"]["seq_reservation"] >= 1
        disk_full.clear()
        p.send(b"b10")  # waits for the pump's next try, which succeeds
        assert p.flush(30) == 0
    with LogProducer(kafka_broker.bootstrap_servers, topic, tmp_path) as p2:
        assert p2.stats()["next_seq"] >= 20
        p2.send(b"c")
        assert p2.flush(30) == 0
    msgs = read_topic(kafka_broker.bootstrap_servers, topic)
    seqs = [dict(m.headers() or [])["logsdk.seq"] for m in msgs]
    assert len(msgs) == 12
    assert len(set(seqs)) == 12


def test_cli_kafka_config_typo_is_a_clear_error(tmp_path: Path) -> None:
    """`logsdk produce -X` with a property librdkafka does not know: a one-line error naming
    it, exit status 1, no traceback."""
    out = subprocess.run(
        [sys.executable, "-m", "logsdk.cli", "produce", "-t", "t", "-b", "127.0.0.1:1",
         "--spool-dir", str(tmp_path / "s"), "-X", "linger.mss=5"],
        input="", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "linger.mss" in out.stderr
    assert "Traceback" not in out.stderr
