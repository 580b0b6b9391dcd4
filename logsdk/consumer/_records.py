"""The record a handler sees: plain Python values, never a confluent-kafka ``Message``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple, overload

#: (topic, partition): how partitions are named throughout the consumer.
TopicPartition = tuple[str, int]


@dataclass(slots=True)
class Record:
    """One Kafka record as handed to a [`Handler`][logsdk.Handler].

    Treat it as read-only: the consumer tracks offsets on its own, so changing a
    field changes nothing but what the handler itself sees. ``headers`` is a list of
    ``(name, value)`` pairs in wire order (names may repeat); ``timestamp`` is in
    milliseconds since the epoch, or None when the broker gave none.
    """

    topic: str
    """The topic the record was read from."""
    partition: int
    """Its partition."""
    offset: int
    """Its offset in the partition."""
    key: bytes | None
    """The record's key as written, or None."""
    value: bytes | None
    """The record's value as written (JSON from the logging adapters), or None."""
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    """``(name, value)`` pairs in wire order; logsdk's producers add ``logsdk.producer``
    and ``logsdk.seq`` (see [`header()`][logsdk.Record.header])."""
    timestamp: int | None = None
    """Milliseconds since the epoch, or None when the broker gave none."""

    def header(self, name: str) -> bytes | None:
        """The value of the last header called ``name``, or None."""
        for k, v in reversed(self.headers):
            if k == name:
                return v
        return None

    @property
    def topic_partition(self) -> TopicPartition:
        """``(topic, partition)``, the key of offset dictionaries."""
        return (self.topic, self.partition)


class RecordColumns(NamedTuple):
    """The fields of a batch of records, one sequence per [`Record`][logsdk.Record] attribute."""

    topics: Sequence[str]
    partitions: Sequence[int]
    offsets: Sequence[int]
    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]
    headers: Sequence[list[tuple[str, bytes]]]
    timestamps: Sequence[int | None]


_FIELDS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp")


def columns_of(records: Sequence[Record]) -> RecordColumns:
    """The columns of ``records``."""
    return RecordColumns(*(list(map(attrgetter(f), records)) for f in _FIELDS))


class RecordBatch(Sequence[Record]):
    """The records of one handler call, built from the fetched messages on first access.

    Handlers see it as a read-only ``Sequence[Record]``. The fetch thread only groups
    messages into batches; converting them (headers included) is done once, by the
    worker thread, the first time the handler reads them: as [`Record`][logsdk.Record] objects,
    or column by column (`columns()`, what SQLiteSink inserts). A handler that
    needs only ``len(records)`` never pays for it.
    """

    __slots__ = ("_columns", "_convert", "_items", "_records")

    def __init__(
        self, items: list[Any], convert: Callable[[list[Any]], RecordColumns] | None = None
    ) -> None:
        self._items = items
        self._convert = convert
        self._records: list[Record] | None = items if convert is None else None
        self._columns: RecordColumns | None = None

    def columns(self) -> RecordColumns:
        """The records' fields as columns (converted on the first call, then cached)."""
        cols = self._columns
        if cols is None:
            convert = self._convert
            cols = self._columns = (
                columns_of(self._items) if convert is None else convert(self._items)
            )
        return cols

    def materialize(self) -> list[Record]:
        """The records as a list (converted on the first call, then cached)."""
        records = self._records
        if records is None:
            records = self._records = list(map(Record, *self.columns()))
        return records

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...

    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        return self.materialize()[index]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.materialize())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordBatch):
            return self.materialize() == other.materialize()
        if isinstance(other, list):
            return self.materialize() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RecordBatch({self.materialize()!r})"
