"""The records in librdkafka's hands: the client, the in-flight table, delivery reports.

Invariants owned here:
- every fresh record handed to a client holds a ticket, and its record sits in
  ``_slots[ticket]`` until its delivery report: acknowledged (``_n_acked``) or handed back
  (``_n_failed``: to the spool, or to the rejected table). A ticket is reused only after
  its report (or after produce() refused the record: nothing of it is in librdkafka);
- ``_n_produced - _n_acked - _n_failed`` is what librdkafka holds; it is never seen one
  too small (a record is in the table and counted before produce() is called);
- a report without an offset (a duplicate-sequence reply), and the rest of its batch, is
  never counted as acknowledged: the record is resent (see ``_UNCONFIRMED``);
- a client is dropped only once it owes no report; one that still owes some after its
  purge is kept (``_zombies``) and polled until it does;
- reports run on the pump thread only (poll() and flush() are called there, and in
  close() once the pump has stopped).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, ClassVar

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from logsdk.producer import _client
from logsdk.producer._identity import _Identity
from logsdk.producer._records import HEADER_SEQ, KHeaders, Rec, _row

if TYPE_CHECKING:
    from logsdk.producer._producer import LogProducer

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


class _Ticket(int):
    """A slot of the producer's in-flight table, and the delivery callback of the record
    that holds it.

    librdkafka holds the callback of every record in flight, and the record must come
    back with its report (librdkafka drops the headers from purged reports: nothing is
    rebuilt from one). The record itself is a plain tuple in ``_slots[ticket]``; the
    tickets are reused, so a producer in steady state allocates no object the garbage
    collector tracks beyond the record's own tuple, which the collector stops tracking at
    its first pass when every field is a str, bytes, int or None (a record with user
    headers holds their list, and stays tracked until its report). A callback object per
    record (the record as a tuple subclass, before) is tracked until its report: with
    100k records in flight, CPython's collector took 100-140 ms of a 1 s benchmark round.
    Each producer has its own subclass that names it in ``_producer``.
    """

    __slots__ = ()
    _producer: ClassVar[LogProducer]

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        p = self._producer
        slots = p._slots
        rec: Rec = slots[self]  # type: ignore[assignment]  # set before produce()
        slots[self] = None
        p._free.append(self)  # the record is out of the table: the ticket may serve again
        # _on_delivery()'s ack path, inlined (no chain of unconfirmed reports under way)
        if err is None and not p._dupseq and msg.offset() is not None:
            # Settled before counted: flush() reads the count, and what it saw acknowledged
            # is no longer pending in the ring.
            if p._shm is not None:
                p._shm.settle(rec[5])
            p._n_acked += 1  # _polled() notes the time of the progress, once per poll
            return
        p._on_delivery(rec, err, msg)


class _InFlight(_Identity):
    """The client and the records it holds (a part of :class:`LogProducer`)."""

    def _init_inflight(self) -> None:
        self._client = None
        self._zombies = []
        self._ticket = type("_Ticket", (_Ticket,), {"__slots__": (), "_producer": self})
        self._slots = []
        self._free = []
        self._n_produced = 0
        self._n_acked = 0
        self._n_failed = 0
        self._n_possible_dups = 0
        self._n_unconfirmed = 0
        self._dupseq = {}
        self._last_ack = time.monotonic()
        self._acked_polled = 0
        self._answered = False

    def _new_client(self) -> Producer:
        return _client.new_producer(self.config.librdkafka(), self._on_error)

    def _connect(self, client: Producer) -> None:
        """Have a new client connect to the cluster's brokers before the replay starts.

        An idempotent client sends nothing before the broker gives it a producer id, and
        librdkafka asks for one on a 500 ms timer unless a broker connection comes up
        meanwhile. Its first metadata answer comes through the bootstrap connection, which
        it then closes; the first attempt finds no broker up, and with the real broker not
        yet connected (librdkafka connects on demand) the id came 0.5 to 1 s after the
        client was built, measured: the whole replay window waited for it. A second
        metadata request needs a real broker connection; once that is up the id is asked
        at once (about 70 ms after the client was built instead of 500 to 1000).
        Best effort: a failure here only leaves librdkafka to its timer.
        """
        timeout = min(self.config.probe_timeout_s, 1.0)
        for _ in range(2):
            try:
                _client.list_topics_until(client, self._topic, timeout, self._stop)
            except KafkaException:
                return

    def _outstanding(self) -> int:
        return self._n_produced - self._n_acked - self._n_failed

    def _new_ticket(self) -> _Ticket:
        """A ticket for one more record in flight (none free: the table grows by one)."""
        ticket = self._ticket(len(self._slots))
        self._slots.append(None)
        return ticket

    def _give_back(self, ticket: _Ticket) -> None:
        """produce() refused the record under ``ticket``: librdkafka holds neither, so no
        report will free it. (Any other exception keeps the ticket taken: had the record
        gone in, its report will come; a leak, never a reuse under a live record.)"""
        self._slots[ticket] = None
        self._free.append(ticket)

    def _produce_rec(self, rec: Rec) -> bool:
        """Hand one record to the client (caller holds _lock), under a ticket that brings it
        back with its delivery report.

        True: handed over. False: not now (librdkafka's queue is full, or the client is
        broken and a degrade is requested). Raises KafkaException when librdkafka refuses
        the record itself (too large, invalid): the caller decides what that means.
        """
        topic, k, v, h, ts, seq = rec
        hdrs: KHeaders = [self._pid_header, (HEADER_SEQ, b"%d" % seq)]
        if h:
            hdrs = [*h, *hdrs]
        free = self._free
        ticket = free.pop() if free else self._new_ticket()
        self._slots[ticket] = rec
        try:
            # librdkafka drops headers from the reports of purged records, so the record
            # comes back through its ticket: nothing is rebuilt from a report.
            self._client.produce(  # type: ignore[union-attr]
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
            self._give_back(ticket)
            if isinstance(exc, BufferError):
                return False
            if not isinstance(exc, KafkaException) or _client.is_record_exception(exc):
                raise
            self._errors.add("produce_error")
            self._request_degrade(f"produce failed: {exc}")
            return False
        self._n_produced += 1
        return True

    def _on_delivery(self, rec: Rec, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            if not self._unconfirmed(msg):
                if self._shm is not None:
                    self._shm.settle(rec[5])
                self._n_acked += 1
                return
            # Unconfirmed: a delivery that possibly persisted the record; spooled, resent.
            self._failed.append(rec)
            self._n_failed += 1
            self._unconfirmed_seen()
            return
        if _client.is_record_error(err):
            self._reject(rec, err)
            self._n_failed += 1
            return
        if _client.possibly_persisted(err, self._answered):
            self._n_possible_dups += 1
        self._errors.add(err.name())
        self._failed.append(rec)  # before the count below: flush() must never miss it
        self._n_failed += 1
        self._request_degrade(f"delivery failed: {err.str()}")

    def _reject(self, rec: Rec, err: KafkaError) -> None:
        with self._lock:
            self._n_rejected += 1
        self._errors.add("rejected")
        log.error("record seq=%d rejected by Kafka (%s); set aside in the spool", rec[5], err.str())
        self._rejects.append((_row(rec), err.str()))

    def _unconfirmed(self, msg: Message) -> bool:
        """True for a "delivered" report that no offset confirms (see ``_UNCONFIRMED``).

        librdkafka gives the batch's base offset to its first record and base+i to the
        others; after a duplicate-sequence reply the base is -1, so the first record has no
        offset and the rest of its batch come right after it (in the same poll) with the
        offsets 0, 1, 2... Those are unconfirmed too. The chain ends at the first report of
        that partition that breaks it, and at the end of the poll (``_polled``).
        """
        off = msg.offset()
        key = (msg.topic(), msg.partition())
        if off is None:
            self._dupseq[key] = 0
            return True
        nxt = self._dupseq.get(key)
        if nxt is None:
            return False
        if off == nxt:
            self._dupseq[key] = nxt + 1
            return True
        del self._dupseq[key]
        return False

    def _unconfirmed_seen(self) -> None:
        """Count one unconfirmed delivery report and degrade, so its record is resent."""
        self._n_unconfirmed += 1
        self._errors.add("unconfirmed_ack")
        self._n_possible_dups += 1
        self._request_degrade(_UNCONFIRMED)

    def _polled(self) -> None:
        """A poll or flush returned: every batch it reported is complete, and the ring
        slots of the records it settled are flagged (one lock for the lot). Acknowledgements
        it served count as progress for the stall detector (one clock read per poll, not
        per record: delivery reports are only served inside poll() and flush())."""
        self._pump_owner.check("serve delivery reports")
        if self._n_acked != self._acked_polled:
            self._acked_polled = self._n_acked
            self._last_ack = time.monotonic()
            self._answered = True
        if self._dupseq:
            self._dupseq.clear()
        if self._shm is not None:
            self._shm.drain_settled()

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._errors.add("fatal")
            self._request_degrade(f"fatal client error: {err.str()}")
        elif _client.is_cluster_down(err):
            self._request_degrade(f"cluster unreachable: {err.str()}")

    def _retire_client(self) -> None:
        self._pump_owner.check("retire the client")
        client, self._client = self._client, None
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
            self._polled()
            if self._zombies:
                self._poll_retired()
        if len(client) > 0:
            # Never drop a client that still owes delivery reports: its records would be lost.
            log.error(
                "client still holds %d record(s) after purge; keeping it until it reports",
                len(client),
            )
            self._zombies.append((client, time.monotonic()))
        else:
            del client

    def _poll_retired(self) -> None:
        """Serve the reports of clients retired while they still owed some; a client that
        owes none (librdkafka's out queue is empty) is dropped."""
        keep = []
        for z, since in self._zombies:
            z.poll(0)
            self._polled()
            if len(z):
                keep.append((z, since))
            else:
                log.warning(
                    "retired client reported its last record %.1fs after its purge",
                    time.monotonic() - since,
                )
        self._zombies = keep
