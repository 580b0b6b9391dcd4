"""The records in librdkafka's hands: the client, the in-flight table, delivery reports.

Invariants owned here:
- every fresh record handed to a client holds a ticket, and its record sits in
  ``slots[ticket]`` until its delivery report: acknowledged (``acked``) or handed back (to
  custody: the spool, or the rejected table). A ticket is reused only after its report
  (or after produce() refused the record: nothing of it is in librdkafka);
- what librdkafka holds is the tickets in use (``outstanding()``); it is never seen one
  too small: a record is in the table before produce() is called, and a failed record
  reaches custody before its ticket is freed;
- a report without an offset (a duplicate-sequence reply), and the rest of its batch, is
  never counted as acknowledged: the record is resent (see ``_UNCONFIRMED``);
- a client is dropped only once it owes no report; one that still owes some after its
  purge is kept (``zombies``) and polled until it does;
- reports run on the pump thread only (poll() and flush() are called there, and in
  close() once the pump has stopped).

Owner: the pump thread (``owner``), except the ticket table, which the send path shares:
``Intake.send()`` takes a ticket (``free.pop()``, ``slots[t] = rec``, under the send lock:
`InFlight.produce()` inlined on the hot path) and the pump's reports give it back
(``slots[t] = None``, ``free.append(t)``); each is one list operation, atomic under the
GIL, and one thread at a time pops (a sender while direct sends are on, the pump feeding
the backlog while they are off), so a ticket is never handed out twice. ``client`` is
published (send() produces through it, the health thread probes through it); the pump
replaces it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import ClassVar

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from logsdk._owner import Owner
from logsdk.producer import _client
from logsdk.producer._config import ProducerConfig
from logsdk.producer._counters import Counters
from logsdk.producer._records import Rec, kafka_headers
from logsdk.shm._ring import ShmRing

log = logging.getLogger("logsdk.producer")

_PURGE_WAIT_S = 30.0  # how long a purge may take to hand records back
#: A delivery report without an error but without an offset either. librdkafka reports a
#: DUPLICATE_SEQUENCE_NUMBER reply as a success with no offset: the broker says it already
#: has the batch. Apache Kafka only says so for a batch it stored, but a broker that saved
#: the producer's sequence and then failed before storing the batch (Tansu 0.6 with S3
#: storage does this after a crash) says so too, and the records are gone. Such records are
#: treated as possibly persisted: spooled and resent (a duplicate at worst, which the
#: headers identify), never counted as acknowledged.
_UNCONFIRMED = "delivery reported without an offset (duplicate sequence reply); resending"


class Handback:
    """Where a fresh record goes when librdkafka hands it back (on the pump): to custody,
    to be spooled and resent, or set aside as refused."""

    def __init__(
        self,
        failed: Callable[[Rec, bool], None],
        rejected: Callable[[Rec, str], None],
        degrade: Callable[[str], None],
    ) -> None:
        #: A record to spool and resend (failed, or reported without an offset), and
        #: whether a broker may still store the one this client sent (see
        #: ``Custody.keep_through``).
        self.failed = failed
        #: A record Kafka refused, with why (``Rejects.reject``).
        self.rejected = rejected
        #: Ask the pump to degrade, with why.
        self.degrade = degrade


class _Ticket(int):
    """A slot of the in-flight table, and the delivery callback of the record that holds it.

    librdkafka holds the callback of every record in flight, and the record must come
    back with its report (librdkafka drops the headers from purged reports: nothing is
    rebuilt from one). The record itself is a plain tuple in ``slots[ticket]``; the
    tickets are reused, so a producer in steady state allocates no object the garbage
    collector tracks beyond the record's own tuple, which the collector stops tracking at
    its first pass when every field is a str, bytes, int or None (a record with user
    headers holds their list, and stays tracked until its report). A callback object per
    record (the record as a tuple subclass, before) is tracked until its report: with
    100k records in flight, CPython's collector took 100-140 ms of a 1 s benchmark round.
    Each in-flight table has its own subclass that names it in ``_flight``.
    """

    __slots__ = ()
    _flight: ClassVar[InFlight]

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        f = self._flight
        slots = f.slots
        rec: Rec = slots[self]  # type: ignore[assignment]  # set before produce()
        # on_delivery()'s ack path, inlined (no chain of unconfirmed reports under way)
        if err is None and not f.dupseq and msg.offset() is not None:
            # Settled before counted: flush() reads the count, and what it saw acknowledged
            # is no longer pending in the ring.
            f.settle(rec[5])
            f.acked += 1  # polled() notes the time of the progress, once per poll
        else:
            f.on_delivery(rec, err, msg)  # in custody's hands before the ticket is free
        slots[self] = None
        f.free.append(self)  # the record is out of the table: the ticket may serve again


class InFlight:
    """The client and the records it holds (see the module docstring)."""

    def __init__(
        self,
        config: ProducerConfig,
        clients: _client.Clients,
        pid_header: tuple[str, bytes],
        counters: Counters,
        handback: Handback,
        ring: ShmRing | None,
        stop: threading.Event,
    ) -> None:
        self._config = config
        self._topic = config.topic
        self._clients = clients
        #: The ``logsdk.producer`` header every record of this producer carries.
        self.pid_header = pid_header
        self._counters = counters
        self._handback = handback
        self._stop = stop
        self.owner = Owner("the in-flight table of a producer")
        self._ring = ring
        #: ``settle(seq)``: the acknowledged record's ring slot is free (a no-op without one).
        self.settle: Callable[[int], None] = ring.settle if ring is not None else _no_ring
        #: The current client (None while DEGRADED, and until the first send()). Published.
        self.client: Producer | None = None
        #: Retired clients that still owe reports, with when they were retired.
        self.zombies: list[tuple[Producer, float]] = []
        self.ticket: type[_Ticket] = type("_Ticket", (_Ticket,), {"__slots__": (), "_flight": self})
        self.slots: list[Rec | None] = []  # in-flight records, by ticket
        self.free: list[_Ticket] = []  # tickets not in use
        self.acked = 0  # fresh records acknowledged
        self.possible_dups = 0
        self.unconfirmed = 0  # "delivered" reports without an offset: resent
        # (topic, partition) -> the offset librdkafka gives the next record of a batch whose
        # first record came back without one (see is_unconfirmed); empty almost always.
        self.dupseq: dict[tuple[str | None, int | None], int] = {}
        #: When an acknowledgement last came (the stall detector's clock). Published.
        self.last_ack = time.monotonic()
        self._acked_polled = 0
        #: Kafka answered (an acknowledgement) since the last degrade. Published; the pump
        #: and the health thread set it, the pump clears it after a degrade.
        self.answered = False

    # -- the client --------------------------------------------------------------------

    def new_client(self) -> Producer:
        """A client for this producer (any thread: the first send() makes one)."""
        return self._clients.new(self._on_error)

    def connect(self, client: Producer) -> None:
        """Have a new client connect before the replay starts (see ``Clients.connect``);
        best effort, given up at the producer's stop."""
        timeout = min(self._config.probe_timeout_s, 1.0)
        self._clients.connect(client, self._topic, timeout, self._stop)

    def outstanding(self) -> int:
        """Records librdkafka holds (any client): the tickets in use. Any thread."""
        return len(self.slots) - len(self.free)

    def tickets(self) -> tuple[int, int]:
        """The in-flight table: (its size, the tickets free). Any thread."""
        return len(self.slots), len(self.free)

    def new_ticket(self) -> _Ticket:
        """A ticket for one more record in flight (none free: the table grows by one).
        The send path, under the send lock."""
        ticket = self.ticket(len(self.slots))
        self.slots.append(None)
        return ticket

    def give_back(self, ticket: _Ticket) -> None:
        """produce() refused the record under ``ticket``: librdkafka holds neither, so no
        report will free it. (Any other exception keeps the ticket taken: had the record
        gone in, its report will come; a leak, never a reuse under a live record.)"""
        self.slots[ticket] = None
        self.free.append(ticket)

    def produce(self, rec: Rec) -> bool:
        """Hand one accepted record to the client (the pump, feeding the backlog with direct
        sends off), under a ticket that brings it back with its delivery report.
        ``Intake.send()`` inlines this on the hot path.

        True: handed over. False: not now (librdkafka's queue is full, or the client is
        broken and a degrade is requested). Raises KafkaException, ValueError or TypeError
        when librdkafka refuses the record itself (too large, invalid).
        """
        topic, k, v, h, ts, seq = rec
        hdrs = kafka_headers(self.pid_header, b"%d" % seq, h)
        free = self.free
        ticket = free.pop() if free else self.new_ticket()
        self.slots[ticket] = rec
        try:
            # librdkafka drops headers from the reports of purged records, so the record
            # comes back through its ticket: nothing is rebuilt from a report.
            self.client.produce(  # type: ignore[union-attr]
                topic,
                v,
                k,
                -1,
                ticket,
                None,
                ts or 0,
                hdrs,
            )
        except (BufferError, KafkaException, ValueError, TypeError) as exc:
            self.give_back(ticket)
            if isinstance(exc, BufferError):
                return False
            if not isinstance(exc, KafkaException) or _client.is_record_exception(exc):
                raise
            self._counters.error("produce_error")
            self._handback.degrade(f"produce failed: {exc}")
            return False
        return True

    # -- delivery reports (pump) -------------------------------------------------------

    def on_delivery(self, rec: Rec, err: KafkaError | None, msg: Message) -> None:
        """A fresh record's report, other than a plain acknowledgement (pump thread)."""
        if err is None:
            if not self.is_unconfirmed(msg):
                self.settle(rec[5])
                self.acked += 1
                return
            # Unconfirmed: a delivery that possibly persisted the record; spooled, resent.
            # The broker answered for that batch: it will not store it later.
            self._handback.failed(rec, False)
            self.unconfirmed_seen()
            return
        if _client.is_record_error(err):
            self._handback.rejected(rec, err.str())
            return
        may_arrive = _client.possibly_persisted(err, self.answered)
        if may_arrive:
            self.possible_dups += 1
        self._counters.error(err.name())
        self._handback.failed(rec, may_arrive)
        self._handback.degrade(f"delivery failed: {err.str()}")

    def is_unconfirmed(self, msg: Message) -> bool:
        """True for a "delivered" report that no offset confirms (see ``_UNCONFIRMED``).

        librdkafka gives the batch's base offset to its first record and base+i to the
        others; after a duplicate-sequence reply the base is -1, so the first record has no
        offset and the rest of its batch come right after it (in the same poll) with the
        offsets 0, 1, 2... Those are unconfirmed too. The chain ends at the first report of
        that partition that breaks it, and at the end of the poll (``polled``).
        """
        off = msg.offset()
        key = (msg.topic(), msg.partition())
        if off is None:
            self.dupseq[key] = 0
            return True
        nxt = self.dupseq.get(key)
        if nxt is None:
            return False
        if off == nxt:
            self.dupseq[key] = nxt + 1
            return True
        del self.dupseq[key]
        return False

    def unconfirmed_seen(self) -> None:
        """Count one unconfirmed delivery report and degrade, so its record is resent."""
        self.unconfirmed += 1
        self._counters.error("unconfirmed_ack")
        self.possible_dups += 1
        self._handback.degrade(_UNCONFIRMED)

    def poll(self, timeout: float) -> None:
        """Serve the current client's reports (pump thread)."""
        client = self.client
        if client is not None:
            client.poll(timeout)
            self.polled()

    def polled(self) -> None:
        """A poll or flush returned: every batch it reported is complete. Acknowledgements
        it served count as progress for the stall detector (one clock read per poll, not
        per record: delivery reports are only served inside poll() and flush())."""
        self.owner.check("serve delivery reports")
        if self.acked != self._acked_polled:
            self._acked_polled = self.acked
            self.last_ack = time.monotonic()
            self.answered = True
        if self.dupseq:
            self.dupseq.clear()
        if self._ring is not None:
            self._ring.drain_settled()  # the ring slots of the records it settled: one lock

    def install(self, client: Producer | None) -> None:
        """The client to produce through from now on (the pump's recovery; the first
        send(), under the send lock, while ONLINE with none installed)."""
        self.client = client

    def forget_answer(self) -> None:
        """A degrade (pump): Kafka has not answered since."""
        self.answered = False

    def answered_probe(self) -> None:
        """A probe of the cluster succeeded (health thread): Kafka answers."""
        self.answered = True

    def count_possible_dup(self) -> None:
        """A record handed back may be in Kafka already (a replay's, counted here too)."""
        self.possible_dups += 1

    def heard(self) -> None:
        """Kafka acknowledged something (a replay batch, on the pump): progress for the
        stall detector, and proof that Kafka answers."""
        self.last_ack = time.monotonic()
        self.answered = True

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._counters.error("fatal")
            self._handback.degrade(f"fatal client error: {err.str()}")
        elif _client.is_cluster_down(err):
            self._handback.degrade(f"cluster unreachable: {err.str()}")

    def retire(self) -> None:
        """Take the client away: purge it and serve the reports of what it held (pump, or
        close() once the pump has ended)."""
        self.owner.check("retire the client")
        client, self.client = self.client, None
        if client is None:
            return
        try:
            _client.purge_without_waiting(client)
        except KafkaException as exc:  # a fatal client may refuse; its reports still come
            log.warning("purge failed: %s", exc)
        deadline = time.monotonic() + _PURGE_WAIT_S
        # len(client): its records not yet reported, and reports not yet served. Only this
        # client's: one retired earlier (still owing reports) is polled, not waited for.
        while len(client) > 0 and time.monotonic() < deadline:
            client.poll(0.05)
            self.polled()
            if self.zombies:
                self.poll_retired()
        if len(client) > 0:
            # Never drop a client that still owes delivery reports: its records would be lost.
            log.error(
                "client still holds %d record(s) after purge; keeping it until it reports",
                len(client),
            )
            self.zombies.append((client, time.monotonic()))
        else:
            del client

    def poll_retired(self) -> None:
        """Serve the reports of clients retired while they still owed some; a client that
        owes none (librdkafka's out queue is empty) is dropped."""
        keep = []
        for z, since in self.zombies:
            z.poll(0)
            self.polled()
            if len(z):
                keep.append((z, since))
            else:
                log.warning(
                    "retired client reported its last record %.1fs after its purge",
                    time.monotonic() - since,
                )
        self.zombies = keep

    def flush_retired(self) -> None:
        """close(), once the pump has ended: give retired clients a last chance to report."""
        for z, _ in self.zombies:
            z.flush(5)
            self.polled()

    def forget(self) -> None:
        """After the threads stopped (close()): nothing serves a report any more. The
        ticket class names this table, and the handback leads to custody, which takes from
        the intake, which produces through this table: reference cycles. Without them, a
        closed producer and its parts (one ticket per record in flight at the peak) are
        freed as soon as the application drops them, not at the cyclic collector's next
        full pass."""
        cls = self.ticket
        if vars(cls).get("_flight") is self:
            delattr(cls, "_flight")
        self._handback = _NOWHERE


def _no_ring(seq: int) -> None:
    """Without a ring, an acknowledged record frees nothing."""


def _nowhere(*args: object) -> None:
    """A closed producer's reports: none come (its threads have stopped)."""


_NOWHERE = Handback(_nowhere, _nowhere, _nowhere)
