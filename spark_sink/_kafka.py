"""The only spark_sink module that touches confluent-kafka: partition discovery, true end
offsets (driver) and reading one offset range into Arrow record batches (executors).

Clients are never pickled: the driver's is created on first use, the executor's inside
`read_range()`. No consumer group is joined and nothing is committed: offsets live
in Spark's checkpoint.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from logsdk._types import ClientConfig
from logsdk.errors import DataLossError, SourceUnavailableError, SparkSourceError
from spark_sink._options import TP, OffsetRange, SourceOptions

log = logging.getLogger("spark_sink")
#: librdkafka's own log lines, as logsdk's clients do: through Python logging, never on
#: the process's stderr. Set where each client is built (driver or executor), never in
#: the options, which are pickled to the executors.
rdlog = logging.getLogger("logsdk.librdkafka")

#: The Arrow schema of the rows read (matches `spark_sink._source.SCHEMA`).
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)

#: Rows per Arrow record batch yielded by read_range.
CHUNK = 8192

# librdkafka timestamp types -> Kafka's TimestampType ids, as Spark's source reports them.
_TS_TYPE = {1: 0, 2: 1}

# A topic listed with one of these errors does not exist (deleted, or never created).
# Any other error is a state of a topic that exists (no leader yet, a broker restarting,
# a request timed out): retried, never taken for a deletion.
_NO_SUCH_TOPIC = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


def consumer_config(options: SourceOptions, **extra: Any) -> ClientConfig:
    """librdkafka settings for an assign-only consumer (a throwaway group id, no commits)."""
    conf: ClientConfig = {
        "group.id": f"logsdk-spark-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        # Out of range must be seen, never silently reset: see read_range.
        "auto.offset.reset": "error",
    }
    conf.update(options.kafka)
    conf.update(extra)
    return conf


def new_consumer(conf: ClientConfig) -> Consumer:
    """A confluent-kafka consumer on ``conf`` whose librdkafka logs go to ``rdlog``."""
    return Consumer({**conf, "logger": rdlog})


def missing_topics_error(options: SourceOptions, missing: list[str]) -> SparkSourceError:
    """The error for topics named in option ``subscribe`` that do not exist."""
    return SparkSourceError(
        f"topic(s) {missing} named in option subscribe do not exist at "
        f"{options.bootstrap_servers}; create them first"
    )


class DriverClient:
    """Partition discovery and end offsets on the driver; created lazily, never pickled."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: Consumer | None = None

    def _get(self) -> Consumer:
        if self._consumer is None:
            # A short fetch wait: a long-poll fetch left in flight after unassign()
            # would hold the next metadata / ListOffsets request on the same
            # connection (measured: list_topics 0.4 s instead of 0.05 s).
            self._consumer = new_consumer(
                consumer_config(self.options, **{"fetch.wait.max.ms": 10})
            )
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def listing(self, timeout: float = 15.0) -> tuple[list[TP], list[str]]:
        """Every partition of the subscribed topics, and the topics named in option
        ``subscribe`` that the cluster does not have.

        A topic absent from the listing, or listed as unknown, is gone; one listed with
        any other error raises `SourceUnavailableError` (transient), so that a
        leader election or a broker restart is never taken for a deleted topic.
        """
        try:
            md = self._get().list_topics(timeout=timeout)
        except KafkaException as exc:
            raise SourceUnavailableError(
                f"cannot list topics at {self.options.bootstrap_servers} "
                f"(option kafka.bootstrap.servers): {exc}"
            ) from exc
        found: list[TP] = []
        unavailable: dict[str, str] = {}
        for name, topic in md.topics.items():
            if name.startswith("__") or not self.options.matches(name):
                continue
            if topic.error is not None:
                if topic.error.code() not in _NO_SUCH_TOPIC:
                    unavailable[name] = topic.error.str()
                continue
            found.extend((name, p) for p in topic.partitions)
        if unavailable:
            raise SourceUnavailableError(
                "the broker listed topic(s) of the subscription with an error, so their "
                "partitions are unknown for now (not deleted): "
                + ", ".join(f"{t}: {e}" for t, e in sorted(unavailable.items()))
            )
        missing = sorted(set(self.options.topics) - {t for t, _ in found})
        return sorted(found), missing

    def watermarks(self, tps: list[TP], timeout: float = 15.0) -> dict[TP, tuple[int, int]]:
        """``(earliest, true end)`` of each partition.

        ListOffsets "latest" alone is not trusted (the embedded broker answers the last
        batch's base offset + 1): the end is confirmed by reading from just before it to
        end-of-partition, which is also right on Apache Kafka.
        """
        consumer = self._get()
        marks: dict[TP, tuple[int, int]] = {}
        try:
            for tp in tps:
                marks[tp] = consumer.get_watermark_offsets(
                    TopicPartition(tp[0], tp[1]), timeout=timeout, cached=False
                )
        except KafkaException as exc:
            raise SourceUnavailableError(f"cannot read offsets of {tp[0]}[{tp[1]}]: {exc}") from exc
        todo = {tp: hi for tp, (lo, hi) in marks.items() if hi > lo}
        if todo:
            ends = self._confirm_ends(consumer, todo, marks, timeout)
            marks.update({tp: (marks[tp][0], ends[tp]) for tp in todo})
        return marks

    @staticmethod
    def _confirm_ends(
        consumer: Consumer,
        todo: dict[TP, int],
        marks: dict[TP, tuple[int, int]],
        timeout: float,
    ) -> dict[TP, int]:
        ends = dict(todo)
        consumer.assign(
            [TopicPartition(t, p, max(hi - 1, marks[(t, p)][0])) for (t, p), hi in todo.items()]
        )
        pending = set(todo)
        deadline = time.monotonic() + timeout
        try:
            while pending:
                if time.monotonic() > deadline:
                    raise SourceUnavailableError(
                        f"could not confirm the end offsets of {sorted(pending)} within {timeout}s"
                    )
                # consume() waits for all 10k or the timeout: keep the timeout short.
                for msg in consumer.consume(10_000, 0.02):
                    tp = (msg.topic() or "", msg.partition() or 0)
                    err = msg.error()
                    if err is None:
                        ends[tp] = max(ends[tp], (msg.offset() or 0) + 1)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        # EOF is judged against the fetch response's high watermark,
                        # which is right even where ListOffsets is not.
                        ends[tp] = max(ends[tp], msg.offset() or 0)
                        pending.discard(tp)
                    elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                        pending.discard(tp)  # truncated meanwhile: keep ListOffsets' answer
                    else:
                        raise SourceUnavailableError(f"reading the end of {tp[0]}[{tp[1]}]: {err}")
        finally:
            consumer.unassign()
        return ends


