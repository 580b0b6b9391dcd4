"""Exactly-once sinks on the LogConsumer's ``TransactionalHandler`` protocol.

How Spark's batch id maps onto the protocol: each sink owns one pseudo-partition
``("spark-batch:<sink id>", 0)`` whose "next offset" is the next batch id to apply.
A batch is applied as ``process(records)`` then ``commit({pseudo: batch_id + 1})``, so
the handler stores the rows and the batch id in one transaction (SQLiteSink: one
SQLite transaction). Before applying, ``stored_offsets([pseudo])`` tells whether the
batch is already durable; if so it is skipped. This is what makes a batch replayed
after a crash (between the sink commit and Spark's checkpoint commit) harmless, and a
handler's compare-and-set on the pseudo-offset (SQLiteSink's fencing) refuses a
second writer of the same batch.

The ``logsdk-sink`` data source stages each task's rows as an Arrow IPC file under
``stagingDir/<sink id>/batch-<id>/`` (found by name, since a failed task's commit
message arrives as None) and applies the whole batch in the driver's ``commit``; the
``foreachBatch`` adapter applies ``df.toArrow()`` directly.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import TaskContext, cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from logsdk.consumer import Record, TransactionalHandler
from logsdk.errors import FencedError, SinkError, SparkSourceError
from spark_sink._staging import PREFIX, Staging

log = logging.getLogger("spark_sink")

#: Topic of the pseudo-partition that holds a sink's next batch id.
BATCH_TOPIC_PREFIX = "spark-batch:"

_KAFKA_COLUMNS = {"topic", "partition", "offset", "value"}
#: A row without the Kafka columns gets offset ``batch_id << ROW_BITS | row index``.
ROW_BITS = 32
#: Batch ids whose row offsets still fit a signed 64-bit offset.
_MAX_BATCH_ID = 1 << (63 - ROW_BITS)
_HANDLER_PREFIX = "cloudpickle:"
_SINK_OPTIONS = (
    "handler",
    "sqlite.path",
    "sqlite.table",
    "sqlite.dedupe",
    "sqlite.synchronous",
    "sinkid",
    "stagingdir",
)
# Options Spark itself passes on to a sink.
_SPARK_OWN = ("checkpointlocation", "path", "queryname")
#: SQLite's ``PRAGMA synchronous`` levels, as SQLiteSink takes them.
_SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def batch_partition(sink_id: str) -> tuple[str, int]:
    """The pseudo-partition whose stored offset is ``sink_id``'s next batch id."""
    return (BATCH_TOPIC_PREFIX + sink_id, 0)


def next_batch_id(handler: TransactionalHandler, sink_id: str) -> int:
    """The first batch id ``handler`` has not applied for ``sink_id`` (0 when none)."""
    pseudo = batch_partition(sink_id)
    return handler.stored_offsets([pseudo]).get(pseudo, 0)


def apply_batch(
    handler: TransactionalHandler,
    sink_id: str,
    batch_id: int,
    load: Callable[[], Sequence[Record]],
) -> bool:
    """Apply one Spark batch exactly once; False when it was already applied.

    ``load`` is only called for a batch not yet applied. Any failure rolls the
    handler back and propagates, so Spark aborts the batch and reruns it later.
    """
    pseudo = batch_partition(sink_id)
    stored = next_batch_id(handler, sink_id)
    if batch_id < stored:
        if batch_id < stored - 1:
            # Spark reruns only its last batch after a restart. An older one means another
            # query (a new checkpoint with this sink id): skipping it would drop its rows.
            raise SinkError(
                f"batch {batch_id} of sink {sink_id} is older than the last one it applied "
                f"({stored - 1}): the query is not the one that wrote this sink (a new "
                "checkpoint location with the same sink id?); give it a new sink id, or "
                "its old checkpoint"
            )
        log.info("batch %d of sink %s was already applied; skipped", batch_id, sink_id)
        return False
    try:
        handler.process(load())
        handler.commit({pseudo: batch_id + 1})
    except FencedError as exc:
        handler.rollback(exc)
        if batch_id < next_batch_id(handler, sink_id):
            # Another writer (a zombie of this query) applied it meanwhile: it is durable.
            log.warning("batch %d of sink %s was applied by another writer", batch_id, sink_id)
            return False
        raise
    except BaseException as exc:
        handler.rollback(exc)
        raise
    return True


