"""The fetch thread: polls Kafka, admits records into the bounded queue, commits, rebalances.

Every call on the confluent-kafka consumer happens on this thread (rebalance callbacks
run inside its ``poll``). Workers talk to it only through the offset map and the
rewind queue.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from logsdk.consumer._kafka import KafkaConsumerClient, Run, message_bytes, to_columns
from logsdk.consumer._offsets import Chunk, CommitPoint, OffsetMap, encode_completed, ranges_for
from logsdk.consumer._records import TopicPartition
from logsdk.consumer._workers import Counters, Dispatcher
from logsdk.errors import CommitMetadataTooLargeError, ConsumerError

log = logging.getLogger("logsdk.consumer")


@dataclass(frozen=True)
class FetchSettings:
    """What the fetch thread needs to know, validated by LogConsumer."""

    topics: list[str]
    queue_size: int
    queue_bytes: int
    fetch_batch: int
    commit_interval: float
    rebalance_timeout: float
    exactly_once: bool
    metadata_max_bytes: int
    #: How long the queue may stay full (no fetching) before partitions are paused.
    pause_after: float = 0.5
    #: The most records a handler call gets: a longer run is queued as several chunks.
    max_batch: int = 1 << 30
    #: The group protocol (logsdk.consumer._rebalance.REBALANCES), for what is logged.
    rebalance: str = "eager"
    #: Seconds after start without any partition before a warning (rebalance="consumer").
    unassigned_warning: float = 30.0


class Fetcher:
    """Owns the Kafka consumer; runs on its own thread until `request_stop()`.

    Built on the caller's thread, which subscribes and then hands the client to the fetch
    thread (`start()`); only that thread touches the client, and the loop's own state
    (``paused``, the fill clock, the record size average, ``metadata_supported``, the
    commit metadata cap learned from the broker, the asynchronous commit under way) from
    then on; the client's callbacks (rebalances, commit results) run on it too, inside
    its poll. ``paused`` and
    ``metadata_supported`` are published gauges (any thread reads them);
    ``high_watermarks``, ``committed`` and the assigned set are read by other
    threads under ``_lock`` (`snapshot()`, `assigned()`). Other threads may call
    `request_stop()`, `request_rewind()` (a queue), `join()`, `alive()`,
    `snapshot()` and `assigned()`; `close()` once the thread has ended.
    """

    def __init__(
        self,
        settings: FetchSettings,
        client_factory: Callable[[Fetcher], KafkaConsumerClient],
        dispatcher: Dispatcher,
        offsets: OffsetMap,
        counters: Counters,
        stored_offsets: Callable[[list[TopicPartition]], dict[TopicPartition, int]] | None,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self._s = settings
        self._d = dispatcher
        self._offsets = offsets
        self._counters = counters
        self._stored_offsets = stored_offsets
        self._on_fatal = on_fatal
        self._stop = threading.Event()
        self._stop_deadline = 0.0
        self._rewinds: queue.SimpleQueue[TopicPartition] = queue.SimpleQueue()
        self._assigned: set[TopicPartition] = set()
        self.paused = False
        self._full_since: float | None = None  # queue full, not fetching, not yet paused
        self.metadata_supported: bool | None = None
        # The most commit metadata the broker takes, as learned (fetch thread only).
        self._metadata_cap = settings.metadata_max_bytes
        self._metadata_cap_warned = False
        self.high_watermarks: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}
        self._lock = threading.Lock()  # guards the dicts above for stats()
        # Pause when the queue is this full; resume once it has drained to the low mark.
        self._high = settings.queue_size - settings.queue_size // 10
        self._low = settings.queue_size // 2
        self._bytes_high = settings.queue_bytes - settings.queue_bytes // 10
        self._bytes_low = settings.queue_bytes // 2
        self._avg_bytes = 0.0  # bytes per record polled (moving average; 0: none yet)
        # When to say that no partition came (see _warn_unassigned); None: said, or moot.
        self._unassigned_check: float | None = None
        # The asynchronous commit under way (payload, when sent), a commit asked for at the
        # next turn of the loop, and a commit whose metadata is to be read back.
        self._inflight: tuple[dict[TopicPartition, tuple[int, str | None]], float] | None = None
        self._inflight_limit = max(30.0, 5 * settings.commit_interval)
        self._commit_again = False
        self._to_detect: dict[TopicPartition, tuple[int, str | None]] | None = None
        self._client = client_factory(self)
        self._closed = False  # close() ran (LogConsumer's life-cycle lock serialises it)
        self._thread = threading.Thread(target=self._run, name="logsdk-fetch", daemon=True)

    # -- control from other threads ------------------------------------------------------

    def start(self) -> None:
        self._client.subscribe(self._s.topics)
        # From here on the fetch thread alone calls the client (the rebalance callbacks
        # run inside its poll); close() takes it back once that thread has ended.
        self._client.owner.hand_to(self._thread)
        self._thread.start()

    def request_stop(self, deadline: float) -> None:
        self._stop_deadline = deadline
        self._stop.set()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the fetch thread to end; True once it has (or when it
        never started)."""
        if self._thread.ident is not None:
            self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()

    def close(self) -> None:
        """Take the client back once the fetch thread has ended (or never started) and
        close it if that thread did not (it closes it itself on its way out). Once only:
        a later call (a second stop()) leaves the client to the thread that closed it.
        Callers are serialised by LogConsumer (its life-cycle lock)."""
        if self._closed:
            return
        if self._thread.is_alive():
            raise ConsumerError("Fetcher.close() while the fetch thread runs: join it first")
        self._client.owner.take()
        self._client.close()
        self._closed = True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def request_rewind(self, tp: TopicPartition) -> None:
        """A worker fenced ``tp``: seek it back to the handler's stored offset."""
        self._rewinds.put(tp)

    def assigned(self) -> list[TopicPartition]:
        with self._lock:
            return sorted(self._assigned)

    def pause_new_partitions(self) -> bool:
        """Asked by the client right after an assignment: should it start paused?"""
        return self.paused

    # -- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        next_commit = time.monotonic() + self._s.commit_interval
        if self._s.rebalance == "consumer":
            self._unassigned_check = time.monotonic() + self._s.unassigned_warning
        try:
            while not self._stop.is_set():
                self._apply_rewinds()
                if self._backpressure():
                    d = self._d
                    room = self._s.queue_size - d.held
                    # Sized by the byte room too, at the average record size seen so far
                    # (none before the first record: then _trim alone keeps the bound).
                    avg = self._avg_bytes
                    if avg:
                        room = min(room, int((self._s.queue_bytes - d.held_bytes) / avg))
                    n = 1 if self.paused else max(1, min(self._s.fetch_batch, room))
                    runs = self._client.poll(n, 0.1)
                    if runs:
                        self._ingest(self._trim(runs))
                    if self._client.take_rebalanced():
                        self._restart_fetching()
                now = time.monotonic()
                if now >= next_commit or self._commit_again:
                    self._commit_again = False
                    self._commit_in_background()
                    self._refresh_watermarks()
                    next_commit = now + self._s.commit_interval
                    if self._unassigned_check is not None and now >= self._unassigned_check:
                        self._warn_unassigned()
                if self._to_detect is not None:
                    payload, self._to_detect = self._to_detect, None
                    self._detect_metadata(payload)
        except BaseException as exc:
            self._on_fatal(exc)
        finally:
            self._shutdown()

    def _backpressure(self) -> bool:
        """Apply the high/low-water marks; True if the loop should poll Kafka now.

        Above the high-water mark fetching stops until the queue drains to the low-water
        mark. If that takes longer than ``pause_after``, the assigned partitions are
        paused and polling resumes (paused polls return no records but serve rebalances
        and keep the member within max.poll.interval.ms). Pausing is not the first
        resort because librdkafka takes up to about 1 s to fetch again after a resume.
        """
        d = self._d
        if self.paused:
            if d.held <= self._low and d.held_bytes <= self._bytes_low:
                self._client.resume(self._client.assignment())
                self.paused = False
                self._full_since = None
                self._counters.add("resumed")
            return True
        if self._full_since is None:
            if d.held < self._high and d.held_bytes < self._bytes_high:
                return True
            self._full_since = time.monotonic()
        if d.wait_below(self._low, self._bytes_low, 0.05):
            self._full_since = None
            return True
        if time.monotonic() - self._full_since >= self._s.pause_after:
            self._client.pause(self._client.assignment())
            self.paused = True
            self._counters.add("paused")
            log.debug("queue at %d records / %d bytes: partitions paused", d.held, d.held_bytes)
            return True
        return False

    def _trim(self, runs: list[Run]) -> list[Run]:
        """Keep the prefix of a poll that fits the queue's byte room (at least one record)
        and seek each partition back to its first record left out: it is fetched again
        later. The poll size is already estimated from the average record size; this makes
        the bound exact when records grow, or before any was seen: librdkafka's prefetch is
        no bound (a raw consumer on the embedded broker with queued.max.messages.kbytes=1024
        held 18.7 MiB of 64 KiB records, measured)."""
        room = self._s.queue_bytes - self._d.held_bytes
        if self.paused or sum(run.nbytes for run in runs) <= room:
            return runs
        kept: list[Run] = []
        cut: dict[TopicPartition, int] = {}
        used = 0
        for run in runs:
            if cut:  # past the cut: every later record is left out
                if run.tp not in cut:
                    cut[run.tp] = run.first
                continue
            if used + run.nbytes <= room:
                kept.append(run)
                used += run.nbytes
                continue
            msgs, i = run.msgs, 0
            while i < len(msgs):
                size = message_bytes(msgs[i : i + 1])
                if used + size > room and (kept or i):
                    break
                used += size
                i += 1
            if i:
                kept.append(Run(run.tp, msgs[:i]))
            if i < len(msgs):
                cut[run.tp] = msgs[i].offset()  # type: ignore[assignment]
        for tp, offset in cut.items():
            try:
                self._client.seek(tp, offset)
            except ConsumerError as exc:  # revoked during that poll: no longer ours to read
                log.debug("no seek back for %s: %s", tp, exc)
        self._counters.add(
            "refetched", sum(len(r.msgs) for r in runs) - sum(len(r.msgs) for r in kept)
        )
        return kept

    def _ingest(self, runs: list[Run]) -> None:
        """Admit each polled run into the offset map and queue it as one chunk."""
        fetched = skipped = nbytes = 0
        chunks = []
        admit, register = self._offsets.admit_run, self._offsets.register
        limit = self._s.max_batch
        if any(len(run.msgs) > limit for run in runs):
            runs = [piece for run in runs for piece in run.pieces(limit)]
        for run in runs:
            n = len(run.msgs)
            fetched += n
            nbytes += run.nbytes
            epoch, keep = admit(run.tp, run.first, run.last, run.offsets)
            if epoch is None:
                skipped += n
                continue
            if keep is not None:
                skipped += n - len(keep)
                if not keep:
                    continue
                run = run.select(keep)
            chunk = Chunk(run.tp, epoch, run.msgs, run.nbytes, run.first, run.last, to_columns)
            if register(chunk):
                chunks.append(chunk)
        self._counters.add("fetched", fetched)
        if fetched:
            avg = max(1.0, nbytes / fetched)
            self._avg_bytes = 0.8 * self._avg_bytes + 0.2 * avg if self._avg_bytes else avg
        if skipped:
            self._counters.add("skipped", skipped)
        if chunks:
            self._d.put(chunks)

    # -- offsets ----------------------------------------------------------------------------

    def _payload(
        self, points: dict[TopicPartition, CommitPoint]
    ) -> dict[TopicPartition, tuple[int, str | None]]:
        """``{tp: (offset, metadata)}``: each point with its out-of-order map, within the cap."""
        payload: dict[TopicPartition, tuple[int, str | None]] = {}
        for tp, point in points.items():
            md = None
            if self.metadata_supported is not False and self._metadata_cap > 0:
                md, kept = encode_completed(point.offset, point.ranges, self._metadata_cap)
                if kept < len(point.ranges):
                    self._counters.add("metadata_truncated")
            payload[tp] = (point.offset, md)
        return payload

    def _commit(self, force: bool, only: set[TopicPartition] | None = None) -> None:
        """Commit and wait for the result: what a revocation and the shutdown need before
        the partitions go to another member."""
        points = self._offsets.commit_points(force, only)
        if not points:
            return
        while True:
            payload = self._payload(points)
            try:
                self._client.commit(payload, asynchronous=False)
            except CommitMetadataTooLargeError as exc:
                # The broker's offset.metadata.max.bytes is lower than assumed: learn it by
                # halving (every partition's text shrinks with it, down to none), and
                # commit again at once, so that the low marks are never held back by it.
                self._counters.add("metadata_truncated", len(exc.partitions))
                self._shrink_metadata_cap(payload, exc.partitions)
                continue
            except ConsumerError as exc:
                self._commit_failed(payload, exc)
                return
            break
        self._commit_done(payload)
        if self.metadata_supported is None:
            self._detect_metadata(payload)

    def _commit_in_background(self) -> None:
        """The periodic commit: asynchronous, its result served by a later poll
        (`on_commit()`), one at a time. Waiting for it would hold the fetch thread, and
        with it the fetching of every partition, as long as the coordinator holds the
        request: through the whole second round of a cooperative rebalance (a commit
        waited 0.65-0.79 s there, measured, while no partition of the member was fetched)."""
        if self._inflight is not None:
            payload, since = self._inflight
            if time.monotonic() - since < self._inflight_limit:
                return
            # librdkafka reports every commit; one it never reported is done again.
            self._inflight = None
            self._commit_failed(
                payload, ConsumerError(f"no result for an offset commit in {self._inflight_limit}s")
            )
        points = self._offsets.commit_points(False)
        if not points:
            return
        payload = self._payload(points)
        try:
            self._client.commit(payload, asynchronous=True)
        except ConsumerError as exc:
            self._commit_failed(payload, exc)
            return
        self._inflight = (payload, time.monotonic())

    def on_commit(self, error: ConsumerError | None) -> None:
        """The result of the commit `_commit_in_background()` sent (inside poll)."""
        if self._inflight is None:
            return
        payload, _ = self._inflight
        self._inflight = None
        if error is None:
            self._commit_done(payload)
            if self.metadata_supported is None:
                self._to_detect = payload
        elif isinstance(error, CommitMetadataTooLargeError):
            # As in _commit: learn the cap, and commit again at the next turn of the loop.
            self._counters.add("metadata_truncated", len(error.partitions))
            self._shrink_metadata_cap(payload, error.partitions)
            self._offsets.mark_dirty(payload)
            self._commit_again = True
        else:
            self._commit_failed(payload, error)

    def _commit_done(self, payload: dict[TopicPartition, tuple[int, str | None]]) -> None:
        self._counters.add("commits")
        with self._lock:
            for tp, (off, _) in payload.items():
                self._offsets.mark_committed(tp, off)
                # An asynchronous result served after a later synchronous commit (at a
                # revocation) is the older one.
                if off > self.committed.get(tp, -1):
                    self.committed[tp] = off

    def _commit_failed(
        self, payload: dict[TopicPartition, tuple[int, str | None]], exc: ConsumerError
    ) -> None:
        self._counters.add("commit_errors")
        self._offsets.mark_dirty(payload)
        log.warning("offset commit failed (retried at the next interval): %s", exc)

    def _shrink_metadata_cap(
        self,
        payload: dict[TopicPartition, tuple[int, str | None]],
        refused: list[tuple[str, int]],
    ) -> None:
        """Below the longest metadata the broker refused: half of it (0: none at all)."""
        longest = max((len(payload[tp][1] or "") for tp in refused if tp in payload), default=0)
        cap = min(self._metadata_cap, longest) // 2
        if cap < len(encode_completed(0, ())[0]):
            cap = 0
        if not self._metadata_cap_warned:
            self._metadata_cap_warned = True
            log.warning(
                "the broker refused %d bytes of offset commit metadata "
                "(its offset.metadata.max.bytes is lower than %d): at most %d from now on "
                "(records done out of order past that may be processed again)",
                longest,
                self._s.metadata_max_bytes,
                cap,
            )
        self._metadata_cap = cap

    def _detect_metadata(self, payload: dict[TopicPartition, tuple[int, str | None]]) -> None:
        """Read one commit back: does this broker keep commit metadata?"""
        tp, (off, md) = next(iter(payload.items()))
        try:
            got = self._client.committed([tp], 5.0).get(tp)
        except ConsumerError as exc:
            log.info("could not read back commit metadata yet: %s", exc)
            return
        if got is None or got[0] != off:
            return  # someone else committed meanwhile: try again next time
        self.metadata_supported = got[1] == md
        if not self.metadata_supported:
            log.warning(
                "the broker does not keep offset commit metadata: committing only the "
                "contiguous low mark (records done out of order may be processed again)"
            )

    def _warn_unassigned(self) -> None:
        """Once: no partition yet under the consumer group protocol. librdkafka says
        nothing when the broker lacks it (it retries ConsumerGroupHeartbeat for ever, and
        logs why only with debug=cgrp): the member would wait in silence."""
        self._unassigned_check = None
        if self._counters.snapshot().get("assignments", 0) == 0:
            log.warning(
                "no partition assigned %.0fs after subscribing to %s with rebalance='consumer': "
                "the broker may lack the consumer group protocol (KIP-848: Apache Kafka 4.0+; "
                "librdkafka's debug=cgrp log says 'ConsumerGroupHeartbeatRequest not "
                "supported'), then use rebalance='cooperative'; or the group has more members "
                "than partitions",
                self._s.unassigned_warning,
                self._s.topics,
            )

    def _refresh_watermarks(self) -> None:
        hw = {}
        for tp in self.assigned():
            h = self._client.high_watermark(tp)
            if h is not None:
                hw[tp] = h
        with self._lock:
            self.high_watermarks = hw

    # -- rebalancing (called inside poll) ------------------------------------------------

    def on_assign(self, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        self._counters.add("assignments")
        starts: dict[TopicPartition, int | None] = {}
        if self._stored_offsets is not None:
            try:
                stored = self._stored_offsets(list(tps))
            except Exception as exc:
                # Not owning the partitions keeps every record out of the workers.
                self._on_fatal(ConsumerError(f"handler.stored_offsets({tps}) failed: {exc}"))
                self._stop.set()
                return {}
            for tp in tps:
                # The handler's store is the truth in exactly-once mode, not Kafka's commit.
                starts[tp] = stored.get(tp)
                self._offsets.assign(tp, start=starts[tp])
        else:
            try:
                committed = self._client.committed(tps, 10.0)
            except ConsumerError as exc:
                log.warning("could not read committed offsets on assign: %s", exc)
                committed = {}
            for tp in tps:
                off, md = committed.get(tp, (None, None))
                skip = ranges_for(off, md) if off is not None else []
                self._offsets.assign(tp, start=off, skip=skip)
        with self._lock:
            self._assigned.update(tps)
        log.info("assigned %s", tps)
        return starts

    def on_revoke(self, tps: list[TopicPartition]) -> None:
        """Drain ``tps`` (only those: under an incremental protocol the rest keep flowing):
        drop their queued records, let their in-flight batches finish within the budget,
        commit their done offsets, then fence them (an exactly-once batch still running
        then is rolled back when it tries to commit)."""
        self._counters.add("revocations")
        self._counters.add("partitions_revoked", len(tps))
        budget = self._s.rebalance_timeout
        if self._stop.is_set():
            budget = min(budget, max(0.0, self._stop_deadline - time.monotonic()))
        deadline = time.monotonic() + budget
        tpset = set(tps)
        # Stop dispatching; let in-flight work finish within the budget; commit; fence.
        self._d.drop(tpset)
        if not self._d.wait_idle(tps, budget):
            log.warning("in-flight work of %s did not finish within %.1fs", tps, budget)
        self._commit(force=True, only=tpset)
        for tp in tps:
            lock = self._offsets.tx_lock(tp)
            got = lock.acquire(timeout=max(0.0, deadline - time.monotonic())) if lock else False
            try:
                self._offsets.revoke(tp)
            finally:
                if got and lock is not None:
                    lock.release()
        with self._lock:
            self._assigned.difference_update(tps)
        log.info("revoked %s", tps)

    def on_lost(self, tps: list[TopicPartition]) -> None:
        """Forget ``tps`` without committing anything: another member owns them already."""
        self._counters.add("lost")
        self._d.drop(set(tps))
        for tp in tps:
            self._offsets.revoke(tp)  # no commit: another member owns them now
        with self._lock:
            self._assigned.difference_update(tps)
        log.warning("partitions lost %s", tps)

    def _restart_fetching(self) -> None:
        """After an incremental rebalance: fetch the partitions that stayed again at once
        (see KafkaConsumerClient.take_rebalanced), each from the offset after the last
        record admitted. Not while the fetcher holds them paused (resuming them restarts
        them), nor a partition held for a rewind (its seek comes with the rewind)."""
        if self.paused:
            return
        blocked = set(self._offsets.blocked())
        self._client.restart_fetching(
            {
                tp: next_fetch
                for tp, (next_fetch, _, _) in self._offsets.positions().items()
                if next_fetch is not None and tp not in blocked
            }
        )

    def _apply_rewinds(self) -> None:
        if self.paused:
            return  # seeking a paused partition is not reliable: wait for resume
        while True:
            try:
                tp = self._rewinds.get_nowait()
            except queue.Empty:
                return
            if tp not in self._offsets.blocked():
                continue
            self._d.drop({tp})
            assert self._stored_offsets is not None
            start = self._stored_offsets([tp]).get(tp)
            self._offsets.rewind(tp, start)
            self._client.seek(tp, start)
            self._counters.add("rewinds")
            log.info("partition %s rewound to stored offset %s", tp, start)

    # -- shutdown ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        owned = self._offsets.owned()
        self._d.drop(set(owned))
        budget = max(0.0, self._stop_deadline - time.monotonic()) if self._stop.is_set() else 5.0
        if not self._d.wait_idle(owned, min(budget, self._s.rebalance_timeout)):
            log.warning("in-flight batches did not finish before close; they are redelivered")
        try:
            self._commit(force=True)
        except Exception as exc:
            log.warning("final commit failed: %s", exc)
        self._stop.set()
        self._client.close()  # leaves the group; on_revoke runs for what we still own
        self._d.close()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "high_watermarks": dict(self.high_watermarks),
                "committed": dict(self.committed),
                "assigned": sorted(self._assigned),
            }