def data_loss(options: SourceOptions, message: str, *, instead: str | None = None) -> None:
    """Raise DataLossError, or with ``failOnDataLoss=false`` log a warning and go on.

    ``instead`` says what the source does then (default: skip the records).
    """
    if options.fail_on_data_loss:
        raise DataLossError(
            f"{message} (set failOnDataLoss=false to {instead or 'skip'} with a warning)"
        )
    log.warning("%s; %s (failOnDataLoss=false)", message, instead or "skipped")


def read_range(options: SourceOptions, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Read ``[rng.start, rng.end)`` of one partition as Arrow record batches.

    Assign + explicit offset; no group, no commit. Records deleted before they were
    read (offset out of range) fail the task with `DataLossError`, or with
    ``failOnDataLoss=false`` are skipped with a warning. Gaps inside the range
    (compaction, transaction markers) are normal and end at end-of-partition.
    """
    consumer = new_consumer(
        consumer_config(
            options, **{"fetch.message.max.bytes": 8 * 1024 * 1024, "fetch.wait.max.ms": 100}
        )
    )
    where = f"{rng.topic}[{rng.partition}]"
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        offsets: list[int] = []
        stamps: list[int | None] = []
        types: list[int] = []
        headers: list[Any] = []
        want_headers = options.include_headers
        last = rng.start - 1
        deadline = time.monotonic() + options.poll_timeout_s
        done = False
        while not done:
            # consume() returns after num messages or the timeout: asking for no more
            # than what is left of the range returns as soon as the range is complete.
            msgs = consumer.consume(max(1, min(CHUNK, rng.end - 1 - last)), 0.1)
            if not msgs and time.monotonic() > deadline:
                raise SparkSourceError(
                    f"no record of {where} arrived within kafkaConsumer.pollTimeoutMs "
                    f"({options.poll_timeout_s:.0f}s) while reading offsets "
                    f"{last + 1}..{rng.end - 1}"
                )
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True  # the rest of the range was gaps
                        break
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        low, high = consumer.get_watermark_offsets(
                            TopicPartition(rng.topic, rng.partition), timeout=10, cached=False
                        )
                        data_loss(
                            options,
                            f"{where}: offsets {last + 1}..{rng.end - 1} are out of range; "
                            f"the broker has {low}..{high - 1}",
                        )
                        if low >= rng.end or low <= last + 1:
                            done = True
                            break
                        consumer.assign([TopicPartition(rng.topic, rng.partition, low)])
                        last = low - 1
                        break
                    raise SparkSourceError(f"reading {where}: {err}")
                off = msg.offset() or 0
                if off >= rng.end:
                    done = True
                    break
                last = off
                keys.append(msg.key())
                values.append(msg.value())
                offsets.append(off)
                ts_type, ts = msg.timestamp()
                stamps.append(ts * 1000 if ts_type in _TS_TYPE else None)
                types.append(_TS_TYPE.get(ts_type, -1))
                if want_headers:
                    headers.append(msg.headers() or [])
            if msgs:
                deadline = time.monotonic() + options.poll_timeout_s
            if last >= rng.end - 1:
                done = True
            if (done or len(offsets) >= CHUNK) and offsets:
                yield _batch(rng, keys, values, offsets, stamps, types, headers, want_headers)
                keys, values, offsets, stamps, types, headers = [], [], [], [], [], []
    finally:
        consumer.close()


def _batch(
    rng: OffsetRange,
    keys: list[bytes | None],
    values: list[bytes | None],
    offsets: list[int],
    stamps: list[int | None],
    types: list[int],
    headers: list[Any],
    want_headers: bool,
) -> pa.RecordBatch:
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([rng.topic] * n, pa.string()),
            pa.array([rng.partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, pa.timestamp("us", tz="UTC")),
            pa.array(types, pa.int32()),
            pa.array(headers if want_headers else [None] * n, ARROW_SCHEMA.field("headers").type),
        ],
        schema=ARROW_SCHEMA,
    )