def records_from_arrow(
    table: pa.Table | pa.RecordBatch, sink_id: str, *, batch_id: int, task: int
) -> list[Record]:
    """Rows as [`Record`][logsdk.Record].

    Rows with Spark's Kafka columns (``topic``, ``partition``, ``offset``, ``value``;
    optionally ``key``, ``timestamp``, ``headers``) become the records they were read
    as. Any other row becomes ``Record(topic=sink_id, partition=task,
    offset=batch_id << ROW_BITS | <index among the task's rows>, key=None,
    value=<the row as a JSON object>)``: ``task`` is the Spark task's partition id
    (unique within a batch), so no two rows of a sink ever share (topic, partition,
    offset). An identity that would not fit a 64-bit offset raises `SinkError`.
    """
    names = set(table.schema.names)
    n = table.num_rows
    if names >= _KAFKA_COLUMNS:
        cols = {c: table.column(c).to_pylist() for c in names & {*_KAFKA_COLUMNS, "key"}}
        keys = cols.get("key", [None] * n)
        stamps: list[Any] = [None] * n
        if "timestamp" in names:
            ts = table.column("timestamp")
            if pa.types.is_timestamp(ts.type):
                # Kafka keeps milliseconds: a finer timestamp is truncated, not refused
                # (a safe cast raises, and the batch would fail on every retry).
                ms = ts.cast(pa.timestamp("ms", tz="UTC"), safe=False)
                stamps = ms.cast(pa.int64()).to_pylist()
        headers: list[Any] = table.column("headers").to_pylist() if "headers" in names else []
        return [
            Record(
                topic=cols["topic"][i],
                partition=cols["partition"][i],
                offset=cols["offset"][i],
                key=keys[i],
                value=cols["value"][i],
                headers=[(h["key"], h["value"]) for h in headers[i] or ()] if headers else [],
                timestamp=stamps[i],
            )
            for i in range(n)
        ]
    if not 0 <= batch_id < _MAX_BATCH_ID or not 0 <= task < 1 << 31 or n > 1 << ROW_BITS:
        raise SinkError(
            f"sink {sink_id}: rows without the Kafka columns need an identity (batch id "
            f"{batch_id}, task {task}, {n} rows) and it does not fit: batch id must be "
            f"below {_MAX_BATCH_ID}, task below 2**31, rows per task at most 2**{ROW_BITS}; "
            "give the rows topic, partition, offset and value columns of their own"
        )
    base = batch_id << ROW_BITS
    return [
        Record(
            topic=sink_id,
            partition=task,
            offset=base + i,
            key=None,
            value=json.dumps(row, default=str, ensure_ascii=False).encode(),
        )
        for i, row in enumerate(table.to_pylist())
    ]


def encode_handler(handler: TransactionalHandler) -> str:
    """The value of the ``handler`` option of ``logsdk-sink`` for ``handler``.

    The handler is pickled (with Spark's cloudpickle) and unpickled in the driver's
    Python worker for every batch commit: it must be picklable and open its store
    lazily (SQLiteSink does).
    """
    if not isinstance(handler, TransactionalHandler):
        raise SparkSourceError(
            f"handler must be a TransactionalHandler (process, commit, rollback, "
            f"stored_offsets), got {type(handler).__name__}"
        )
    blob: bytes = cloudpickle.dumps(handler)  # type: ignore[no-untyped-call]
    return _HANDLER_PREFIX + base64.b64encode(blob).decode("ascii")


def _decode_handler(text: str) -> TransactionalHandler:
    if not text.startswith(_HANDLER_PREFIX):
        raise SparkSourceError(
            "option handler must come from spark_sink.encode_handler(handler) "
            "(or use the options sqlite.path, sqlite.table, sqlite.dedupe, sqlite.synchronous)"
        )
    try:
        handler = cloudpickle.loads(base64.b64decode(text[len(_HANDLER_PREFIX) :]))
    except Exception as exc:
        raise SparkSourceError(f"option handler cannot be unpickled here: {exc}") from exc
    if not isinstance(handler, TransactionalHandler):
        raise SparkSourceError("option handler does not hold a TransactionalHandler")
    return handler


