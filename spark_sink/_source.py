"""The ``logsdk-kafka`` Python data source: stream and batch reader over confluent-kafka.

Offsets are planned on the driver (the reader instance Spark keeps in its source
runner process) and each ``[start, end)`` range is read on an executor by
`spark_sink._kafka.read_range()`. The reader is pickled to the executors, so it
holds no client: the driver's is created on first use and dropped in ``__getstate__``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

try:  # pyspark >= 4.2
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older 4.x: availableNow reads what latestOffset says

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in on pyspark versions without the mixin."""


from logsdk.errors import SourceUnavailableError, SparkSourceError
from spark_sink._kafka import DriverClient, data_loss, missing_topics_error, read_range
from spark_sink._options import (
    EARLIEST,
    LATEST,
    TP,
    OffsetRange,
    SourceOptions,
    from_json_dict,
    limit_end,
    parse_source_options,
    split_ranges,
    to_json_dict,
)

log = logging.getLogger("spark_sink")

#: Seconds an answer of marks() is reused (see _Planner.marks).
FRESH_S = 1.0

T = TypeVar("T")

#: Columns as Spark's own Kafka source has them (headers always included).
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int, "
    "headers array<struct<key: string, value: binary>>"
)


class KafkaInputPartition(InputPartition):
    """One offset range, read by one Spark task."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.range = rng


class _Planner:
    """What both readers share: the lazily created driver client and offset resolution."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: DriverClient | None = None
        # (when, marks, topics named in subscribe that the cluster does not have)
        self._marks: tuple[float, dict[TP, tuple[int, int]], list[str]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # librdkafka handles cannot be pickled
        state["_marks"] = None
        return state

    @property
    def client(self) -> DriverClient:
        if self._client is None:
            self._client = DriverClient(self.options)
        return self._client

    def marks(self) -> dict[TP, tuple[int, int]]:
        """``(earliest, true end)`` of every subscribed partition, at most FRESH_S old;
        raises when a topic named in ``subscribe`` does not exist.

        Spark calls initialOffset, prepareForTriggerAvailableNow and latestOffset back
        to back; reusing an answer a moment old is safe (offsets only grow, and the
        next trigger reads the rest) and saves a round of I/O each time.
        """
        marks, missing = self.marks_and_missing()
        if missing:
            raise missing_topics_error(self.options, missing)
        return marks

    def marks_and_missing(self) -> tuple[dict[TP, tuple[int, int]], list[str]]:
        """`marks()`, and the named topics that do not exist instead of an error."""
        now = time.monotonic()
        if self._marks is None or now - self._marks[0] > FRESH_S:

            def ask() -> tuple[dict[TP, tuple[int, int]], list[str]]:
                found, missing = self.client.listing()
                return self.client.watermarks(found), missing

            fresh, missing = self._retrying(ask)
            self._marks = (time.monotonic(), fresh, missing)
        return dict(self._marks[1]), list(self._marks[2])

    def _retrying(self, ask: Callable[[], T]) -> T:
        """``ask()``, asked again after a transient error (``fetchOffset.numRetries``
        times, ``fetchOffset.retryIntervalMs`` apart), as Spark's Kafka source does."""
        retries, pause = self.options.fetch_retries, self.options.retry_interval_s
        attempt = 0
        while True:
            try:
                return ask()
            except SourceUnavailableError as exc:
                if attempt >= retries:
                    raise SourceUnavailableError(
                        f"{exc} (asked {attempt + 1} times, {pause:g}s apart: options "
                        "fetchOffset.numRetries, fetchOffset.retryIntervalMs)"
                    ) from exc
                attempt += 1
                log.warning(
                    "%s; asking again in %gs (retry %d of %d)", exc, pause, attempt, retries
                )
                time.sleep(pause)  # a backoff between requests, not a wait for an event

    def resolve(
        self, given: str | dict[TP, int], marks: Mapping[TP, tuple[int, int]], name: str
    ) -> dict[TP, int]:
        """Concrete offsets for ``earliest`` / ``latest`` / JSON (-2, -1 resolved)."""
        if isinstance(given, dict):
            unknown = sorted(tp for tp in given if tp not in marks)
            if unknown:
                raise SparkSourceError(
                    f"option {name} names partitions that do not exist: "
                    + ", ".join(f"{t}[{p}]" for t, p in unknown)
                )
            # As Spark's Kafka source: a partition left out would be read from nowhere
            # (an ending offset) or from a guess; say so instead.
            unnamed = sorted(tp for tp in marks if tp not in given)
            if unnamed:
                raise SparkSourceError(
                    f"option {name} must give an offset (-2: earliest, -1: latest) for every "
                    "partition of the subscribed topics; it leaves out "
                    + ", ".join(f"{t}[{p}]" for t, p in unnamed)
                )
        out: dict[TP, int] = {}
        for tp, (low, end) in marks.items():
            want = given[tp] if isinstance(given, dict) else given  # every tp is named
            if want in ("earliest", EARLIEST):
                out[tp] = low
            elif want in ("latest", LATEST):
                out[tp] = end
            else:
                out[tp] = int(want)
        return out

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def plan(
        self, start: Mapping[TP, int], end: Mapping[TP, int], *, rewound_from_earliest: bool = False
    ) -> list[KafkaInputPartition]:
        """Input partitions for ``[start, end)``; new partitions start at their earliest.

        With ``rewound_from_earliest`` (a stream) an end below its start is a partition
        whose offsets went back (see ``_settle``): it is read from its earliest offset
        up to that end. Otherwise such a partition reads nothing.
        """
        begin = dict(start)
        missing = [tp for tp in end if tp not in start]
        rewound = [tp for tp in end if tp in start and end[tp] < start[tp]]
        ask = missing + (rewound if rewound_from_earliest else [])
        if ask:
            marks = self._retrying(lambda: self.client.watermarks(ask))
            begin.update({tp: marks[tp][0] for tp in ask})
        ranges = []
        for tp, until in sorted(end.items()):
            frm = begin[tp]
            if tp in rewound and rewound_from_earliest:
                log.info("%s[%d]: offsets went back: reading %d..%d", *tp, frm, until - 1)
            if until < frm:
                log.info("%s[%d]: end %d is below the start %d; nothing read", *tp, until, frm)
                continue
            ranges.append(OffsetRange(tp[0], tp[1], frm, until))
        return [KafkaInputPartition(r) for r in split_ranges(ranges, self.options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition)
        return read_range(self.options, partition.range)


class KafkaStreamReader(_Planner, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader: admission control, availableNow, new partitions picked up."""

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        self._target: dict[TP, tuple[int, int]] | None = None

    def initialOffset(self) -> dict[str, dict[str, int]]:
        """Where a new query starts (``startingOffsets``, default latest).

        An offset given past a partition's end is data loss; with ``failOnDataLoss=false``
        that partition starts at its end (as in Spark's Kafka source).
        """
        marks = self.marks()
        start = self.resolve(self.options.starting or "latest", marks, "startingOffsets")
        for tp, (low, end) in sorted(marks.items()):
            if start[tp] > end:
                data_loss(
                    self.options,
                    f"{tp[0]}[{tp[1]}]: offset {start[tp]} is past the end {end} (option "
                    f"startingOffsets); offsets {low}..{end - 1} are available",
                    instead=f"start at the end {end}",
                )
                start[tp] = end
        return to_json_dict(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as a row limit, or everything available."""
        n = self.options.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target: records that arrive after this call are left to the next run."""
        self._target = self.marks()

    def _settle(self, begin: dict[TP, int], marks: Mapping[TP, tuple[int, int]]) -> dict[TP, int]:
        """Where each partition of ``marks`` can go: its end, never back from ``begin``.

        Fills ``begin`` for new partitions (their earliest offset). A start past the end
        means the partition's offsets went back (the topic was deleted and re-created
        between two triggers, or its log was truncated): data loss, since records of
        the old log not yet read are gone. With ``failOnDataLoss=false`` the partition
        is read from its earliest offset: the end returned is then below the start,
        which ``plan`` reads as "from earliest". The records of a re-created topic are
        not skipped; a truncated log is read again from its start (duplicates, no loss).
        """
        latest: dict[TP, int] = {}
        for tp, (low, end) in marks.items():
            if tp not in begin:
                log.info("new partition %s[%d]: read from its earliest offset %d", *tp, low)
                begin[tp] = low
            elif begin[tp] > end:
                data_loss(
                    self.options,
                    f"{tp[0]}[{tp[1]}]: offset {begin[tp]} is past the end {end}: its offsets "
                    f"went back (topic deleted and re-created?); records of the old log not "
                    f"yet read are gone; offsets {low}..{end - 1} are available",
                    instead=f"read it from its earliest offset {low}",
                )
                begin[tp] = low
            latest[tp] = max(begin[tp], end)
        return latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """The end of the next batch: the true end of every partition, capped by ``limit``."""
        begin = from_json_dict(start)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self._target is not None:
            # availableNow needs no I/O past prepareForTriggerAvailableNow: the target
            # is what exists; partitions found later wait for the next run.
            latest = self._settle(begin, self._target)
            for tp in begin:
                latest.setdefault(tp, begin[tp])
            return to_json_dict(limit_end(begin, latest, max_rows))
        marks, missing = self.marks_and_missing()
        never_read = sorted(set(missing) - {t for t, _ in begin})
        if never_read:
            raise missing_topics_error(self.options, never_read)
        # A topic named in subscribe and deleted since it was read is gone like any other.
        for tp in sorted(set(begin) - set(marks)):
            data_loss(self.options, f"{tp[0]}[{tp[1]}] is gone (topic deleted?)")
            del begin[tp]
        return to_json_dict(limit_end(begin, self._settle(begin, marks), max_rows))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Ranges ``[start, end)`` per partition, split per ``minPartitions``."""
        return self.plan(from_json_dict(start), from_json_dict(end), rewound_from_earliest=True)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one range on an executor (assign + seek, Arrow record batches)."""
        return _Planner.read(self, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, never in Kafka."""

    def stop(self) -> None:
        """Close the driver's client."""
        _Planner.stop(self)


class KafkaBatchReader(_Planner, DataSourceReader):
    """Batch reader: ``startingOffsets`` (default earliest) to ``endingOffsets`` (latest)."""

    def partitions(self) -> Sequence[InputPartition]:
        """Plan every range now (true end offsets confirmed by reading)."""
        marks = self.marks()
        start = self.resolve(self.options.starting or "earliest", marks, "startingOffsets")
        end = self.resolve(self.options.ending, marks, "endingOffsets")
        try:
            return self.plan(start, end)
        finally:
            self.stop()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one range on an executor."""
        return _Planner.read(self, partition)


class KafkaSource(DataSource):
    """``spark.readStream.format("logsdk-kafka")`` (and ``spark.read``).

    Options are checked here, so a bad one fails ``load()`` with a
    [`SparkSourceError`][logsdk.errors.SparkSourceError] that names it.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = parse_source_options(options)

    @classmethod
    def name(cls) -> str:
        return "logsdk-kafka"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(self.parsed)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(self.parsed)
