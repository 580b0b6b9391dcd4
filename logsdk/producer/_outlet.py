"""``delivery="agent"``: the application only writes each record into a shared-memory ring
of its own; ``logsdk agent`` (one per spool root) ships it to Kafka.

An `Outlet` stands where an `Engine` stands under a
``LogProducer``: it has no librdkafka client, no pump or health thread and no spool. Its
ring is made with ``drained_elsewhere`` (`logsdk.shm._ring`): the agent's reader
(`logsdk.shm._reader`) moves the tail once a record is in Kafka or committed to the
agent's spool, and this side only follows it.

Invariants owned here:
- the producer id is a fresh uuid per process (per ring): a forked child's first send
  makes a ring and an id of its own, and the parent's ring stays the parent's; seqs start
  at 0 in memory, unique under that id (no disk: no reservation is needed);
- a record is accepted only once its frame is in the ring (``when_full`` otherwise:
  ``block`` and ``drop_oldest`` wait up to ``max_block_s`` for the agent to make room,
  ``drop_newest`` drops it, counted, ``raise`` raises); senders write in turn under the
  send lock, so the ring holds them in send order;
- flush() and close() wait for the agent to have taken what was sent (the tail past it),
  within their timeouts, and return what is left: those records stay in the ring for the
  agent (a closed ring is unlinked only when nothing is left in it).

Owner: the send lock (`Outlet.lock`) guards the ring's writer side, ``_seq`` and
``written``; ``counters`` (drops) has a lock of its own; ``_stale`` is set in a forked
child before any other thread exists there and cleared under the lock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from logsdk.agent._lock import agent_running
from logsdk.agent._spawn import start_agent
from logsdk.errors import BufferFullError, ConfigError, ProducerClosedError, RecordTooLargeError
from logsdk.producer._config import ProducerConfig, check_topic
from logsdk.producer._counters import Counters
from logsdk.producer._process import gone, live
from logsdk.producer._pump import State
from logsdk.producer._records import _to_bytes, _user_headers
from logsdk.shm._reader import ring_name
from logsdk.shm._ring import ShmRing

log = logging.getLogger("logsdk.producer")

_TS_LIMIT = 1 << 63
_CLOSED = "the producer is closed; it accepts no more records"


class Outlet:
    """A producer that writes into its process's ring for ``logsdk agent`` (see the module
    docstring)."""

    def __init__(self, config: ProducerConfig) -> None:
        self.config = config
        self.lock = threading.Lock()
        self._topics_ok = {config.topic}
        self._closed = False
        self._stale = False
        #: Records written into the ring (the send lock's).
        self.written = 0
        #: Records dropped by ``when_full`` (any thread: a sender may drop without the lock).
        self.counters = Counters()
        self._ring, self.producer_id = self._new_ring()
        self._seq = 0
        self._warned = False
        live(self)  # told of forks; at exit, the ring unlinked if the agent took everything
        if config.start_agent and not agent_running(config.spool_dir):
            start_agent(config.spool_dir, config.bootstrap_servers, config.kafka_config)
            self._warned = True  # said by start_agent
        else:
            self.warn_without_agent()

    def _new_ring(self) -> tuple[ShmRing, str]:
        pid = uuid.uuid4().hex
        root = self.config.spool_dir
        name = ring_name(root, pid)
        ring = ShmRing.attach(
            name, self.config.shm_bytes, pid, os.path.realpath(root), drained_elsewhere=True
        )
        return ring, pid

    def warn_without_agent(self) -> bool:
        """Warn (once) when no agent holds the spool root; True when one does."""
        if agent_running(self.config.spool_dir):
            return True
        if not self._warned:
            self._warned = True
            log.warning(
                "delivery='agent': no logsdk agent drains spool root %s; records wait in "
                "the shared-memory ring %s until one starts (logsdk agent --spool-root %s "
                "--bootstrap-servers ...)",
                self.config.spool_dir,
                self._ring.name,
                self.config.spool_dir,
            )
        return False

    def forked(self) -> None:
        """In a forked child: the ring is the parent's (its descriptors were closed by
        the ring's own fork hook); the first send makes the child's own."""
        self._stale = True
        self.lock = threading.Lock()

    def left_open(self) -> bool:
        """At exit: this process's ring, not closed (a forked child's that never sent
        has none)."""
        return not self._closed and not self._stale

    def close_left_open(self, deadline: float) -> None:
        """At exit: the records are safe in the ring whatever happens; give the agent
        a moment (at most 1 s of the budget) to take them, so that the ring can go."""
        self.close(max(0.0, min(1.0, deadline - time.monotonic())))

    def _restart(self) -> None:
        with self.lock:
            if self._stale:
                self._ring, self.producer_id = self._new_ring()
                self._seq = self.written = 0
                self.counters = Counters()
                self._warned = False
                self._stale = False
                live(self)  # the exit hooks of this process (a pool's child leaves by _exit)

    # -- send ----------------------------------------------------------------------------

    def send(
        self,
        value: bytes | str | dict[str, Any],
        key: bytes | str | None = None,
        *,
        topic: str | None = None,
        headers: Mapping[str, bytes | str | None]
        | Sequence[tuple[str, bytes | str | None]]
        | None = None,
        timestamp: int | None = None,
    ) -> None:
        """``LogProducer.send()`` with ``delivery="agent"``: one frame into the ring."""
        if self._stale:
            self._restart()
        v = value if type(value) is bytes else _to_bytes(value, "value")
        k = key if (key is None or type(key) is bytes) else _to_bytes(key, "key")
        h = None if headers is None else _user_headers(headers)
        if topic is None:
            topic = self.config.topic
        elif type(topic) is not str or topic not in self._topics_ok:
            check_topic(topic)
            if len(self._topics_ok) > 10_000:
                self._topics_ok.clear()
            self._topics_ok.add(topic)
        if timestamp is not None and (type(timestamp) is not int or not 0 < timestamp < _TS_LIMIT):
            raise ConfigError(
                f"timestamp must be milliseconds since the epoch, >= 1, got {timestamp!r}"
            )
        size = (0 if v is None else len(v)) + (0 if k is None else len(k))
        if size > self.config.message_max_bytes:
            raise RecordTooLargeError(
                f"record of {size} bytes exceeds message_max_bytes={self.config.message_max_bytes}"
            )
        if timestamp is None:
            timestamp = time.time_ns() // 1_000_000
        cfg = self.config
        if not self.lock.acquire(timeout=cfg.max_block_s):
            self._full("another sender waits for room in the shm ring")
            return
        try:
            if self._closed:
                raise ProducerClosedError(_CLOSED)
            seq = self._seq
            ring = self._ring
            if not ring.put_fields(topic, k, v, h, timestamp, seq) and not self._wait_room(
                (topic, k, v, h, timestamp, seq)
            ):
                return
            self._seq = seq + 1
            self.written += 1
        finally:
            self.lock.release()

    def _wait_room(self, rec: tuple[Any, ...]) -> bool:
        """The ring is full (the lock held): ``when_full``. True once the record is in."""
        cfg, ring = self.config, self._ring
        if cfg.when_full in ("drop_newest", "raise"):
            self._full(f"shm ring full (shm_bytes={ring.capacity})")
            return False
        deadline = time.monotonic() + cfg.max_block_s
        while True:
            time.sleep(0.001)  # the agent makes room; the ring has no wake-up across processes
            if ring.put(rec):
                return True
            if time.monotonic() >= deadline:
                self.warn_without_agent()
                raise BufferFullError(
                    f"shm ring full (shm_bytes={ring.capacity}); waited max_block_s="
                    f"{cfg.max_block_s} for logsdk agent to make room"
                )

    def _full(self, reason: str) -> None:
        if self.config.when_full == "raise":
            raise BufferFullError(reason)
        if self.config.when_full == "drop_newest":
            self.counters.drop()
            return
        raise BufferFullError(f"{reason}; waited max_block_s={self.config.max_block_s}")

    # -- flush, close, stats -------------------------------------------------------------

    def undelivered(self) -> int:
        """Records in the ring the agent has not taken yet (the tail not past them)."""
        with self.lock:
            if not self._ring.closed:
                self._ring.publish_head()
        return self._ring.pending

    def flush(self, timeout: float | None = None) -> int:
        """Wait until the agent took every record sent so far (in Kafka, or in its spool),
        at most ``timeout`` seconds (None: 60); how many are left."""
        if self._stale:
            return 0
        deadline = time.monotonic() + (60.0 if timeout is None else max(0.0, timeout))
        while True:
            left = self.undelivered()
            if left == 0:
                return 0
            if time.monotonic() >= deadline:
                if not self.warn_without_agent():
                    log.warning("flush(): %d record(s) wait in the ring for an agent", left)
                return left
            time.sleep(0.005)

    flush_durable = flush

    def close(self, timeout: float | None = 30.0) -> None:
        """Wait as flush() does, then stop: what the agent has not taken stays in the ring
        (unlinked only when empty) for the agent."""
        if self._stale:
            with self.lock:
                self._closed = True
            gone(self)
            return
        left = self.flush(timeout)
        with self.lock:
            if self._closed:
                return
            self._closed = True
            left = self._ring.pending
            self._ring.close(unlink=left == 0)
        gone(self)
        if left:
            log.warning(
                "close(): %d record(s) left in the shared-memory ring %s for logsdk agent",
                left,
                self._ring.name,
            )

    @property
    def state(self) -> State:
        """ONLINE until closed: the agent, not this process, knows whether Kafka answers."""
        return State.CLOSED if self._closed else State.ONLINE

    def stats(self) -> dict[str, Any]:
        """``LogProducer.stats()`` with ``delivery="agent"``."""
        ring = self._ring
        pending = 0 if ring.closed else ring.pending
        return {
            "delivery": "agent",
            "state": self.state.value,
            "sent": self.written + self.counters.dropped,  # accepted, then some dropped
            "dropped": self.counters.dropped,
            "undelivered": pending,
            "shm_name": ring.name,
            "shm_capacity": ring.capacity,
            "shm_records": pending,
            "agent_running": agent_running(self.config.spool_dir),
        }
