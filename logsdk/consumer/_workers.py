"""The bounded queue (a dispatcher of ordered lanes) and the worker pool that drains it.

Ordering is enforced by *lanes*: a lane's records are taken in order, and an exclusive
lane is never taken by two workers at once. ``partition``: one lane per partition;
``key``: one lane per (topic, key) (records without a key use their partition's lane);
``none``: one shared, non-exclusive lane. Exactly-once always uses partition lanes and
one partition per batch, so a single stored offset per partition is exact.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

from logsdk.consumer._handler import Handler
from logsdk.consumer._kafka import DeadLetterProducer
from logsdk.consumer._offsets import Chunk, OffsetMap
from logsdk.consumer._records import Record, RecordBatch, TopicPartition
from logsdk.errors import ConfigError, ConsumerError, FencedError, PoisonRecordError

log = logging.getLogger("logsdk.consumer")

Ordering = Literal["partition", "key", "none"]

#: Headers added to a record written to the dead-letter topic.
DLT_HEADERS = (
    "logsdk.dlt.error",
    "logsdk.dlt.error_type",
    "logsdk.dlt.topic",
    "logsdk.dlt.partition",
    "logsdk.dlt.offset",
    "logsdk.dlt.attempts",
)


class Counters:
    """Thread-safe counters behind ``LogConsumer.stats()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, int] = defaultdict(int)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.values[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.values)

    def copied_in_child(self) -> Counters:
        """In a forked child (one thread runs, so the values are read without the lock,
        which a thread of the parent may have held at the fork): a copy with a lock of
        its own."""
        copy = Counters()
        copy.values.update(self.values)
        return copy


class Batch:
    """Records a worker took, with what to release and complete when it is done."""

    __slots__ = ("lanes", "nbytes", "parts", "records")

    def __init__(self) -> None:
        self.records: RecordBatch = _EMPTY
        self.parts: list[tuple[Chunk, int]] = []  # (chunk, how many of its records)
        self.lanes: list[Hashable] = []  # exclusive lanes to release
        self.nbytes = 0


_EMPTY = RecordBatch([])