@dataclass(frozen=True)
class SinkOptions:
    """Validated options of ``logsdk-sink``."""

    handler: str
    sink_id: str | None
    staging: Staging

    @staticmethod
    def parse(options: Mapping[str, str]) -> SinkOptions:
        """Check the options; raise `SparkSourceError` naming a bad one."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        for key in opts:
            if key not in _SINK_OPTIONS and key not in _SPARK_OWN and not key.startswith(PREFIX):
                raise SparkSourceError(
                    f"unknown option {key!r} for logsdk-sink; known options: handler "
                    "(from spark_sink.encode_handler), sqlite.path, sqlite.table, "
                    "sqlite.dedupe, sqlite.synchronous, sinkId, stagingDir, staging.* "
                    "(the staging filesystem's options)"
                )
        if ("handler" in opts) == ("sqlite.path" in opts):
            raise SparkSourceError("give exactly one of the options handler or sqlite.path")
        if "handler" in opts:
            ignored = sorted(k for k in opts if k.startswith("sqlite."))
            if ignored:
                raise SparkSourceError(
                    f"option(s) {', '.join(ignored)} apply only with sqlite.path; with handler, "
                    "configure the handler itself before spark_sink.encode_handler"
                )
        if "sqlite.path" in opts:
            from logsdk.sinks import SQLiteSink

            dedupe = opts.get("sqlite.dedupe", "false").lower()
            if dedupe not in ("true", "false"):
                raise SparkSourceError(f"option sqlite.dedupe must be true or false: {dedupe!r}")
            synchronous = opts.get("sqlite.synchronous", "NORMAL").strip().upper()
            if synchronous not in _SQLITE_SYNCHRONOUS:
                raise SparkSourceError(
                    f"option sqlite.synchronous must be one of {', '.join(_SQLITE_SYNCHRONOUS)} "
                    f"(SQLite's PRAGMA synchronous; FULL survives power loss), "
                    f"got {opts['sqlite.synchronous']!r}"
                )
            path = os.path.abspath(opts["sqlite.path"])
            # The constructor opens the database (creating file and tables, so a bad
            # path fails at start()); the pickled copy reconnects where it is used.
            with SQLiteSink(
                path,
                table=opts.get("sqlite.table", "records"),
                dedupe=dedupe == "true",
                synchronous=synchronous,
            ) as sink:
                handler = encode_handler(sink)
        else:
            handler = opts["handler"]
            _close(_decode_handler(handler))  # fail at start(), not at the first commit
        sink_id = opts.get("sinkid")
        if sink_id is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", sink_id):
            raise SparkSourceError(
                f"option sinkId must be 1-200 characters of [A-Za-z0-9._-], got {sink_id!r}"
            )
        where = opts.get("stagingdir") or str(Path(tempfile.gettempdir()) / "logsdk-spark")
        staging = Staging.parse(where, opts)
        staging.check()  # a root the driver cannot write fails at start()
        return SinkOptions(handler, sink_id, staging)


@dataclass
class StagedBatch(WriterCommitMessage):
    """What one write task staged: its file (None when it saw no row), row count, and
    the task's partition id (part of the identity of rows without Kafka columns)."""

    path: str | None
    rows: int
    sink_id: str
    task: int


