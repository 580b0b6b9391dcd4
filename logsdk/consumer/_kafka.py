"""The thin typed wrapper over confluent-kafka: the only consumer module that touches it.

It turns ``Message`` objects into `Record` (lazily, see ``to_columns``),
``KafkaError``/``KafkaException`` into [`ConsumerError`][logsdk.errors.ConsumerError], and offsets
into ``(topic, partition)`` keys.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaTopicPartition

from logsdk import _fork
from logsdk._owner import Owner
from logsdk._types import ClientConfig
from logsdk.consumer._records import Record, RecordColumns, TopicPartition
from logsdk.errors import CommitMetadataTooLargeError, ConsumerError, DeadLetterError

log = logging.getLogger("logsdk.consumer")

#: Seconds `KafkaConsumerClient.close()` serves the revocation of its partitions from
#: ``poll()`` before it closes librdkafka's consumer (see ``_give_up_assignment``).
CLOSE_REVOKE_TIMEOUT_S = 10.0
#: librdkafka's own log lines, as the producer's (logsdk.producer._client): through
#: Python logging, served by the thread that polls the client, never on stderr.
rdlog = logging.getLogger("logsdk.librdkafka")

_msg_error = Message.error
_msg_partition = Message.partition
_msg_topic = Message.topic
_msg_offset = Message.offset
_msg_key = Message.key
_msg_value = Message.value
_msg_headers = Message.headers
_msg_timestamp = Message.timestamp
_first = itemgetter(0)
_second = itemgetter(1)

#: Called on assignment; may return where to start: ``{tp: offset}`` (None: per
#: ``auto.offset.reset``); partitions left out start at the committed offset.
AssignCallback = Callable[[list[TopicPartition]], "dict[TopicPartition, int | None]"]

# Errors that librdkafka recovers from by itself; counted and logged, never fatal.
_QUIET = {KafkaError._PARTITION_EOF}

#: What a member refused by its group because of the group's protocol is told.
_MIXED_PROTOCOLS = (
    "the group's members run another rebalance protocol (eager and cooperative assignors "
    "never share a group): this member waits outside it until they have left; give every "
    "member the same rebalance="
)
_NOT_CONVERTED = (
    "; the broker would not take this consumer-protocol member into its group: Kafka 4.1 "
    "refuses to convert a group of librdkafka's cooperative-sticky members ('userData from a "
    "custom assignor would be lost' in its log): stop every member of the group, then start "
    "them all with rebalance='consumer'"
)


def to_columns(msgs: list[Message]) -> RecordColumns:
    """The fields of fetched messages, column by column (C-level ``map`` calls)."""
    headers: list[Any] = list(map(_msg_headers, msgs))
    if None in headers:
        headers = [[] if h is None else h for h in headers]
    stamps = list(map(_msg_timestamp, msgs))
    if list(map(_first, stamps)).count(TIMESTAMP_NOT_AVAILABLE):
        timestamps = [None if kind == TIMESTAMP_NOT_AVAILABLE else ts for kind, ts in stamps]
    else:
        timestamps = list(map(_second, stamps))
    return RecordColumns(
        list(map(_msg_topic, msgs)),  # type: ignore[arg-type]
        list(map(_msg_partition, msgs)),  # type: ignore[arg-type]
        list(map(_msg_offset, msgs)),  # type: ignore[arg-type]
        list(map(_msg_key, msgs)),
        list(map(_msg_value, msgs)),
        headers,
        timestamps,
    )


def to_records(msgs: list[Message]) -> list[Record]:
    """Convert fetched messages to `Record` (what a handler sees)."""
    return list(map(Record, *to_columns(msgs)))


def message_bytes(msgs: list[Message]) -> int:
    """Bytes of the values and keys of ``msgs`` (what the queue's byte bound counts)."""
    nbytes = sum(map(len, msgs))  # len(Message) is the length of its value (0 if None)
    keys = list(map(_msg_key, msgs))
    nones = keys.count(None)
    if nones == 0:
        nbytes += sum(map(len, keys))  # type: ignore[arg-type]
    elif nones != len(keys):
        nbytes += sum(len(k) for k in keys if k is not None)
    return nbytes


class Run:
    """Consecutive fetched messages of one partition, in offset order."""

    __slots__ = ("first", "last", "msgs", "nbytes", "tp")

    def __init__(self, tp: TopicPartition, msgs: list[Message]) -> None:
        self.tp = tp
        self.msgs = msgs
        self.first: int = msgs[0].offset()  # type: ignore[assignment]
        self.last: int = msgs[-1].offset()  # type: ignore[assignment]
        self.nbytes = message_bytes(msgs)

    def offsets(self) -> list[int]:
        """Every message's offset (only needed when some must be filtered out)."""
        return list(map(_msg_offset, self.msgs))  # type: ignore[arg-type]

    def select(self, indexes: list[int]) -> Run:
        """The run of the messages at ``indexes`` (ascending, not empty)."""
        return Run(self.tp, [self.msgs[i] for i in indexes])

    def pieces(self, limit: int) -> list[Run]:
        """This run cut into runs of at most ``limit`` messages, in order."""
        msgs = self.msgs
        if len(msgs) <= limit:
            return [self]
        return [Run(self.tp, msgs[i : i + limit]) for i in range(0, len(msgs), limit)]


def unassign(consumer: Consumer, partitions: list[KafkaTopicPartition] | None = None) -> None:
    """End a revoke (or loss) in the rebalance callback itself: ``unassign()`` (eager), or
    ``incremental_unassign(partitions)`` (cooperative and consumer protocols).

    Left to confluent-kafka, its fallback first asks librdkafka for the rebalance
    protocol, a call that can block for ever inside ``close()`` (librdkafka issue 4041),
    and it does so holding the GIL: seen once in CI, the whole process hung in
    ``Consumer.close()`` -> rebalance_cb -> ``rd_kafka_rebalance_protocol``.
    """
    try:
        if partitions is None:
            consumer.unassign()
        else:
            consumer.incremental_unassign(partitions)
    except (KafkaException, RuntimeError) as exc:
        log.warning("unassign in the revoke callback failed: %s", exc)


def commit_failure(
    err: KafkaError | None,
    results: Sequence[KafkaTopicPartition],
    with_text: list[TopicPartition],
) -> ConsumerError | None:
    """What an offset commit's result means: None when it succeeded,
    `CommitMetadataTooLargeError` (the partitions whose text was refused, or
    ``with_text`` when librdkafka names none) or `ConsumerError`."""
    if err is not None and err.code() == KafkaError.OFFSET_METADATA_TOO_LARGE:
        return CommitMetadataTooLargeError(
            f"the broker refused offset commit metadata as too large: {err.str()}", with_text
        )
    failed = [(r, r.error) for r in results if r.error is not None]
    if failed and all(e.code() == KafkaError.OFFSET_METADATA_TOO_LARGE for _, e in failed):
        return CommitMetadataTooLargeError(
            f"the broker refused the commit metadata of {len(failed)} partition(s) as "
            "too large (offset.metadata.max.bytes)",
            [(r.topic, r.partition) for r, _ in failed],
        )
    if failed:
        r, e = failed[0]
        return ConsumerError(f"offset commit failed for {r.topic}[{r.partition}]: {e}")
    if err is not None:
        return ConsumerError(f"offset commit failed: {err.str()}")
    return None


class KafkaConsumerClient:
    """A confluent-kafka ``Consumer`` as the fetch thread uses it (call it from that thread).

    A librdkafka consumer is not to be shared by threads: it is owned by one thread
    (`owner`), checked at every method that calls into it while ownership is
    checked (`logsdk._owner`). The thread that builds it owns it until it hands it
    on (the fetcher hands it to the fetch thread before starting it, and takes it back
    once that thread has ended). The rebalance callbacks run inside `poll()` and
    `close()`, on the owner. ``errors`` and ``last_error`` are written by the owner
    only (published gauges: any thread may read them).

    ``incremental``: the group's protocol hands out deltas (cooperative-sticky, or the
    consumer group protocol): the callbacks get the partitions added or taken, and answer
    with ``incremental_assign`` / ``incremental_unassign``; else whole assignments,
    answered with ``assign`` / ``unassign`` (eager). ``on_commit`` gets the result of each
    asynchronous commit (None, or the error), inside `poll()`.
    """

    def __init__(
        self,
        config: ClientConfig,
        on_assign: AssignCallback,
        on_revoke: Callable[[list[TopicPartition]], None],
        on_lost: Callable[[list[TopicPartition]], None],
        start_paused: Callable[[], bool],
        *,
        incremental: bool = False,
        on_commit: Callable[[ConsumerError | None], None] | None = None,
    ) -> None:
        self._on_assign = on_assign
        self._incremental = incremental
        self._on_commit = on_commit or (lambda _error: None)
        # An incremental rebalance callback ran since take_rebalanced() last said so.
        self._rebalanced = False
        self._start_paused = start_paused
        reset = str(config.get("auto.offset.reset", "latest")).lower()
        self._reset = OFFSET_END if reset in ("latest", "largest", "end") else OFFSET_BEGINNING
        self._on_revoke = on_revoke
        self._on_lost = on_lost
        self.errors = 0
        self.last_error: str | None = None
        self._only_topic: str | None = None  # set by subscribe() for one topic by name
        self._closed = False
        self.owner = Owner(f"Kafka consumer of group {config.get('group.id')!r}")
        try:
            self._consumer = _fork.Consumer(
                {**config, "logger": rdlog, "on_commit": self._commit_cb}
            )
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConsumerError(f"bad kafka_config for the consumer: {exc}") from exc

    # -- rebalance callbacks (run inside consume() on the fetch thread) -------------------

    def _assign_cb(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        self.owner.check("serve an assignment")
        self._rebalanced = True
        if partitions:
            starts = self._on_assign([(p.topic, p.partition) for p in partitions])
            for p in partitions:
                tp = (p.topic, p.partition)
                if tp in starts:
                    start = starts[tp]
                    p.offset = self._reset if start is None else start
        # Answered here, never left to confluent-kafka's fallback (see unassign()); an
        # incremental protocol hands over only the partitions added (often none).
        if self._incremental:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        if not partitions:
            return
        # librdkafka keeps a partition's pause through unassign and assign: one paused
        # when it was last owned (the queue was full when it was revoked or lost) would
        # never be fetched again. Every new partition gets the fetcher's state now:
        # paused like the others while the queue is full, else resumed. Partitions kept
        # through an incremental rebalance keep the state the fetcher gave them.
        if self._start_paused():
            consumer.pause(partitions)
        else:
            consumer.resume(partitions)

    def _revoke_cb(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        self.owner.check("serve a revocation")
        self._rebalanced = True
        try:
            if partitions:
                self._on_revoke([(p.topic, p.partition) for p in partitions])
        finally:
            unassign(consumer, partitions if self._incremental else None)

    def _lost_cb(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        self.owner.check("serve a lost assignment")
        self._rebalanced = True
        try:
            if partitions:
                self._on_lost([(p.topic, p.partition) for p in partitions])
        finally:
            unassign(consumer, partitions if self._incremental else None)

    def subscribe(self, topics: Sequence[str]) -> None:
        self.owner.check("subscribe")
        try:
            self._consumer.subscribe(
                list(topics),
                on_assign=self._assign_cb,
                on_revoke=self._revoke_cb,
                on_lost=self._lost_cb,
            )
        except KafkaException as exc:
            raise ConsumerError(f"could not subscribe to {list(topics)}: {exc}") from exc
        # A name starting with ^ is a regex in librdkafka: it may match several topics.
        names = list(topics)
        self._only_topic = names[0] if len(names) == 1 and not names[0].startswith("^") else None

    # -- fetching -----------------------------------------------------------------------

    def poll(self, max_records: int, timeout: float) -> list[Run]:
        """Up to ``max_records`` records, as runs of consecutive records of one partition.

        Non-fatal errors are counted, fatal ones raise. The per-record work is done by
        C-level ``map`` calls; messages become records only when a handler reads them
        (`to_columns()`, through a `RecordBatch`).
        """
        self.owner.check("poll")
        try:
            msgs = self._consumer.consume(max_records, timeout)
        except KafkaException as exc:
            raise ConsumerError(f"consume failed: {exc}") from exc
        if not msgs:
            return []
        # One C-level pass, no list: None is false, a KafkaError true (never compare one
        # with None: its == raises).
        if any(map(_msg_error, msgs)):
            errors = list(map(_msg_error, msgs))
            for err in errors:
                if err is not None:
                    self._error(err)
            msgs = [m for m, err in zip(msgs, errors, strict=True) if err is None]
            if not msgs:
                return []
        n = len(msgs)
        partitions = list(map(_msg_partition, msgs))
        only = self._only_topic
        keys: list[Any] = partitions
        if only is None:
            topics = list(map(_msg_topic, msgs))
            if topics.count(topics[0]) != n:
                keys = list(zip(topics, partitions, strict=True))
        # Else one topic subscribed by name: every message is of it.
        runs: list[Run] = []
        i = 0
        for _, group in groupby(keys):
            j = i + len(list(group))
            run = msgs if i == 0 and j == n else msgs[i:j]
            topic = topics[i] if only is None else only
            runs.append(Run((topic, partitions[i]), run))  # type: ignore[arg-type]
            i = j
        return runs

    def _error(self, err: KafkaError) -> None:
        if err.code() in _QUIET:
            return
        self.errors += 1
        self.last_error = err.str()
        if err.fatal():
            hint = _NOT_CONVERTED if "ConsumerGroupHeartbeat" in err.str() else ""
            raise ConsumerError(f"fatal Kafka consumer error: {err.str()}{hint}")
        if err.code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL:
            log.warning(
                "consumer error (librdkafka retries it): %s: %s", err.str(), _MIXED_PROTOCOLS
            )
            return
        log.warning("consumer error (librdkafka retries it): %s", err.str())

    # -- flow control -------------------------------------------------------------------

    def assignment(self) -> list[TopicPartition]:
        self.owner.check("read the assignment")
        return [(p.topic, p.partition) for p in self._consumer.assignment()]

    def pause(self, tps: Sequence[TopicPartition]) -> None:
        self.owner.check("pause partitions")
        if tps:
            self._consumer.pause([KafkaTopicPartition(t, p) for t, p in tps])

    def resume(self, tps: Sequence[TopicPartition]) -> None:
        self.owner.check("resume partitions")
        if tps:
            self._consumer.resume([KafkaTopicPartition(t, p) for t, p in tps])

    def take_rebalanced(self) -> bool:
        """Whether an incremental rebalance callback ran since the last call.

        librdkafka pauses every assigned partition while such a callback waits and runs,
        and resumes them after it; a partition whose broker thread saw it paused is
        fetched again only when that thread next wakes, up to a second later (it is woken
        when a partition's fetch state changes, never by a resume: measured 0.6-0.9 s of
        no fetching for partitions that stayed). `restart_fetching()` wakes them."""
        self.owner.check("read the rebalance flag")
        rebalanced, self._rebalanced = self._rebalanced and self._incremental, False
        return rebalanced

    def restart_fetching(self, positions: dict[TopicPartition, int]) -> None:
        """Seek each partition to the offset it is at (the next one the consumer has not
        received): a seek without a leader epoch takes the partition through a change of
        fetch state, which wakes its broker thread, and fetching goes on at once. Each
        partition's messages fetched but not yet consumed were dropped by the pause
        already (librdkafka purges them when it pauses). A partition that cannot be
        sought now (its first fetch not started yet) is left as it is."""
        self.owner.check("restart fetching")
        for (topic, partition), offset in positions.items():
            try:
                self._consumer.seek(KafkaTopicPartition(topic, partition, offset))
            except KafkaException as exc:
                log.debug("no seek to restart %s[%d]: %s", topic, partition, exc)

    def seek(self, tp: TopicPartition, offset: int | None) -> None:
        """Fetch ``tp`` from ``offset`` next (None: per ``auto.offset.reset``)."""
        self.owner.check("seek")
        if offset is None:
            offset = self._reset
        try:
            self._consumer.seek(KafkaTopicPartition(tp[0], tp[1], offset))
        except KafkaException as exc:
            raise ConsumerError(f"could not seek {tp} to {offset}: {exc}") from exc

    # -- offsets --------------------------------------------------------------------------

    def commit(
        self, offsets: dict[TopicPartition, tuple[int, str | None]], asynchronous: bool
    ) -> None:
        """Commit ``{tp: (next offset, metadata)}``; raises ConsumerError if it fails.

        ``asynchronous``: returns once the request is queued; its result goes to the
        ``on_commit`` callback, served by a later `poll()`."""
        self.owner.check("commit offsets")
        if not offsets:
            return
        tps = [
            KafkaTopicPartition(t, p, off, metadata=md) if md else KafkaTopicPartition(t, p, off)
            for (t, p), (off, md) in offsets.items()
        ]
        with_text = [tp for tp, (_, md) in offsets.items() if md]
        try:
            if asynchronous:
                self._consumer.commit(offsets=tps, asynchronous=True)
                return
            result = self._consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            failure = commit_failure(err if isinstance(err, KafkaError) else None, [], with_text)
            if isinstance(failure, CommitMetadataTooLargeError):
                raise failure from exc
            raise ConsumerError(f"offset commit failed: {exc}") from exc
        failure = commit_failure(None, result, with_text)
        if failure is not None:
            raise failure

    def _commit_cb(self, err: KafkaError | None, partitions: list[KafkaTopicPartition]) -> None:
        """The result of an asynchronous commit (served inside `poll()`)."""
        self.owner.check("serve a commit result")
        # librdkafka names no partition when the whole request failed: all of them.
        everyone = [(p.topic, p.partition) for p in partitions]
        self._on_commit(commit_failure(err, partitions, everyone))

    def committed(
        self, tps: Sequence[TopicPartition], timeout: float
    ) -> dict[TopicPartition, tuple[int | None, str | None]]:
        """Committed ``{tp: (offset or None, metadata or None)}`` read from the broker."""
        self.owner.check("read committed offsets")
        if not tps:
            return {}
        try:
            got = self._consumer.committed([KafkaTopicPartition(t, p) for t, p in tps], timeout)
        except KafkaException as exc:
            raise ConsumerError(f"could not read committed offsets: {exc}") from exc
        out: dict[TopicPartition, tuple[int | None, str | None]] = {}
        for r in got:
            off = r.offset if r.offset >= 0 and r.offset != OFFSET_INVALID else None
            out[(r.topic, r.partition)] = (off, r.metadata or None)
        return out

    def high_watermark(self, tp: TopicPartition) -> int | None:
        """The high watermark last seen in a fetch response (no broker round trip)."""
        self.owner.check("read a high watermark")
        try:
            lo_hi: Any = self._consumer.get_watermark_offsets(
                KafkaTopicPartition(tp[0], tp[1]), cached=True
            )
        except KafkaException:
            return None
        if not lo_hi or lo_hi[1] < 0:
            return None
        return int(lo_hi[1])

    def close(self) -> None:
        """Leave the group (revoke callbacks run) and free the handle; once only."""
        self.owner.check("close")
        if self._closed:
            return
        self._closed = True
        try:
            self._give_up_assignment(CLOSE_REVOKE_TIMEOUT_S)
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("consumer close failed: %s", exc)

    def _give_up_assignment(self, timeout: float) -> None:
        """Leave the group with ``unsubscribe()`` and serve the revocation from ``poll()``
        (at most ``timeout`` seconds), so that ``close()`` finds nothing to revoke.

        A revocation served inside ``close()`` can wait for ever: the rebalance callback's
        ``unassign()`` sends librdkafka's group thread a request, and inside
        ``rd_kafka_consumer_close`` no answer came (seen in the rebalance benchmark, eager
        protocol, py-spy: ``Consumer_close`` -> ``rd_kafka_consumer_close0`` -> rebalance
        callback -> ``Consumer_unassign`` -> ``rd_kafka_op_req``, five minutes; a member
        of the rebalance test did not leave 30 s after SIGTERM). Records ``poll()``
        returns meanwhile are dropped: nothing commits them (offsets are committed for
        processed records only), the next owner reads them."""
        consumer = self._consumer
        if not consumer.assignment():
            return
        consumer.unsubscribe()
        deadline = time.monotonic() + timeout
        while consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.05)

    @property
    def closed(self) -> bool:
        """True once `close()` ran."""
        return self._closed


class DeadLetterProducer:
    """Writes poison records to the dead-letter topic, synchronously, one at a time."""

    def __init__(self, config: ClientConfig) -> None:
        try:
            self._producer: Producer | None = _fork.Producer({**config, "logger": rdlog})
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConsumerError(f"bad kafka_config for the dead-letter producer: {exc}") from exc

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        timeout: float,
    ) -> None:
        """Produce one record and wait for its acknowledgement, up to ``timeout`` seconds."""
        producer = self._producer
        if producer is None:
            raise DeadLetterError(f"could not write to dead-letter topic {topic!r}: closed")
        result: list[KafkaError | None] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            result.append(err)

        try:
            producer.produce(
                topic,
                value,
                key,
                headers=list[tuple[str, str | bytes | None]](headers),
                on_delivery=on_delivery,
            )
            producer.flush(timeout)
        except (KafkaException, BufferError) as exc:
            raise DeadLetterError(f"could not write to dead-letter topic {topic!r}: {exc}") from exc
        if not result:
            raise DeadLetterError(
                f"dead-letter topic {topic!r} did not acknowledge within {timeout}s"
            )
        if result[0] is not None:
            raise DeadLetterError(f"dead-letter topic {topic!r} rejected a record: {result[0]}")

    def close(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` for what is in flight, then free the client and its
        threads (a client left to the garbage collector would run on until collected)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(timeout)