class Dispatcher:
    """The bounded queue between the fetch thread and the workers.

    ``held`` counts records queued *or* being processed, so the bound the fetch thread
    enforces on it is a bound on everything the consumer holds in memory.
    """

    def __init__(self, ordering: Ordering, max_batch: int) -> None:
        self._ordering = ordering
        self._max_batch = max_batch
        lock = threading.Lock()
        # Workers wait on _cond for a ready lane; the fetch thread waits on _changed for
        # held records to go down or in-flight work to finish. Separate conditions (one
        # lock), so finishing a batch wakes one worker per lane it frees, not all of them.
        self._cond = threading.Condition(lock)
        self._changed = threading.Condition(lock)
        self._lanes: dict[Hashable, deque[Any]] = {}
        self._ready: deque[Hashable] = deque()
        self._busy: set[Hashable] = set()
        self._inflight: dict[TopicPartition, int] = defaultdict(int)
        self.held = 0
        self.held_bytes = 0
        self.max_held = 0
        self.max_held_bytes = 0
        self.closed = False

    def put(self, chunks: Sequence[Chunk]) -> None:
        with self._cond:
            for chunk in chunks:
                if self._ordering == "key":
                    for r in chunk.records:
                        lane: Hashable = chunk.tp if r.key is None else (r.topic, r.key)
                        self._append(lane, (r, chunk))
                else:
                    self._append(chunk.tp if self._ordering == "partition" else None, chunk)
                self.held += chunk.count
                self.held_bytes += chunk.nbytes
            self.max_held = max(self.max_held, self.held)
            self.max_held_bytes = max(self.max_held_bytes, self.held_bytes)
            self._cond.notify(len(chunks))

    def _append(self, lane: Hashable, item: Any) -> None:
        q = self._lanes.get(lane)
        if q is None:
            q = self._lanes[lane] = deque()
            if lane not in self._busy:
                self._ready.append(lane)
        q.append(item)

    def take(self, timeout: float) -> Batch | None:
        """The next batch, or None after ``timeout`` or once closed."""
        with self._cond:
            if not self._ready and not self.closed:
                self._cond.wait(timeout)
            if self.closed or not self._ready:
                return None
            batch = Batch()
            if self._ordering == "key":
                self._take_records(batch)
            else:
                self._take_chunks(batch)
            for chunk, n in batch.parts:
                self._inflight[chunk.tp] += n
            return batch

    def _take_chunks(self, batch: Batch) -> None:
        lane = self._ready.popleft()
        q = self._lanes[lane]
        limit = self._max_batch
        chunk: Chunk = q.popleft()
        items, convert, n = chunk.items, chunk.convert, chunk.count
        batch.parts.append((chunk, n))
        batch.nbytes += chunk.nbytes
        while q and n + q[0].count <= limit and q[0].convert is convert:
            if len(batch.parts) == 1:
                items = list(items)  # the chunk's own list stays as it is
            chunk = q.popleft()
            items.extend(chunk.items)
            n += chunk.count
            batch.parts.append((chunk, chunk.count))
            batch.nbytes += chunk.nbytes
        batch.records = RecordBatch(items, convert)
        if lane is None:  # the shared lane of ordering="none" is never exclusive
            if q:
                self._ready.appendleft(lane)
                self._cond.notify()
            else:
                del self._lanes[lane]
            return
        self._busy.add(lane)
        batch.lanes.append(lane)
        if not q:
            del self._lanes[lane]

    def _take_records(self, batch: Batch) -> None:
        counts: dict[int, list[Any]] = {}
        limit = self._max_batch
        records: list[Record] = []
        while self._ready and len(records) < limit:
            lane = self._ready.popleft()
            q = self._lanes[lane]
            while q and len(records) < limit:
                record, chunk = q.popleft()
                records.append(record)
                entry = counts.get(id(chunk))
                if entry is None:
                    counts[id(chunk)] = [chunk, 1]
                else:
                    entry[1] += 1
                batch.nbytes += _size(record)
            self._busy.add(lane)
            batch.lanes.append(lane)
            if not q:
                del self._lanes[lane]
        batch.parts = [(c, n) for c, n in counts.values()]
        batch.records = RecordBatch(records)

    def done(self, batch: Batch) -> None:
        """Release the batch's lanes and its share of the bound."""
        with self._cond:
            ready = 0
            for lane in batch.lanes:
                self._busy.discard(lane)
                if lane in self._lanes:
                    self._ready.append(lane)
                    ready += 1
            for chunk, n in batch.parts:
                self._inflight[chunk.tp] -= n
            self.held -= len(batch.records)
            self.held_bytes -= batch.nbytes
            if ready:
                self._cond.notify(ready)
            self._changed.notify_all()

    def drop(self, tps: set[TopicPartition]) -> int:
        """Remove queued (not yet taken) records of ``tps``; returns how many."""
        dropped = dropped_bytes = 0
        with self._cond:
            for lane in list(self._lanes):
                q = self._lanes[lane]
                keep: deque[Any] = deque()
                for item in q:
                    chunk = item if isinstance(item, Chunk) else item[1]
                    if chunk.tp in tps:
                        if isinstance(item, Chunk):
                            dropped += item.count
                            dropped_bytes += item.nbytes
                        else:
                            dropped += 1
                            dropped_bytes += _size(item[0])
                    else:
                        keep.append(item)
                if keep:
                    self._lanes[lane] = keep
                else:
                    del self._lanes[lane]
            self._ready = deque(lane for lane in self._ready if lane in self._lanes)
            self.held -= dropped
            self.held_bytes -= dropped_bytes
            self._changed.notify_all()
        return dropped

    def wait_idle(self, tps: Sequence[TopicPartition], timeout: float) -> bool:
        """Wait until no batch of ``tps`` is being processed; False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: all(self._inflight.get(tp, 0) <= 0 for tp in tps), max(0.0, timeout)
            )

    def wait_below(self, count: int, nbytes: int, timeout: float) -> bool:
        """Wait until at most ``count`` records and ``nbytes`` bytes are held."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self.held <= count and self.held_bytes <= nbytes, max(0.0, timeout)
            )

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
            self._changed.notify_all()


def _fatal(exc: BaseException) -> bool:
    """Errors that stop the consumer instead of being retried (a dead handler process)."""
    return isinstance(exc, ConsumerError) and not exc.retriable


def _size(record: Record) -> int:
    return len(record.value or b"") + len(record.key or b"")


# -- running the handler: inline, or in a process pool ---------------------------------

_CHILD_HANDLER: Any = None


def _child_init(blob: bytes) -> None:
    global _CHILD_HANDLER
    _CHILD_HANDLER = pickle.loads(blob)


def _child_process(records: list[Record]) -> None:
    _CHILD_HANDLER.process(records)


def _child_transaction(records: list[Record], offsets: dict[TopicPartition, int]) -> None:
    handler = _CHILD_HANDLER
    try:
        handler.process(records)
        handler.commit(offsets)
    except BaseException as exc:
        handler.rollback(exc)
        raise


