"""LogConsumer validates its arguments without I/O; the dispatcher enforces ordering lanes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import logsdk
from logsdk import LogConsumer, Record
from logsdk.consumer._offsets import Chunk
from logsdk.consumer._workers import Dispatcher
from logsdk.errors import ConfigError, LogSDKError


class Noop:
    def process(self, records: Sequence[Record]) -> None:
        pass


class Staging(Noop):
    """A transactional handler: process() only stages, commit() makes it durable."""

    def commit(self, offsets: dict[Any, int]) -> None:
        pass

    def rollback(self, error: BaseException) -> None:
        pass

    def stored_offsets(self, partitions: list[Any]) -> dict[Any, int]:
        return {}


BASE: dict[str, Any] = {
    "bootstrap_servers": "127.0.0.1:1",
    "group_id": "g",
    "topics": ["t"],
    "handler": Noop(),
}


def test_public_names() -> None:
    """The consumer's public names are exported from logsdk."""
    for name in ("LogConsumer", "Handler", "TransactionalHandler", "Record"):
        assert name in logsdk.__all__
        assert getattr(logsdk, name) is not None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bootstrap_servers": None}, "bootstrap_servers"),
        ({"group_id": None}, "group_id"),
        ({"topics": []}, "topics"),
        ({"topics": "t"}, "topics"),
        ({"handler": None}, "handler"),
        ({"handler": 42}, "process"),
        ({"ordering": "random"}, "ordering"),
        ({"semantics": "at_most_once"}, "semantics"),
        ({"executor": "gpu"}, "executor"),
        ({"workers": 0}, "workers"),
        ({"queue_size": 0}, "queue_size"),
        ({"max_retries": -1}, "max_retries"),
        ({"commit_interval": 0}, "commit_interval"),
        ({"dead_letter_topic": "t"}, "dead_letter_topic"),
        ({"semantics": "exactly_once"}, "TransactionalHandler"),
        # at-least-once never calls commit(): what process() staged would never be written
        ({"handler": Staging()}, "semantics='exactly_once'"),
        ({"kafka_config": {"enable.auto.commit": True}}, "managed by LogConsumer"),
        ({"rebalance": "sticky"}, "rebalance must be one of"),
        # Each property a protocol refuses (librdkafka 2.16 refuses the four of
        # group.protocol=consumer itself) or contradicts is named.
        *(
            ({"rebalance": "consumer", "kafka_config": {key: value}}, f"'{key}'.*rebalance")
            for key, value in (
                ("partition.assignment.strategy", "range"),
                ("session.timeout.ms", 3000),
                ("heartbeat.interval.ms", 300),
                ("group.protocol.type", "consumer"),
            )
        ),
        (
            {"rebalance": "eager", "kafka_config": {"group.remote.assignor": "uniform"}},
            "'group.remote.assignor'",
        ),
        (
            {"kafka_config": {"partition.assignment.strategy": "roundrobin"}},
            "'partition.assignment.strategy'.*rebalance='eager'",
        ),
        (
            {
                "rebalance": "eager",
                "kafka_config": {"partition.assignment.strategy": "range,cooperative-sticky"},
            },
            "'partition.assignment.strategy'.*rebalance='cooperative'",
        ),
        (
            {"kafka_config": {"group.protocol": "consumer"}},
            "'group.protocol'.*rebalance='consumer'",
        ),
        (
            {"rebalance": "consumer", "kafka_config": {"group.protocol": "classic"}},
            "'group.protocol'",
        ),
    ],
)
def test_bad_arguments_raise_config_error(change: dict[str, Any], message: str) -> None:
    """Each bad argument raises ConfigError naming what to change, before any I/O."""
    with pytest.raises(ConfigError, match=message):
        LogConsumer(**{**BASE, **change})


