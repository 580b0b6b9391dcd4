"""A batch the broker never stored, yet acknowledged: DUPLICATE_SEQUENCE_NUMBER on a resend.

Tansu with S3 storage saves an idempotent producer's sequence before it writes the
batch; a crash or S3 error in between loses the batch, and the client's resend is
answered DUPLICATE_SEQUENCE_NUMBER (46), which librdkafka reports as a successful
delivery. ``EmbeddedBroker.drop_produce_as_duplicate`` reproduces exactly that at
the proxy, deterministically, in front of a real broker.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer

from logsdk import LogProducer
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, read_topic
from logsdk.testing.chaos import trace_deliveries, unconfirmed_seqs
from tests.conftest import FAST, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.fault]

BrokerFactory = Callable[..., EmbeddedBroker]
#: Consumers check each batch's CRC: the proxy rewrites the ones it renumbers.
CHECK_CRCS = {"check.crcs": True}


class Reports:
    """Every delivery report of a raw producer: (error, value, offset or None)."""

    def __init__(self) -> None:
        self.all: list[tuple[KafkaError | None, bytes, int | None]] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        self.all.append((err, msg.value() or b"", msg.offset()))


def _idempotent_producer(
    make_kafka_producer: Callable[..., Producer], broker: EmbeddedBroker
) -> Producer:
    return make_kafka_producer(
        {
            **broker.client_config("producer"),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 50,
        }
    )


def test_raw_producer_told_duplicate_loses_the_batch(
    broker_factory: BrokerFactory, make_kafka_producer: Callable[..., Producer]
) -> None:
    """Every record is reported delivered, yet the dropped batch is not in the topic; and
    the producer carries on (no sequence gap at the broker, no fatal error)."""
    broker = broker_factory(durable=True, proxy=True)
    topic = create_topic(broker.bootstrap_servers, "dupseq-raw", 1)
    p = _idempotent_producer(make_kafka_producer, broker)
    before = Reports()
    for i in range(10):
        p.produce(topic, b"before-%d" % i, on_delivery=before)
    assert p.flush(20) == 0
    assert [err for err, _, _ in before.all] == [None] * 10

    n = 500
    broker.drop_produce_as_duplicate(1)
    lost = Reports()
    for i in range(n):
        p.produce(topic, b"lost-%d" % i, on_delivery=lost)
    assert p.flush(20) == 0
    assert broker.produce_drops_done == 1
    print("ProduceRequest versions negotiated:", sorted(broker.produce_versions))

    assert len(lost.all) == n
    assert [err for err, _, _ in lost.all] == [None] * n  # "delivered", every one
    assert any(offset is None for _, _, offset in lost.all)  # offset -1 reads as None

    after = Reports()
    for i in range(10):
        p.produce(topic, b"after-%d" % i, on_delivery=after)
    assert p.flush(20) == 0
    assert [err for err, _, _ in after.all] == [None] * 10

    msgs = read_topic(broker.bootstrap_servers, topic, extra_config=CHECK_CRCS)
    stored = {m.value() for m in msgs}
    missing = {v for _, v, _ in lost.all} - stored
    assert missing  # the batch really is gone
    assert {v for _, v, _ in before.all + after.all} <= stored  # and nothing else
    # librdkafka numbers a batch's reports from the broker's base offset (-1): only the
    # first lost record reports None; the rest report 0, 1, ... offsets that look valid.
    assert any(offset is not None for _, v, offset in lost.all if v in missing)


def test_log_producer_resends_batch_told_duplicate(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    """A LogProducer whose batch was lost and reported as a duplicate must still deliver
    every record: an acknowledgement without a valid offset is not proof of storage.
    The records of the batch are counted as unconfirmed, spooled and resent (so they
    land after records sent later: the only order violations, and the delivery trace
    the fault tests use names each of them)."""
    broker = broker_factory(durable=True, proxy=True)
    topic = create_topic(broker.bootstrap_servers, "dupseq", 3)
    n, first = 2000, 100
    reports: list[str] = []
    with LogProducer(broker.bootstrap_servers, topic, tmp_path, **FAST) as p:
        trace_deliveries(p, reports.append)
        for i in range(first):
            p.send(b"%d" % i, key=b"%d" % (i % 12))
        wait_until(
            lambda: (s := p.stats())["state"] == "ONLINE" and s["acked"] >= first,
            30,
            "the first records acknowledged",
        )
        broker.drop_produce_as_duplicate(1)
        for i in range(first, n):
            p.send(b"%d" % i, key=b"%d" % (i % 12))
        wait_until(lambda: broker.produce_drops_done == 1, 30, "a produce request dropped")
        assert p.flush(60) == 0
        # The unconfirmed records went to the spool: wait for the replay to deliver them.
        wait_until(
            lambda: (s := p.stats())["state"] == "ONLINE" and s["spool_records"] == 0,
            60,
            "the spool replayed",
        )
        stats = p.stats()
        pid = p.producer_id
    assert stats["unconfirmed_acks"] > 0
    assert stats["errors"]["unconfirmed_ack"] == stats["unconfirmed_acks"]
    rep = check_delivery(read_topic(broker.bootstrap_servers, topic, extra_config=CHECK_CRCS))
    assert rep.missing(pid, range(n)) == []
    # The trace replays the producer's rule per report; it can only see a batch's chain
    # go on where the producer ended it at a poll's end, never the other way round.
    traced = unconfirmed_seqs(reports)
    assert len(traced) >= stats["unconfirmed_acks"]
    assert {s for _, s in rep.order_violators} <= traced


# -- the proxy's answers, byte by byte ----------------------------------------------------


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _api_versions(correlation_id: int) -> bytes:
    return _frame(struct.pack(">hhih", 18, 0, correlation_id, -1))


def _uvarint(n: int) -> bytes:
    assert n < 128
    return bytes([n])


def _produce(version: int, correlation_id: int, topic: bytes, partitions: list[int]) -> bytes:
    """A ProduceRequest (acks=-1) with a few junk bytes as each partition's records."""
    records = b"not a batch"
    head = struct.pack(">hhih", 0, version, correlation_id, -1)  # client_id null
    if version >= 9:
        body = head + b"\x00" + _uvarint(0) + struct.pack(">hi", -1, 5000)
        body += _uvarint(2) + _uvarint(len(topic) + 1) + topic + _uvarint(len(partitions) + 1)
        for index in partitions:
            body += struct.pack(">i", index) + _uvarint(len(records) + 1) + records + b"\x00"
        return _frame(body + b"\x00\x00")
    body = head + struct.pack(">hhi", -1, -1, 5000)
    body += struct.pack(">ih", 1, len(topic)) + topic + struct.pack(">i", len(partitions))
    for index in partitions:
        body += struct.pack(">ii", index, len(records)) + records
    return _frame(body)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def length(self, compact: bool) -> int:
        return self.take(">B") - 1 if compact else self.take(">i")