class HandlerStreamWriter(DataSourceStreamArrowWriter):
    """Stages rows on the executors; applies each batch through the handler on the driver."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedBatch:
        """Write this task's rows to a staging file named by sink, batch, partition, attempt."""
        ctx = TaskContext.get()
        if ctx is None:
            raise SinkError("logsdk-sink write() ran outside a Spark task")
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        # Without sinkId the query id names the sink: it is kept in the checkpoint,
        # so a restarted query finds its own batches and a new query starts afresh.
        sink_id = self.options.sink_id or ctx.getLocalProperty("sql.streaming.queryId")
        if batch is None or sink_id is None:
            raise SinkError("logsdk-sink is a streaming sink: use df.writeStream, not df.write")
        staging = self.options.staging
        folder = staging.batch_dir(sink_id, int(batch))
        name = f"part-{ctx.partitionId()}-{ctx.attemptNumber()}-{uuid.uuid4().hex[:8]}.arrow"
        path, rows = staging.write(folder, name, iter(iterator))
        return StagedBatch(path or None, rows, sink_id, ctx.partitionId())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Apply the batch through the handler (once per batch id), then drop its files."""
        staged = [m for m in messages if isinstance(m, StagedBatch)]
        sink_id = self.options.sink_id or (staged[0].sink_id if staged else None)
        if sink_id is None:
            return  # no task ran: nothing to apply and no sink id to record it under
        handler = _decode_handler(self.options.handler)
        staging = self.options.staging
        try:
            files = [(m.path, m.task) for m in staged if m.path is not None]
            apply_batch(handler, sink_id, batchId, lambda: _load(staging, files, sink_id, batchId))
        finally:
            _close(handler)
        # Applied (or found applied): this batch's files and any left by older
        # aborted attempts are garbage now.
        staging.drop_through(sink_id, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Roll the handler back and drop the staged files that can be named."""
        handler = _decode_handler(self.options.handler)
        try:
            handler.rollback(SinkError(f"Spark aborted batch {batchId}"))
        finally:
            _close(handler)
        for sink_id in {m.sink_id for m in messages if isinstance(m, StagedBatch)}:
            self.options.staging.drop(self.options.staging.batch_dir(sink_id, batchId))


def _load(
    staging: Staging, files: list[tuple[str, int]], sink_id: str, batch_id: int
) -> list[Record]:
    """The records of a batch's staged files, given as (path, task's partition id)."""
    records: list[Record] = []
    for path, task in files:
        table = staging.read(path)
        records.extend(records_from_arrow(table, sink_id, batch_id=batch_id, task=task))
    return records


def _close(handler: object) -> None:
    close = getattr(handler, "close", None)
    if callable(close):
        close()


class HandlerSink(DataSource):
    """``df.writeStream.format("logsdk-sink")``: exactly-once into a TransactionalHandler.

    Options: ``handler`` (from [`encode_handler()`][spark_sink.encode_handler]) or ``sqlite.path``
    (with ``sqlite.table``, ``sqlite.dedupe``, ``sqlite.synchronous``: OFF, NORMAL (the
    default), FULL or EXTRA) for [`SQLiteSink`][logsdk.sinks.SQLiteSink];
    ``sinkId`` (default: the query id); ``stagingDir`` (default: the temp dir; on a
    cluster, storage the executors and the driver share: an ``s3://``, ``gs://`` or
    ``hdfs://`` URI) and ``staging.*``, its filesystem's options (see
    `spark_sink._staging`).
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SinkOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return "logsdk-sink"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return HandlerStreamWriter(self.parsed)


class ForeachBatchSink:
    """``df.writeStream.foreachBatch(ForeachBatchSink(handler, sink_id=...))``.

    Applies each batch exactly once through ``handler`` (same pseudo-partition rule as
    ``logsdk-sink``). ``transform`` maps the batch DataFrame first (e.g. a per-batch
    aggregation). Runs on the driver: the batch is collected with ``toArrow()``.
    """

    def __init__(
        self,
        handler: TransactionalHandler,
        *,
        sink_id: str,
        transform: Callable[[DataFrame], DataFrame] | None = None,
    ) -> None:
        if not isinstance(handler, TransactionalHandler):
            raise SparkSourceError(
                f"handler must be a TransactionalHandler, got {type(handler).__name__}"
            )
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", sink_id):
            raise SparkSourceError(
                f"sink_id must be 1-200 characters of [A-Za-z0-9._-], got {sink_id!r}"
            )
        self.handler = handler
        self.sink_id = sink_id
        self.transform = transform

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Apply one batch (Spark calls this with each micro-batch)."""

        def load() -> list[Record]:
            frame = self.transform(df) if self.transform is not None else df
            # The whole batch is one driver-side task: partition 0.
            return records_from_arrow(frame.toArrow(), self.sink_id, batch_id=batch_id, task=0)

        apply_batch(self.handler, self.sink_id, batch_id, load)
