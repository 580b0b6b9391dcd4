"""Small admin helpers for tests: create a topic and wait until it is usable."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from logsdk._fork import AdminClient, Consumer
from logsdk._types import ClientConfig
from logsdk.errors import BrokerError, ConfigError

log = logging.getLogger("logsdk.testing")
#: librdkafka's own log lines, as the producer's: through Python logging (captured by
#: pytest), never on stderr.
rdlog = logging.getLogger("logsdk.librdkafka")


def create_topic(
    bootstrap_servers: str,
    name: str,
    partitions: int = 3,
    *,
    replication_factor: int = 1,
    config: Mapping[str, str] | None = None,
    extra_config: Mapping[str, str | int | float | bool] | None = None,
    timeout: float = 20.0,
    exist_ok: bool = False,
) -> str:
    """Create ``name`` with ``partitions`` partitions and wait until every one has a leader.

    With ``exist_ok``, a topic that already exists (with any partition count) is fine.
    """
    if partitions < 1:
        raise ConfigError(f"partitions must be >= 1, got {partitions}")
    conf: ClientConfig = {"bootstrap.servers": bootstrap_servers}
    conf.update(extra_config or {})
    admin = AdminClient({**conf, "logger": rdlog})
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=dict(config or {}),
    )
    futures = admin.create_topics([topic], operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[name].result(timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        exists = isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS
        if not (exist_ok and exists):
            raise BrokerError(f"could not create topic {name!r}: {exc}") from exc
        partitions = 0  # keep whatever it has
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=5).topics.get(name)
        if (
            md is not None
            and md.error is None
            and (len(md.partitions) == partitions or (partitions == 0 and md.partitions))
            and all(p.leader >= 0 for p in md.partitions.values())
        ):
            return name
        time.sleep(0.05)
    raise BrokerError(f"topic {name!r} was created but not ready within {timeout}s")


def delete_topic(bootstrap_servers: str, name: str, *, timeout: float = 20.0) -> None:
    """Delete ``name`` and wait for the broker to confirm (the embedded broker then frees
    its records: a long benchmark keeps its memory flat by deleting what it measured)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "logger": rdlog})
    futures = admin.delete_topics([name], operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[name].result(timeout)
    except KafkaException as exc:
        raise BrokerError(f"could not delete topic {name!r}: {exc}") from exc


def read_topic(
    bootstrap_servers: str,
    topic: str,
    *,
    timeout: float = 60.0,
    idle: float = 0.0,
    extra_config: Mapping[str, str | int | float | bool] | None = None,
    stall_timeout: float | None = None,
) -> list[Message]:
    """Every record of ``topic`` from the beginning to the current end of each partition.

    Reads with ``assign`` (no consumer group, no commit) from offset 0 until each
    partition reports end-of-partition; ``idle`` keeps reading that many extra seconds
    after that, for records still on their way. Raises `BrokerError` past
    ``timeout``, or once no record arrived for ``stall_timeout`` seconds (a slow read
    that progresses goes on).

    Each partition is read from offset 0, not from the offset the broker answers to
    ListOffsets EARLIEST: the embedded broker (Tansu 0.6) answers that with the base
    offset of the batch it stored first, which is above 0 when two producers' first
    batches to a partition were stored out of order, and a read from there skips the
    records below it. Tansu never deletes records (memory or S3 storage, no retention,
    no DeleteRecords), so offset 0 is where every partition starts. A broker that did
    delete the start (retention, librdkafka's mock cluster) answers offset 0 with
    OFFSET_OUT_OF_RANGE and the read resets to its earliest offset
    (``auto.offset.reset``), which such a broker reports right.
    """
    conf: ClientConfig = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"logsdk-read-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        # Only for a start deleted under offset 0 (above): where the read goes then.
        "auto.offset.reset": "earliest",
    }
    conf.update(extra_config or {})
    consumer = Consumer({**conf, "logger": rdlog})
    try:
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            raise BrokerError(f"topic {topic!r} not found: {md.error if md else 'no metadata'}")
        parts = sorted(md.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Message] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        quiet_until: float | None = None
        last_record = time.monotonic()
        while True:
            now = time.monotonic()
            stalled = stall_timeout is not None and now - last_record > stall_timeout
            if now > deadline or stalled:
                why = f"no record for {stall_timeout}s" if stalled else f"after {timeout}s"
                raise BrokerError(
                    f"read_topic({topic!r}) timed out ({why}) with {len(out)} "
                    f"records; partitions at end: {sorted(at_end)} of {parts}; "
                    f"{_where(consumer, topic, parts)}"
                )
            if len(at_end) == len(parts):
                if quiet_until is None:
                    quiet_until = now + idle
                if now >= quiet_until:
                    return out
            for msg in consumer.consume(10_000, 0.2):
                err = msg.error()
                if err is None:
                    out.append(msg)
                    last_record = now
                    at_end.discard(msg.partition() or 0)
                    quiet_until = None
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition() or 0)
                else:
                    raise BrokerError(f"read_topic({topic!r}): {err}")
    finally:
        consumer.close()


def _where(consumer: Consumer, topic: str, parts: list[int]) -> str:
    """Each partition's read position against its log end, for a stalled read's error."""
    out = []
    try:
        positions = consumer.position([TopicPartition(topic, p) for p in parts])
        for tp in positions:
            low, high = consumer.get_watermark_offsets(tp, timeout=5, cached=False)
            out.append(f"p{tp.partition} at {tp.offset} of [{low}, {high})")
    except KafkaException as exc:
        out.append(f"positions unavailable: {exc}")
    return ", ".join(out)
