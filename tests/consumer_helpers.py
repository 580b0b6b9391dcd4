"""Shared helpers for the LogConsumer tests: produce counted records, poll until a deadline."""

from __future__ import annotations

from collections.abc import Callable

from logsdk._types import ClientConfig
from tests.conftest import kafka_producer, wait_until

__all__ = ["produce", "wait_until"]


def produce(
    config: ClientConfig,
    topic: str,
    n: int,
    *,
    partitions: int,
    value_bytes: int = 100,
    key: Callable[[int], bytes | None] | None = None,
    value: Callable[[int], bytes] | None = None,
    producer_id: bytes = b"test-producer",
    start_seq: int = 0,
) -> None:
    """Produce ``n`` records round-robin over ``partitions`` with logsdk producer headers."""
    pad = b"x" * value_bytes
    with kafka_producer({**config, "linger.ms": 5, "enable.idempotence": True}) as p:
        for i in range(n):
            seq = start_seq + i
            p.produce(
                topic,
                value(seq) if value is not None else b"%d:" % seq + pad,
                key(seq) if key is not None else None,
                partition=seq % partitions,
                headers=[("logsdk.producer", producer_id), ("logsdk.seq", b"%d" % seq)],
            )
            if i % 1000 == 0:
                p.poll(0)
        left = p.flush(60)
        assert left == 0, f"{left} records not delivered"