class Runner:
    """Runs handler calls on the worker thread (``thread``) or in a process (``process``)."""

    def __init__(self, handler: Handler, executor: str, workers: int) -> None:
        self.handler = handler
        self._pool: ProcessPoolExecutor | None = None
        if executor == "process":
            try:
                blob = pickle.dumps(handler)
            except Exception as exc:
                raise ConfigError(
                    f"executor='process' needs a picklable handler; {type(handler).__name__} "
                    f"is not ({exc}); use executor='thread' or make it picklable"
                ) from exc
            self._pool = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_child_init,
                initargs=(blob,),
            )

    def _wait(self, fut: Future[None]) -> None:
        try:
            fut.result()
        except BrokenProcessPool as exc:
            raise ConsumerError(f"a handler process died: {exc}") from exc

    def process(self, records: Sequence[Record]) -> None:
        if self._pool is None:
            self.handler.process(records)
        else:
            self._wait(self._pool.submit(_child_process, list(records)))

    def transaction(
        self,
        records: Sequence[Record],
        offsets: dict[TopicPartition, int],
        guard: Callable[[], threading.Lock | None],
        is_current: Callable[[], bool],
    ) -> None:
        """process + commit as one unit; on any failure rollback and re-raise."""
        handler: Any = self.handler
        if self._pool is not None:
            # The handler's own fencing (e.g. SQLiteSink's compare-and-set) guards the
            # commit in the child; this check only avoids work for a revoked partition.
            if not is_current():
                raise FencedError("partition revoked before the batch ran")
            self._wait(self._pool.submit(_child_transaction, list(records), offsets))
            return
        try:
            handler.process(records)
            lock = guard()
            if lock is None:
                raise FencedError("partition revoked while the batch ran")
            with lock:
                if not is_current():
                    raise FencedError("partition revoked while the batch ran")
                handler.commit(offsets)
        except BaseException as exc:
            handler.rollback(exc)
            raise

    def close(self, timeout: float = 30.0) -> None:
        """Shut the process pool down: queued calls are cancelled, running ones get up to
        ``timeout`` seconds, then their processes are killed (their records were not
        completed, so they are redelivered; an exactly-once handler's transaction in a
        killed process never commits)."""
        pool = self._pool
        if pool is None:
            return
        # The pool's table of worker processes (shutdown() drops its reference to it),
        # read once shutdown() returned: no process is started after that.
        table = getattr(pool, "_processes", None) or {}
        pool.shutdown(wait=False, cancel_futures=True)
        procs = list(table.values())
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        hung = [proc for proc in procs if proc.is_alive()]
        for proc in hung:
            proc.kill()
        for proc in hung:
            proc.join(5.0)
        if hung:
            log.warning(
                "%d handler process(es) still running after %.1fs: killed", len(hung), timeout
            )


