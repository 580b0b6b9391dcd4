"""``LogConsumer``: the facade that validates settings and wires fetch thread, queue, workers.

Fork: a forked child gives every consumer it inherited locks, events and counters of its
own (a thread of the parent may have held one at the fork). One started in the parent is
the parent's: its threads did not follow the fork and its clients are kept, never used,
by `logsdk._fork`; in the child it is stopped (``stop()`` returns at once,
``stats()`` gives the counts at the fork, ``start()`` refuses). One never started starts
in the child as a new consumer.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any

from logsdk import _fork
from logsdk._resolver import resolver_ready
from logsdk._types import ClientConfig
from logsdk.consumer._fetcher import Fetcher, FetchSettings
from logsdk.consumer._handler import Handler
from logsdk.consumer._kafka import DeadLetterProducer, KafkaConsumerClient
from logsdk.consumer._offsets import DEFAULT_METADATA_MAX_BYTES, OffsetMap
from logsdk.consumer._rebalance import DEFAULT_REBALANCE, Protocol, apply_rebalance
from logsdk.consumer._records import Record
from logsdk.consumer._workers import Counters, Dispatcher, Runner, WorkerPool
from logsdk.errors import ConfigError, ConsumerError

log = logging.getLogger("logsdk.consumer")

ORDERINGS = ("partition", "key", "none")
SEMANTICS = ("at_least_once", "exactly_once")
EXECUTORS = ("thread", "process")
# Settings the consumer owns: offsets are committed by the offset map, never by librdkafka.
_OWNED_KEYS = {"enable.auto.commit": False, "enable.auto.offset.store": False}


class _FunctionHandler:
    """Adapts ``fn(record)`` to the Handler protocol (the ``process_one`` convenience)."""

    def __init__(self, fn: Callable[[Record], object]) -> None:
        self.fn = fn

    def process(self, records: Sequence[Record]) -> None:
        for r in records:
            self.fn(r)


def _fetch_max_bytes(config: ClientConfig, queue_bytes: int) -> int:
    """An eighth of ``queue_bytes``, within what librdkafka accepts with ``config``.

    It refuses a fetch.max.bytes below message.max.bytes or the per-partition fetch
    size, or above its default receive.message.max.bytes.
    """
    floor = 1024 * 1024 + 512
    for key in ("message.max.bytes", "max.partition.fetch.bytes", "fetch.message.max.bytes"):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            floor = max(floor, int(config[key]))
    return max(floor, min(50 * 1024 * 1024, queue_bytes // 8))


def _tp_name(tp: tuple[str, int]) -> str:
    return f"{tp[0]}[{tp[1]}]"


class LogConsumer:
    """Consumes topics with a worker pool, bounded memory and at-least/exactly-once commits.

    A fetch thread polls Kafka into a bounded queue (pausing partitions when it is full,
    while still polling, so the member never leaves the group); ``workers`` threads (or
    processes, ``executor="process"``) run ``handler`` on batches in the chosen
    ``ordering``; a global offset map commits, per partition, the oldest unfinished
    offset. Nothing starts until [`start()`][logsdk.LogConsumer.start] or
    [`run()`][logsdk.LogConsumer.run].

    ``handler`` is a [`Handler`][logsdk.Handler] (``process(records)``), a plain function
    called once per record, or for ``semantics="exactly_once"`` a
    [`TransactionalHandler`][logsdk.TransactionalHandler].

    ``rebalance`` is the group protocol: ``"cooperative"`` (the classic protocol with the
    cooperative-sticky assignor: a rebalance takes only the partitions that move),
    ``"consumer"`` (Kafka 4's consumer group protocol, KIP-848: the broker assigns; the
    broker must support it) or ``"eager"`` (range/roundrobin: every rebalance takes every
    partition). Either way a revocation drains only the partitions revoked: their
    in-flight batches finish (or, exactly once, roll back past ``rebalance_timeout``),
    their done offsets are committed and their queued records dropped; partitions lost
    (the member was fenced) are never committed.

    [`start()`][logsdk.LogConsumer.start], [`stop()`][logsdk.LogConsumer.stop],
    [`run()`][logsdk.LogConsumer.run] and [`stats()`][logsdk.LogConsumer.stats] may be called from
    any thread; a start and a stop never overlap (a stop during a start waits for it).
    """

    def __init__(
        self,
        bootstrap_servers: str | None = None,
        group_id: str | None = None,
        topics: Sequence[str] | None = None,
        handler: Handler | Callable[[Record], object] | None = None,
        *,
        workers: int = 4,
        queue_size: int = 10_000,
        queue_bytes: int = 64 * 1024 * 1024,
        ordering: str = "partition",
        semantics: str = "at_least_once",
        dead_letter_topic: str | None = None,
        max_retries: int = 3,
        retry_backoff: float = 0.1,
        max_batch: int = 1000,
        executor: str = "thread",
        commit_interval: float = 1.0,
        rebalance_timeout: float = 10.0,
        rebalance: str = DEFAULT_REBALANCE,
        kafka_config: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        config: ClientConfig = dict(kafka_config or {})
        if bootstrap_servers is not None:
            if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
                raise ConfigError("bootstrap_servers must be 'host:port[,host:port...]'")
            config["bootstrap.servers"] = bootstrap_servers
        if not config.get("bootstrap.servers"):
            raise ConfigError(
                "pass bootstrap_servers='host:port' (or kafka_config['bootstrap.servers'])"
            )
        if group_id is not None:
            if not isinstance(group_id, str) or not group_id:
                raise ConfigError("group_id must be a non-empty string")
            config["group.id"] = group_id
        if not config.get("group.id"):
            raise ConfigError(
                "pass group_id='my-service' (the consumer group that owns the offsets)"
            )
        if (
            isinstance(topics, str)
            or not topics
            or not all(isinstance(t, str) and t for t in topics)
        ):
            raise ConfigError("topics must be a non-empty list of topic names, e.g. ['app-logs']")
        for key, forced in _OWNED_KEYS.items():
            if key in config and str(config[key]).lower() != str(forced).lower():
                raise ConfigError(f"kafka_config[{key!r}] is managed by LogConsumer; remove it")
            config[key] = forced
        protocol = apply_rebalance(config, rebalance)
        config.setdefault("auto.offset.reset", "earliest")
        # librdkafka's own prefetch buffer counts towards memory too: keep it within the bound.
        config.setdefault("queued.max.messages.kbytes", max(1024, min(65536, queue_bytes // 2048)))
        # Once that buffer is over its threshold librdkafka postpones the partition's next
        # fetch by this much (default 1 s): longer than the workers take to drain it, which
        # left the consumer idle for most of a second at a time. Fetching again sooner
        # means more fetch responses in flight on top of the buffer, so their size is
        # bounded too (default 50 MiB).
        config.setdefault("fetch.queue.backoff.ms", 100)
        config.setdefault("fetch.max.bytes", _fetch_max_bytes(config, queue_bytes))
        if ordering not in ORDERINGS:
            raise ConfigError(f"ordering must be one of {ORDERINGS}, got {ordering!r}")
        if semantics not in SEMANTICS:
            raise ConfigError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
        if executor not in EXECUTORS:
            raise ConfigError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        for name, value, lo in (
            ("workers", workers, 1),
            ("queue_size", queue_size, 1),
            ("queue_bytes", queue_bytes, 1024),
            ("max_batch", max_batch, 1),
            ("max_retries", max_retries, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise ConfigError(f"{name} must be an integer >= {lo}, got {value!r}")
        for name, fvalue in (
            ("retry_backoff", retry_backoff),
            ("commit_interval", commit_interval),
            ("rebalance_timeout", rebalance_timeout),
        ):
            if not isinstance(fvalue, (int, float)) or not 0 < fvalue <= 3600:
                raise ConfigError(f"{name} must be seconds in (0, 3600], got {fvalue!r}")
        if dead_letter_topic is not None:
            if not isinstance(dead_letter_topic, str) or not dead_letter_topic:
                raise ConfigError("dead_letter_topic must be a topic name or None")
            if dead_letter_topic in topics:
                raise ConfigError("dead_letter_topic must not be one of the consumed topics")
        if handler is None:
            raise ConfigError("pass handler=... (an object with process(records), or a function)")
        if not callable(getattr(handler, "process", None)):
            if not callable(handler):
                raise ConfigError("handler must have a process(records) method or be a function")
            handler = _FunctionHandler(handler)
        exactly_once = semantics == "exactly_once"
        if exactly_once:
            missing = [
                m
                for m in ("commit", "rollback", "stored_offsets")
                if not callable(getattr(handler, m, None))
            ]
            if missing:
                raise ConfigError(
                    "semantics='exactly_once' needs a TransactionalHandler; "
                    f"{type(handler).__name__} lacks {', '.join(missing)} "
                    "(logsdk.sinks.SQLiteSink is one)"
                )
        elif all(callable(getattr(handler, m, None)) for m in ("commit", "rollback")):
            # At-least-once calls process() only: a transactional handler would never be
            # told to commit what it staged, while Kafka offsets move past it.
            raise ConfigError(
                f"{type(handler).__name__} is a TransactionalHandler (commit, rollback): "
                "pass semantics='exactly_once', or it never commits what process() stages"
            )
        self._config = config
        self._protocol: Protocol = protocol
        self._handler: Handler = handler  # type: ignore[assignment]
        self._topics = list(topics)
        self._workers = workers
        self._ordering = "partition" if exactly_once else ordering
        self._exactly_once = exactly_once
        self._executor = executor
        self._dead_letter_topic = dead_letter_topic
        self._max_retries = max_retries
        self._retry_backoff = float(retry_backoff)
        self._queue_size = queue_size
        self._settings = FetchSettings(
            topics=self._topics,
            queue_size=queue_size,
            queue_bytes=queue_bytes,
            # Records asked of one consume() call. At least once: a quarter of queue_size
            # (2500 by default, 5000 at most) rather than 1000: consumer.at_least_once at
            # 200 B went 0.825 -> 0.892 of the raw loop (5 alternating rounds of 1M
            # records; 1 KiB unchanged). Exactly once stays at 1000: building the messages
            # holds the GIL throughout, and the handlers' serialised commits, which need it
            # back after each SQLite step, waited longer (SQLiteSink 0.612 with 1000,
            # 0.589 with 2500, 3 rounds of 1M records).
            fetch_batch=min(1000 if exactly_once else 5000, max(1, queue_size // 4)),
            commit_interval=float(commit_interval),
            rebalance_timeout=float(rebalance_timeout),
            exactly_once=exactly_once,
            metadata_max_bytes=DEFAULT_METADATA_MAX_BYTES,
            max_batch=max_batch,
            rebalance=protocol.name,
        )
        self._max_batch = max_batch
        self._counters = Counters()
        # Held through start() and through stop()'s taking down: one builds the parts, the
        # other takes them down, and neither sees the other half done.
        self._life = threading.Lock()
        # Guards _state, _error and the stop request (_state and _error are published:
        # read without it).
        self._lock = threading.Lock()
        self._state = "new"  # new -> running -> stopped
        self._stop_deadline: float | None = None  # set by stop(): start() honours it
        self._error: BaseException | None = None
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._fetcher: Fetcher | None = None
        self._pool: WorkerPool | None = None
        self._runner: Runner | None = None
        self._dispatcher: Dispatcher | None = None
        self._offsets: OffsetMap | None = None
        self._dlt: DeadLetterProducer | None = None
        _fork.call_in_child(self._forked)

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> LogConsumer:
        """Connect, join the group and start the fetch thread and workers; returns self."""
        with self._life:
            return self._start()

    def _start(self) -> LogConsumer:
        if not resolver_ready():
            # Its clients could never connect, and closing them would never return.
            raise ConsumerError(
                "no Kafka client can connect from this process: it was forked while a "
                "thread of its parent was inside getaddrinfo() (see the error logged by "
                "logsdk); start the consumer in a process started afresh (spawn), or fork "
                "before threads start"
            )
        with self._lock:
            if self._state != "new":
                raise ConsumerError(f"start() on a consumer that is {self._state}; make a new one")
            self._state = "running"
        self._dispatcher = Dispatcher(self._ordering, self._max_batch)  # type: ignore[arg-type]
        self._offsets = OffsetMap()
        try:
            self._runner = Runner(self._handler, self._executor, self._workers)
            if self._dead_letter_topic is not None:
                producer_config = {
                    k: v
                    for k, v in self._config.items()
                    if not k.startswith(
                        (
                            "group.",
                            "session.",
                            "heartbeat.",
                            "auto.",
                            "enable.auto",
                            "queued.",
                            "max.poll",
                            "fetch.",
                            "partition.assignment",
                            "isolation.",
                        )
                    )
                }
                producer_config["enable.idempotence"] = True
                self._dlt = DeadLetterProducer(producer_config)
            self._fetcher = Fetcher(
                self._settings,
                self._make_client,
                self._dispatcher,
                self._offsets,
                self._counters,
                getattr(self._handler, "stored_offsets", None) if self._exactly_once else None,
                self._fail,
            )
            self._pool = WorkerPool(
                workers=self._workers,
                dispatcher=self._dispatcher,
                offsets=self._offsets,
                runner=self._runner,
                exactly_once=self._exactly_once,
                max_retries=self._max_retries,
                retry_backoff=self._retry_backoff,
                dead_letter=None
                if self._dlt is None
                else (self._dlt, self._dead_letter_topic or ""),
                counters=self._counters,
                stopping=self._stopping,
                on_fatal=self._fail,
                on_rewind=self._fetcher.request_rewind,
            )
            self._pool.start()
            self._fetcher.start()
        except BaseException:
            # Whatever was built or started is taken down: nothing runs on, nothing leaks.
            self._stop(time.monotonic() + self._settings.rebalance_timeout)
            raise
        with self._lock:
            stop_deadline = self._stop_deadline
        if stop_deadline is not None:
            # stop() was called meanwhile; it waits for this start() only up to its own
            # timeout, so the taking down is done here (again by it if it still waits:
            # every step is idempotent).
            self._stop(stop_deadline)
            return self
        log.info("LogConsumer started: group=%s topics=%s", self._config["group.id"], self._topics)
        return self

    def _make_client(self, fetcher: Fetcher) -> KafkaConsumerClient:
        return KafkaConsumerClient(
            self._config,
            fetcher.on_assign,
            fetcher.on_revoke,
            fetcher.on_lost,
            fetcher.pause_new_partitions,
            incremental=self._protocol.incremental,
            on_commit=fetcher.on_commit,
        )

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc
                log.error("LogConsumer stopping: %s", exc)
        self._stopping.set()
        if self._dispatcher is not None:
            self._dispatcher.close()
        if self._fetcher is not None:
            self._fetcher.request_stop(time.monotonic() + 10.0)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop fetching, let in-flight batches finish, commit, leave the group.

        Waits at most ``timeout`` seconds; in-flight work still running then is
        abandoned (its records are redelivered). Safe to call more than once.
        """
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ConfigError(f"timeout must be seconds >= 0, got {timeout!r}")
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._state == "new":
                self._state = "stopped"
                self._stopped.set()
                return
            if self._stop_deadline is None:
                self._stop_deadline = deadline
        self._stopping.set()
        # A start() under way in another thread finishes first (or, past the timeout,
        # stops the consumer itself when it is done).
        if not self._life.acquire(timeout=max(0.0, deadline - time.monotonic())):
            log.warning("stop(): start() still under way after %.1fs; it stops when done", timeout)
            return
        try:
            self._stop(deadline)
        finally:
            self._life.release()

    def _stop(self, deadline: float) -> None:
        """Take down what start() built (any of it may be missing after a failed start)."""
        self._stopping.set()
        if self._fetcher is not None:
            self._fetcher.request_stop(deadline)
            if self._fetcher.join(deadline - time.monotonic()):
                self._fetcher.close()  # its client, back from the ended fetch thread
            else:
                log.warning("fetch thread did not stop in time; its client is left to it")
        if self._dispatcher is not None:
            self._dispatcher.close()
        if self._pool is not None:
            self._pool.join(max(0.0, deadline - time.monotonic()))
        if self._runner is not None:
            self._runner.close(max(0.0, deadline - time.monotonic()))
        if self._dlt is not None:
            self._dlt.close(max(0.1, deadline - time.monotonic()))
        with self._lock:
            self._state = "stopped"
        self._stopped.set()

    def run(self, timeout: float | None = None) -> None:
        """Start and block until SIGINT/SIGTERM, [`stop()`][logsdk.LogConsumer.stop] or ``timeout``
        seconds.

        Raises the error that stopped the consumer (e.g. PoisonRecordError), if any.
        """
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ConfigError(f"timeout must be seconds > 0 or None, got {timeout!r}")
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():

            def on_signal(signum: int, _frame: FrameType | None) -> None:
                log.info("signal %d: stopping", signum)
                self._stopping.set()

            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, on_signal)
        try:
            if self._state == "new":
                self.start()
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._stopping.wait(0.2):
                if self._fetcher is not None and not self._fetcher.alive:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self._error is not None:
            raise self._error

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the consumer, or None."""
        return self._error

    def __enter__(self) -> LogConsumer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- fork ---------------------------------------------------------------------------

    def _forked(self) -> None:
        """In a forked child (one thread runs): see the module docstring."""
        self._life = threading.Lock()
        self._lock = threading.Lock()
        self._counters = self._counters.copied_in_child()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        if self._state == "new":
            return
        # Started in the parent: what it runs on is the parent's, kept and never used here.
        parts = (self._fetcher, self._pool, self._runner, self._dispatcher, self._offsets)
        _fork.bury((*parts, self._dlt))
        self._fetcher = self._pool = self._runner = self._dispatcher = None
        self._offsets = self._dlt = None
        self._state = "stopped"
        self._stopping.set()
        self._stopped.set()

    # -- observability ------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters and gauges; partition keys are ``"topic[partition]"``.

        ``lag`` is records not yet fetched (high watermark minus fetch position);
        ``committable_lag`` counts from the oldest unfinished record instead.
        """
        c = self._counters.snapshot()
        out: dict[str, Any] = {
            "state": self._state,
            "error": None
            if self._error is None
            else f"{type(self._error).__name__}: {self._error}",
            "semantics": "exactly_once" if self._exactly_once else "at_least_once",
            "ordering": self._ordering,
            "rebalance": self._protocol.name,
            "fetched": c.get("fetched", 0),
            "processed": c.get("processed", 0),
            "skipped": c.get("skipped", 0),
            "retries": c.get("retries", 0),
            "failed_batches": c.get("failed_batches", 0),
            "dead_lettered": c.get("dead_lettered", 0),
            "rollbacks": c.get("rollbacks", 0),
            "fenced": c.get("fenced", 0),
            "rewinds": c.get("rewinds", 0),
            "commits": c.get("commits", 0),
            "commit_errors": c.get("commit_errors", 0),
            "metadata_truncated": c.get("metadata_truncated", 0),
            "assignments": c.get("assignments", 0),
            "revocations": c.get("revocations", 0),
            "partitions_revoked": c.get("partitions_revoked", 0),
            "lost": c.get("lost", 0),
            "paused": c.get("paused", 0),
            "resumed": c.get("resumed", 0),
            "refetched": c.get("refetched", 0),
            "queue_size": self._queue_size,
            "queue_depth": 0,
            "queue_bytes": 0,
            "max_queue_depth": 0,
            "max_queue_bytes": 0,
            "paused_partitions": [],
            "assigned": [],
            "committed": {},
            "lag": None,
            "committable_lag": None,
            "partition_lag": {},
            "metadata_supported": None,
        }
        d, f, o = self._dispatcher, self._fetcher, self._offsets
        if d is not None:
            out["queue_depth"] = d.held
            out["queue_bytes"] = d.held_bytes
            out["max_queue_depth"] = d.max_held
            out["max_queue_bytes"] = d.max_held_bytes
        if o is not None:
            out["discarded"] = c.get("discarded", 0) + o.discarded
        if f is not None and o is not None:
            snap = f.snapshot()
            out["metadata_supported"] = f.metadata_supported
            out["assigned"] = [_tp_name(tp) for tp in snap["assigned"]]
            out["paused_partitions"] = list(out["assigned"]) if f.paused else []
            out["committed"] = {_tp_name(tp): off for tp, off in snap["committed"].items()}
            lag = committable = 0
            known = False
            hws = snap["high_watermarks"]
            for tp, (next_fetch, low, _committed) in o.positions().items():
                hw = hws.get(tp)
                if hw is None or next_fetch is None:
                    continue
                known = True
                plag = max(0, hw - next_fetch)
                lag += plag
                committable += max(0, hw - (low if low is not None else next_fetch))
                out["partition_lag"][_tp_name(tp)] = plag
            if known:
                out["lag"], out["committable_lag"] = lag, committable
        return out