@pytest.mark.parametrize(
    ("rebalance", "kafka_config"),
    [
        ("eager", {}),
        ("eager", {"partition.assignment.strategy": "roundrobin", "session.timeout.ms": 3000}),
        ("eager", {"partition.assignment.strategy": "range, roundrobin"}),
        ("cooperative", {"partition.assignment.strategy": "cooperative-sticky"}),
        ("cooperative", {"group.protocol": "classic", "heartbeat.interval.ms": 300}),
        ("consumer", {"group.remote.assignor": "uniform", "group.protocol": "consumer"}),
    ],
)
def test_each_rebalance_protocol_takes_its_own_settings(
    rebalance: str, kafka_config: dict[str, Any]
) -> None:
    """What each protocol allows is accepted (the same value rebalance sets included), and
    ``stats()`` names the protocol."""
    c = LogConsumer(**{**BASE, "rebalance": rebalance, "kafka_config": kafka_config})
    assert c.stats()["rebalance"] == rebalance


def test_default_rebalance_is_cooperative() -> None:
    """Without ``rebalance``, the cooperative-sticky assignor of the classic protocol."""
    assert LogConsumer(**BASE).stats()["rebalance"] == "cooperative"


def test_function_handler_and_stop_before_start() -> None:
    """A plain function is a handler; stop() before start() is harmless; stats() works."""
    c = LogConsumer(**{**BASE, "handler": lambda r: None})
    assert c.stats()["state"] == "new"
    c.stop()
    with pytest.raises(LogSDKError, match="make a new one"):
        c.start()


def chunk(p: int, offsets: range, keys: list[bytes | None] | None = None) -> Chunk:
    recs = [
        Record("t", p, o, None if keys is None else keys[i % len(keys)], b"x")
        for i, o in enumerate(offsets)
    ]
    return Chunk(("t", p), 1, recs, len(recs))


def test_partition_lanes_are_exclusive() -> None:
    """A partition's next batch is not handed out while its previous one is in flight."""
    d = Dispatcher("partition", max_batch=10)
    d.put([chunk(0, range(0, 5)), chunk(0, range(5, 10)), chunk(1, range(0, 5))])
    b1 = d.take(0)
    b2 = d.take(0)
    assert b1 is not None
    assert b2 is not None
    assert {r.partition for r in b1.records} == {0}
    assert len(b1.records) == 10
    assert {r.partition for r in b2.records} == {1}
    assert d.take(0) is None
    assert d.held == 15
    d.done(b1)
    d.done(b2)
    assert d.held == 0


def test_key_lanes_keep_order_and_exclusivity() -> None:
    """Ordering 'key': one key's records are never in two in-flight batches."""
    d = Dispatcher("key", max_batch=3)
    d.put([chunk(0, range(0, 12), keys=[b"a", b"b", b"c", b"d"])])
    taken = [b for b in (d.take(0), d.take(0), d.take(0)) if b is not None]
    in_flight: dict[bytes | None, int] = {}
    for b in taken:
        for r in b.records:
            in_flight.setdefault(r.key, id(b))
            assert in_flight[r.key] == id(b), "a key is in two in-flight batches"
    for b in taken:
        d.done(b)
    order: dict[bytes | None, list[int]] = {}
    for b in taken:
        for r in b.records:
            order.setdefault(r.key, []).append(r.offset)
    while (b := d.take(0)) is not None:
        for r in b.records:
            order.setdefault(r.key, []).append(r.offset)
        d.done(b)
    assert order == {k: sorted(v) for k, v in order.items()}
    assert sum(len(v) for v in order.values()) == 12


def test_drop_removes_queued_records_of_revoked_partitions() -> None:
    """drop() forgets queued records of revoked partitions and frees their share of the bound."""
    d = Dispatcher("none", max_batch=100)
    d.put([chunk(0, range(0, 5)), chunk(1, range(0, 7))])
    assert d.drop({("t", 1)}) == 7
    assert d.held == 5
    b = d.take(0)
    assert b is not None
    assert {r.partition for r in b.records} == {0}