def _decode_produce_response(version: int, body: bytes) -> list[tuple[bytes, int, int, int]]:
    """(topic, partition, error_code, base_offset) from a ProduceResponse, checked field
    by field against ProduceResponse.json (v3..v12)."""
    r, flexible = _Reader(body), version >= 9
    r.take(">i")  # correlation id
    if flexible:
        assert r.take(">B") == 0  # response header tags
    out = []
    for _ in range(r.length(flexible)):
        n = r.take(">B") - 1 if flexible else r.take(">h")
        name = r.data[r.pos : r.pos + n]
        r.pos += n
        for _ in range(r.length(flexible)):
            index, error, base = r.take(">i"), r.take(">h"), r.take(">q")
            assert r.take(">q") == -1  # log_append_time_ms
            if version >= 5:
                assert r.take(">q") == -1  # log_start_offset
            if version >= 8:
                assert r.length(flexible) == 0  # record_errors
                assert (r.take(">B") - 1 if flexible else r.take(">h")) == -1  # error_message
            if flexible:
                assert r.take(">B") == 0
            out.append((name, index, error, base))
        if flexible:
            assert r.take(">B") == 0
    assert r.take(">i") == 0  # throttle_time_ms
    if flexible:
        assert r.take(">B") == 0
    assert r.pos == len(body)
    return out


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "the proxy closed the connection"
            buf += chunk
        return buf

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


@pytest.mark.parametrize("version", [3, 7, 8, 9, 10, 12])
def test_made_up_answers_keep_request_order(broker_factory: BrokerFactory, version: int) -> None:
    """Pipelined requests on one connection: the proxy's answer to the dropped produce
    comes between the broker's answers to the requests around it, well formed."""
    broker = broker_factory(proxy=True)
    broker.drop_produce_as_duplicate(1)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(
            _api_versions(1)
            + _api_versions(2)
            + _produce(version, 3, b"some-topic", [0, 2])
            + _api_versions(4)
        )
        frames = [_read_frame(sock) for _ in range(4)]
    assert [struct.unpack_from(">i", f)[0] for f in frames] == [1, 2, 3, 4]
    assert _decode_produce_response(version, frames[2]) == [
        (b"some-topic", 0, 46, -1),
        (b"some-topic", 2, 46, -1),
    ]
    assert broker.produce_drops_done == 1
