"""What a LogConsumer calls: the ``Handler`` and ``TransactionalHandler`` protocols."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from logsdk.consumer._records import Record, TopicPartition


@runtime_checkable
class Handler(Protocol):
    """Processes batches of records (at-least-once).

    ``process`` may be called from several worker threads at once, each with a
    different batch; with ``ordering="partition"`` a partition's batches never run
    concurrently, with ``ordering="key"`` a key's records never do. Raising marks the
    batch failed: its records then run one at a time, and a record that fails alone is
    retried with backoff up to ``max_retries`` times, then goes to the dead-letter topic
    (or stops the consumer when there is none).
    """

    def process(self, records: Sequence[Record]) -> None:
        """Handle a batch of records; return normally only once they are handled."""


@runtime_checkable
class TransactionalHandler(Handler, Protocol):
    """A handler for ``semantics="exactly_once"``: results and offsets made durable together.

    For each batch (one partition's records, in offset order) the same worker thread
    calls ``process(records)`` and then ``commit(offsets)``; if either raises, or the
    partition was revoked meanwhile, it calls ``rollback(error)`` instead, and the
    batch is retried from ``stored_offsets``. Different partitions' batches run in
    parallel on different threads, so an implementation keeps per-thread (or
    per-partition) transaction state and must be thread-safe.
    """

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Make the last ``process`` batch and ``offsets`` (next offset to read) durable at once.

        Raise [`FencedError`][logsdk.errors.FencedError] when the store shows another owner has
        moved the partition on (a zombie commit): the batch is then rolled back.
        """

    def rollback(self, error: BaseException) -> None:
        """Undo whatever the last ``process`` batch on this thread did; ``error`` says why."""

    def stored_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The next offset to read for each partition, from the handler's own store.

        A partition missing from the result starts per ``auto.offset.reset``.
        """