class WorkerPool:
    """Threads that take batches, run the handler with retries, and complete offsets."""

    def __init__(
        self,
        *,
        workers: int,
        dispatcher: Dispatcher,
        offsets: OffsetMap,
        runner: Runner,
        exactly_once: bool,
        max_retries: int,
        retry_backoff: float,
        dead_letter: tuple[DeadLetterProducer, str] | None,
        counters: Counters,
        stopping: threading.Event,
        on_fatal: Callable[[BaseException], None],
        on_rewind: Callable[[TopicPartition], None],
    ) -> None:
        self._d = dispatcher
        self._offsets = offsets
        self._runner = runner
        self._eos = exactly_once
        self._max_retries = max_retries
        self._backoff = retry_backoff
        self._dlt = dead_letter
        self._counters = counters
        self._stopping = stopping
        self._on_fatal = on_fatal
        self._on_rewind = on_rewind
        self._threads = [
            threading.Thread(target=self._loop, name=f"logsdk-worker-{i}", daemon=True)
            for i in range(workers)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _loop(self) -> None:
        d = self._d
        while True:
            batch = d.take(0.2)
            if batch is None:
                if d.closed:
                    return
                continue
            try:
                if self._eos:
                    self._run_eos(batch)
                else:
                    self._run_alo(batch)
            except BaseException as exc:
                # Close first, so no later batch of this lane runs past the failed one.
                d.close()
                self._on_fatal(exc)
            finally:
                d.done(batch)

    # -- at-least-once ----------------------------------------------------------------

    def _run_alo(self, batch: Batch) -> None:
        try:
            self._runner.process(batch.records)
        except Exception as exc:
            if _fatal(exc):
                raise
            self._counters.add("failed_batches")
            first = exc if len(batch.records) == 1 else None
            for record in batch.records:
                if not self._retry_one(record, first, None):
                    return  # stopping: leave the batch unfinished, it is redelivered
        self._complete(batch)

    def _complete(self, batch: Batch) -> None:
        n = 0
        for chunk, count in batch.parts:
            if self._offsets.complete(chunk, count):
                n += count
        self._counters.add("processed", n)

    def _backoff_wait(self, attempt: int) -> bool:
        """Sleep before retry ``attempt`` (1-based); False if the consumer is stopping."""
        self._counters.add("retries")
        return not self._stopping.wait(min(5.0, self._backoff * 2 ** (attempt - 1)))

    def _retry_one(self, record: Record, error: BaseException | None, epoch: int | None) -> bool:
        """Run one record alone until it succeeds, retries run out (DLT) or we must stop.

        ``error``: its failure when its failed batch held only it; None when the batch
        held others too, so it is tried alone once right away first. ``epoch`` is set in
        exactly-once mode. Returns False when the batch must be abandoned (stopping, or
        the partition was fenced).
        """
        tp = record.topic_partition
        batched = error is None  # its batch's run held other records: not counted below
        attempts = 0 if error is None else 1
        while attempts <= self._max_retries:
            if attempts and not self._backoff_wait(attempts):
                return False
            attempts += 1
            try:
                if epoch is None:
                    self._runner.process([record])
                else:
                    self._transaction([record], record.offset + 1, epoch, tp)
                return True
            except FencedError:
                return False
            except Exception as exc:
                if _fatal(exc):
                    raise
                error = exc
        assert error is not None
        # Every run of the handler that held the record, its failed batch's included.
        self._dead_letter(record, error, attempts + batched)
        if epoch is not None:
            # Move the handler's stored offset past the dead-lettered record.
            try:
                self._transaction([], record.offset + 1, epoch, tp)
            except FencedError:
                return False
        return True

    def _dead_letter(self, record: Record, error: BaseException, attempts: int) -> None:
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        if self._dlt is None:
            raise PoisonRecordError(
                f"record {where} failed {attempts} times, last with "
                f"{type(error).__name__}: {error}; the consumer stopped so that it is not "
                "skipped silently: set dead_letter_topic=... to set such records aside, or "
                "fix the handler",
                record.topic,
                record.partition,
                record.offset,
            ) from error
        producer, topic = self._dlt
        headers = [
            *record.headers,
            ("logsdk.dlt.error", str(error)[:2000].encode("utf-8", "replace")),
            ("logsdk.dlt.error_type", type(error).__qualname__.encode()),
            ("logsdk.dlt.topic", record.topic.encode()),
            ("logsdk.dlt.partition", str(record.partition).encode()),
            ("logsdk.dlt.offset", str(record.offset).encode()),
            ("logsdk.dlt.attempts", str(attempts).encode()),
        ]
        producer.send(topic, record.key, record.value, headers, timeout=30.0)
        self._counters.add("dead_lettered")
        log.warning(
            "record %s dead-lettered to %s after %d attempts: %s", where, topic, attempts, error
        )

    # -- exactly-once -----------------------------------------------------------------

    def _transaction(
        self, records: Sequence[Record], next_offset: int, epoch: int, tp: TopicPartition
    ) -> None:
        offsets = self._offsets
        try:
            self._runner.transaction(
                records,
                {tp: next_offset},
                lambda: offsets.tx_lock(tp),
                lambda: offsets.is_current(tp, epoch),
            )
        except BaseException:
            self._counters.add("rollbacks")
            raise

    def _fence(self, tp: TopicPartition, epoch: int) -> None:
        """Drop the partition's later work and have the fetch thread seek to the stored offset."""
        self._counters.add("fenced")
        if self._offsets.invalidate(tp, epoch):
            self._on_rewind(tp)

    def _run_eos(self, batch: Batch) -> None:
        first = batch.parts[0][0]
        tp, epoch = first.tp, first.epoch
        if any(c.epoch != epoch for c, _ in batch.parts) or not self._offsets.is_current(tp, epoch):
            self._counters.add("discarded", len(batch.records))
            return
        try:
            self._transaction(batch.records, batch.parts[-1][0].last + 1, epoch, tp)
        except FencedError:
            self._fence(tp, epoch)
            return
        except Exception as exc:
            if _fatal(exc):
                raise
            self._counters.add("failed_batches")
            first_error = exc if len(batch.records) == 1 else None
            for record in batch.records:
                if not self._retry_one(record, first_error, epoch):
                    # Stopping or fenced: nothing after this record may be committed.
                    self._fence(tp, epoch)
                    return
        self._complete(batch)
