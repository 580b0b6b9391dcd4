"""The agent: every ring of a spool root drained to Kafka by one librdkafka client.

One thread (``logsdk-agent``) owns everything that changes: the ring readers, the client
(its delivery reports run in that thread's ``poll()``), the spools, the sources
(`logsdk.agent._source`). A second thread (``logsdk-agent-probe``) only probes Kafka
while it is down and sets an event when it answers. The main thread starts and stops.

A step of the agent's thread: look for rings that appeared or whose writer died (every
``scan_interval_s``); poll the client and apply what its reports said; then, with Kafka
up, replay the spools and produce the rings' new records (a producer whose spool holds
rows has its new records appended behind them), and with Kafka down, commit the rings'
new records to the spools. Kafka is down from a delivery that failed for a reason other
than the record's own, a report that every broker is down, or records in librdkafka
with no acknowledgement for ``stall_timeout_s`` (the client is then replaced, as one
that failed fatally), until a probe answers (and at the start, until the first probe,
made at once, answers).

Invariants:
- a record leaves a ring only once Kafka acknowledged it or a spool committed it (the
  sources hold it: `logsdk.agent._source`);
- one agent per spool root (`logsdk.agent._lock`), taken before anything is read;
- stop(): no new record is taken; the agent waits for what is in librdkafka, at most its
  timeout, commits what failed to the spools; what is left stays in the rings (unsettled:
  read again by the next agent, a duplicate at worst) and in the spools.

Owner: the agent's thread, for every field below the constructor's; ``_stop``, ``_back``
and ``down`` (published) are shared; ``stats()`` reads published counters.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from logsdk import _fork
from logsdk._owner import Owner
from logsdk.agent._lock import AgentLock, agent_dir
from logsdk.agent._source import Source, check_row
from logsdk.errors import ConfigError, LogSDKError, ShmError
from logsdk.producer import _client
from logsdk.producer._config import ProducerConfig
from logsdk.producer._records import HEADER_SEQ
from logsdk.shm._reader import (
    RingGoneError,
    RingNotReadyError,
    RingReader,
    readable_uids,
    ring_names,
    ring_prefix,
    valid_producer_id,
)
from logsdk.spool._codec import Row, decode_headers

log = logging.getLogger("logsdk.agent")

#: A ring still being made after this long is said once (`Agent._not_ready`).
UNREADY_WARN_S = 60.0


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """What ``logsdk agent`` is run with."""

    spool_root: Path
    bootstrap_servers: str
    kafka_config: Mapping[str, str | int | float | bool] = dataclasses.field(default_factory=dict)
    spool_synchronous: str = "NORMAL"
    spool_max_bytes: int | None = 1 << 30
    scan_interval_s: float = 0.5
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 2.0
    batch: int = 2_000
    max_inflight: int = 100_000
    #: Spooled records replayed per second at most (None: no limit).
    replay_max_rate: float | None = 200_000.0
    #: Records in librdkafka and no acknowledgement for this long: the client is given up
    #: (its records spooled) and a new one made once Kafka answers a probe.
    stall_timeout_s: float = 10.0
    #: Users whose rings are read besides the agent's own: for an agent run as root beside
    #: applications of other users (their rings stay mode 0600: root reads them).
    trusted_uids: tuple[int, ...] = ()

    def producer_config(self) -> ProducerConfig:
        """The producer settings the client is made from (validated as a producer's:
        ``acks`` and idempotence may not be weakened)."""
        conf = dict(self.kafka_config)
        conf.setdefault("message.timeout.ms", 30_000)
        return ProducerConfig(
            bootstrap_servers=self.bootstrap_servers,
            topic="logsdk-agent",  # not produced to: a producer's config needs one
            spool_dir=os.fspath(self.spool_root),
            kafka_config=conf,
            buffer_max_records=self.max_inflight + self.batch,
            probe_timeout_s=self.probe_timeout_s,
            spool_synchronous=self.spool_synchronous,
            spool_max_bytes=self.spool_max_bytes,
        )


class Agent:
    """Drains the rings of one spool root (see the module docstring). ``start()`` takes the
    lock and starts the threads; ``stop(timeout)`` ends them."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self._pconf = config.producer_config()
        if config.batch <= 0 or config.max_inflight <= 0:
            raise ConfigError("batch and max_inflight must be positive")
        if config.replay_max_rate is not None and not config.replay_max_rate > 0:
            raise ConfigError(f"replay_max_rate must be > 0 or None, got {config.replay_max_rate}")
        self._tokens = 0.0  # replays allowed now (replay_max_rate's bucket)
        self._tokens_at = time.monotonic()
        self._root = Path(config.spool_root)
        if any(not isinstance(u, int) or isinstance(u, bool) or u < 0 for u in config.trusted_uids):
            raise ConfigError(f"trusted_uids must be user ids, got {config.trusted_uids!r}")
        self._uids = readable_uids(config.trusted_uids)
        self._lock: AgentLock | None = None
        self._stop = threading.Event()
        self._back = threading.Event()  # the probe thread: Kafka answers again
        self._stop_by = 0.0
        #: Kafka is not known to answer (published): so at the start, until the first probe
        #: answers, so that nothing waits in librdkafka for a cluster that is not there.
        self.down = True
        #: The agent's thread's, from start() on (checked in each step).
        self.owner = Owner(f"the agent of {self._root}")
        self._sources: dict[str, Source] = {}
        self._refused_rings: set[str] = set()
        #: Rings seen while their writer was making them: when first seen (inf once said).
        self._unready: dict[str, float] = {}
        self._client: Any = None
        self._renew = False  # the client failed fatally: the agent's thread replaces it
        self._quiet_since = time.monotonic()  # the stall detector's clock
        self._threads: list[threading.Thread] = []
        #: Published counters (the agent's thread writes them).
        self.counts = {
            "acked": 0, "spooled": 0, "replayed": 0, "rejected": 0, "corrupt": 0,
            "spool_errors": 0, "errors": 0,
        }  # fmt: skip
        self._said_at = 0.0  # the next spool error is logged from then on
        self._corrupt_done = 0  # corrupt frames of the sources removed so far

    # -- life ------------------------------------------------------------------------------

    def start(self) -> Agent:
        """Take the spool root's lock (`AgentLockedError` when another
        agent holds it) and start the threads."""
        self._lock = AgentLock.take(self._root, shared=bool(self.config.trusted_uids))
        try:
            _client.check_config(self._pconf.librdkafka())
        except BaseException:
            self._lock.release()
            raise
        for name, target in (("logsdk-agent", self._run), ("logsdk-agent-probe", self._probe)):
            t = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(t)
        self.owner.hand_to(self._threads[0])
        for t in self._threads:
            t.start()
        log.info("logsdk agent (pid %d) drains spool root %s", os.getpid(), self._root)
        return self

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop within ``timeout`` seconds (see the module docstring); True when the
        agent's thread ended in time."""
        self._stop_by = time.monotonic() + max(0.0, timeout)
        self._stop.set()
        ok = True
        for t in self._threads:
            t.join(max(0.0, self._stop_by - time.monotonic()) + 5.0)
            ok = ok and not t.is_alive()
        if self._lock is not None and ok:
            self._lock.release()
        return ok

    @property
    def running(self) -> bool:
        """True while the agent's thread runs (any thread)."""
        return bool(self._threads) and self._threads[0].is_alive()

    def stats(self) -> dict[str, Any]:
        """Counters (published): acked, spooled, replayed, rejected, corrupt; sources,
        down."""
        out: dict[str, Any] = dict(self.counts)
        out["sources"] = len(self._sources)
        out["down"] = self.down
        return out

    # -- the agent's thread ----------------------------------------------------------------

    def _run(self) -> None:
        self._client = _client.new_producer(self._pconf.librdkafka(), self._on_error)
        next_scan = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                try:
                    if now >= next_scan:
                        next_scan = now + self.config.scan_interval_s
                        self._scan()
                    if self._renew:
                        self._renew_client()
                    busy = self._step()
                except (LogSDKError, OSError) as exc:
                    # A spool or a ring that cannot be used now (a full or failing disk,
                    # a segment removed under it): said, and tried again; never fatal.
                    log.error("logsdk agent: %s; going on", exc)
                    self.counts["errors"] += 1
                    self._stop.wait(0.5)
                    busy = False
                self._client.poll(0 if busy else 0.005)
                self._watch(self._after_poll())
            self._finish()
        except Exception:
            log.exception("logsdk agent: its thread failed; stopping (rings and spools kept)")
            self._stop.set()
        finally:
            for src in self._sources.values():
                src.close()

    def _step(self) -> bool:
        """Move records (see the module docstring); True when it moved any."""
        self.owner.check("move records")
        if self._back.is_set():
            self._back.clear()
            self.down = False
            log.info("Kafka answers: replaying the spools, then the rings")
            for src in self._sources.values():
                src.replay_after = 0
        moved = 0
        room = self.config.max_inflight - sum(
            s.inflight + s.replaying for s in self._sources.values()
        )
        for src in list(self._sources.values()):
            if src.spool_unread:
                continue  # its ring's records wait behind the spool's (opened at a scan)
            if self.down:
                moved += self._spool_new(src)
                continue
            if src.spooled:
                moved += self._replay(src, room)
                moved += self._spool_new(src)
                continue
            if room > 0:
                n = self._produce_new(src, min(room, self.config.batch))
                room -= n
                moved += n
        return moved > 0

    def _take(self, src: Source, limit: int) -> list[tuple[int, Row, Any]]:
        """Up to ``limit`` new records of the source's ring, checked: refused ones set aside
        at once (counted corrupt)."""
        r = src.reader
        if r is None or limit <= 0:
            return []
        out = []
        # The tail stops at the head the writer last published (a settle may find it
        # behind the frames it read): move it up to the head published since (the
        # writer's flush() publishes it and waits for the tail), also while the records
        # taken keep going back to a full spool.
        r.advance()
        got = r.take(limit, alive=not src.writer_dead)
        for pos, row in got:
            user = check_row(row)
            if user is None:
                r.reject(pos)
            else:
                out.append((pos, row, user))
        return out

    def _spool_new(self, src: Source) -> int:
        taken = self._take(src, self.config.batch)
        n = self._keep(src, [(pos, row) for pos, row, _ in taken])
        self.counts["spooled"] += n
        return n

    def _keep(self, src: Source, taken: list[tuple[int, Row]]) -> int:
        """Commit ``taken`` (just taken from the source's ring, oldest first) to its spool;
        when the spool refuses (full, failing disk), they go back to the ring, unsettled,
        to be taken again later."""
        try:
            return src.keep(taken)
        except LogSDKError as exc:
            if src.reader is not None:
                src.reader.put_back([pos for pos, _ in taken])
            self._spool_failed(src, exc)
            return 0

    def _spool_failed(self, src: Source, exc: LogSDKError) -> None:
        """A spool write failed: counted, said at most every 10 s; the agent goes on."""
        self.counts["spool_errors"] += 1
        now = time.monotonic()
        if now >= self._said_at:
            self._said_at = now + 10.0
            log.error(
                "spool of producer %s refused records (%s); they wait in its ring "
                "(%d spool error(s) so far)",
                src.producer_id,
                exc,
                self.counts["spool_errors"],
            )

    def _produce_new(self, src: Source, limit: int) -> int:
        taken = self._take(src, limit)
        produce = self._client.produce
        pid = src.pid_header
        for i, (pos, row, user) in enumerate(taken):
            topic, key, value, _, ts, seq = row
            headers = [*user, pid, (HEADER_SEQ, b"%d" % seq)]

            def report(
                err: KafkaError | None, msg: Message, pos: int = pos, row: Row = row
            ) -> None:
                src.inflight -= 1
                if err is None:
                    src.acked.append(pos)
                elif _client.is_record_error(err):
                    src.refused.append((pos, row, err.str()))
                else:
                    src.failed.append((pos, row))
                    self._went_down(err.str())

            try:
                produce(topic, value, key, headers=headers, timestamp=ts or 0, on_delivery=report)
            except (BufferError, KafkaException) as exc:
                self._refused_by_client(exc)
                rest = [(p, r) for p, r, _ in taken[i:]]
                if isinstance(exc, KafkaException) and _client.is_record_exception(exc):
                    src.refused.append((pos, row, str(exc)))  # set aside after the poll
                    rest = rest[1:]
                self.counts["spooled"] += self._keep(src, rest)
                return len(taken)
            src.inflight += 1
        return len(taken)

    def _replay_room(self, room: int) -> int:
        """``room`` cut to what ``replay_max_rate`` allows now (a bucket of a batch)."""
        rate = self.config.replay_max_rate
        if rate is None:
            return room
        now = time.monotonic()
        cap = float(min(self.config.batch, rate))
        self._tokens = min(cap, self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        return min(room, int(self._tokens))

    def _replay(self, src: Source, room: int) -> int:
        """Produce the next rows of the source's spool (after ``replay_after``), paced."""
        room = self._replay_room(room)
        if room <= 0 or src.spool is None:
            return 0
        rows = src.spool.read_replay(src.replay_after, min(room, self.config.batch))
        self._tokens -= len(rows)
        produce = self._client.produce
        pid = src.pid_header
        for row_id, topic, key, value, hblob, ts, seqb in rows:
            user = decode_headers(hblob) if hblob else []
            headers = [*user, pid, (HEADER_SEQ, seqb)]

            def report(err: KafkaError | None, msg: Message, row_id: int = row_id) -> None:
                src.replaying -= 1
                if err is None:
                    src.replayed.append(row_id)
                elif _client.is_record_error(err):
                    src.replay_refused.append((row_id, err.str()))
                else:
                    self._went_down(err.str())

            try:
                produce(topic, value, key, headers=headers, timestamp=ts or 0, on_delivery=report)
            except (BufferError, KafkaException) as exc:
                self._refused_by_client(exc)
                return 0  # left in the spool: the next step tries again
            src.replaying += 1
            src.replay_after = row_id
        return len(rows)

    def _after_poll(self) -> int:
        """Apply the reports of the last poll; how many records Kafka acknowledged."""
        total = 0
        for src in self._sources.values():
            try:
                acked, replayed, spooled, refused = src.after_poll()
            except LogSDKError as exc:
                self._spool_failed(src, exc)
                continue
            c = self.counts
            c["acked"] += acked + replayed
            c["replayed"] += replayed
            c["spooled"] += spooled
            c["rejected"] += refused
            total += acked + replayed
        return total

    def _watch(self, acked: int) -> None:
        """The stall detector: records in librdkafka and none acknowledged for
        ``stall_timeout_s`` (a client wedged: seen after a broker lost its producer
        state) means the client is replaced."""
        now = time.monotonic()
        held = any(s.inflight or s.replaying for s in self._sources.values())
        if acked or not held:
            self._quiet_since = now
        elif now - self._quiet_since > self.config.stall_timeout_s and not self._renew:
            self._quiet_since = now
            self._renew = True
            self._went_down(f"no acknowledgement for {self.config.stall_timeout_s:g} s")

    def _went_down(self, why: str) -> None:
        if not self.down:
            log.warning("Kafka unreachable (%s): records go to the spool", why)
        self.down = True
        self._back.clear()

    def _refused_by_client(self, exc: BufferError | KafkaException) -> None:
        """produce() raised: a full queue waits; a client that failed fatally is replaced;
        anything else but the record's own fault means Kafka cannot be written now."""
        if isinstance(exc, BufferError):
            return
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError):
            if err.fatal():
                self._renew = True
                self._went_down(f"fatal: {err.str()}")
            elif not _client.is_record_error(err):
                self._went_down(err.str())

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            # The idempotent client can produce no more (e.g. the broker lost its
            # producer state): a new one, once what this one holds is spooled.
            self._renew = True
            self._went_down(f"fatal: {err.str()}")
        elif _client.is_cluster_down(err):
            self._went_down(err.str())

    def _renew_client(self) -> None:
        """Replace a client that failed fatally: purge it, apply its reports (the purged
        records go to the spools: Kafka is down until a probe says otherwise), for at most
        2 s, then make a new one. What was not reported is read again from the rings and
        the spools (a duplicate at worst)."""
        self._renew = False
        old = self._client
        _client.purge_without_waiting(old)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(
            s.inflight or s.replaying for s in self._sources.values()
        ):
            old.poll(0.05)
            self._after_poll()
        _fork.bury(old)  # never destroyed: its threads may be wedged (see logsdk._fork)
        for src in self._sources.values():
            src.inflight = src.replaying = src.replay_after = 0
            if src.reader is not None:
                src.reader.forget_open()
        self._client = _client.new_producer(self._pconf.librdkafka(), self._on_error)
        log.warning("the agent's Kafka client was replaced (it failed, or stalled)")

    # -- rings appearing and going -----------------------------------------------------------

    def _scan(self) -> None:
        """Find the rings and spools of the root; note writers that died; remove the
        sources that are done."""
        self.owner.check("look at the rings")
        prefix = "/" + ring_prefix(self._root)
        names = ring_names(self._root, self._uids)
        listed = set(names)  # what is no longer listed is forgotten (names are not reused)
        if self._unready:
            self._unready = {n: t for n, t in self._unready.items() if n in listed}
        self._refused_rings &= listed
        for name in names:
            pid = name[len(prefix) :]
            if pid in self._sources or name in self._refused_rings:
                continue
            if not valid_producer_id(pid):
                self._refused_rings.add(name)
                log.error("ring %s: %r is not a producer id; not read", name, pid)
                continue
            try:
                reader = RingReader(name, self._uids)
            except RingNotReadyError:
                self._not_ready(name)
                continue
            except RingGoneError:
                continue
            except ShmError as exc:
                self._refused_rings.add(name)
                log.error("ring %s not read: %s", name, exc)
                continue
            self._unready.pop(name, None)
            if reader.producer_id != pid:
                reader.close()
                self._refused_rings.add(name)
                log.error("ring %s names producer %s: not read", name, reader.producer_id)
                continue
            self._add(pid, reader)
        adir = agent_dir(self._root)
        for entry in sorted(adir.iterdir()) if adir.is_dir() else []:
            # A spool the agent left (its producer's ring gone): delivered from the spool.
            if (
                entry.name not in self._sources
                and valid_producer_id(entry.name)
                and (entry / "spool.db").is_file()
            ):
                self._add(entry.name, None)
        for pid, src in list(self._sources.items()):
            if src.spool_unread:
                self._open_spool(src, quiet=True)
            if src.reader is not None and not src.writer_dead:
                src.writer_dead = not src.reader.writer_alive()
            corrupt = 0 if src.reader is None else src.reader.corrupt
            if src.let_ring_go():
                self._corrupt_done += corrupt
            if src.done():
                src.remove()
                del self._sources[pid]
        self.counts["corrupt"] = self._corrupt_done + sum(
            s.reader.corrupt for s in self._sources.values() if s.reader is not None
        )

    def _not_ready(self, name: str) -> None:
        """``name`` is a ring being made (`RingNotReadyError`): opened again at the next
        scan. One left half-made for a minute (a writer killed while making it: it holds
        no record) is said once."""
        now = time.monotonic()
        since = self._unready.setdefault(name, now)
        if now - since > UNREADY_WARN_S:
            self._unready[name] = float("inf")
            log.warning(
                "ring %s has been half-made for %g s (its writer died making it?); it "
                "holds no record: remove it with `logsdk shm remove %s`",
                name,
                UNREADY_WARN_S,
                name,
            )

    def _add(self, pid: str, reader: RingReader | None) -> None:
        src = Source(
            pid,
            agent_dir(self._root) / pid,
            reader,
            synchronous=self.config.spool_synchronous,
            max_bytes=self.config.spool_max_bytes,
        )
        self._sources[pid] = src
        log.info("producer %s: %s", pid, "ring found" if reader else "spool found")
        if src.spool_unread:
            self._open_spool(src, quiet=False)

    def _open_spool(self, src: Source, *, quiet: bool) -> None:
        """Open the spool a source found on disk; one that fails is said (``quiet``: only
        when it opens at last) and tried again at the next scan, its rows kept."""
        try:
            src.open_spool()
        except LogSDKError as exc:
            if not quiet:
                log.error(
                    "spool of producer %s not opened: %s; its records are kept and it is "
                    "tried again",
                    src.producer_id,
                    exc,
                )
            return
        if quiet:
            log.warning("spool of producer %s opened at last", src.producer_id)

    def _finish(self) -> None:
        """stop(): wait for librdkafka's records until the deadline, applying reports."""
        client = self._client
        while time.monotonic() < self._stop_by and any(
            s.inflight or s.replaying for s in self._sources.values()
        ):
            client.poll(0.05)
            self._after_poll()
        _client.purge_without_waiting(client)
        client.poll(0)
        self._after_poll()

    # -- the probe thread --------------------------------------------------------------------

    def _probe(self) -> None:
        conf = self._pconf.probe_config()
        wait = 0.0  # the first probe at once
        while not self._stop.wait(wait):
            wait = self.config.probe_interval_s
            if (
                self.down
                and not self._back.is_set()
                and _client.probe(conf, "", self.config.probe_timeout_s, self._stop)
            ):
                self._back.set()
