"""Hooks into a LogProducer for tests that must inject a fault at an exact instant or look
at one part's state, built on the public pieces of the producer's engine (its parts, and
the client port every client is made through): no test reaches into the parts itself, and
no production class carries a field for them. Not for production use."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from logsdk.producer._producer import LogProducer, engine_of
from logsdk.producer._records import HEADER_SEQ, _seq_of
from logsdk.producer._wiring import Parts
from logsdk.shm._ring import ShmRing

#: ``tracer(seq, err, msg)``: one delivery report, before the producer serves it.
Tracer = Callable[[int, KafkaError | None, Message], None]


class ProducerHooks:
    """Hooks into one producer (see the module docstring)."""

    def __init__(self, producer: LogProducer) -> None:
        self._producer = producer

    @property
    def _parts(self) -> Parts:
        return engine_of(self._producer).parts  # a forked child's own, once it started

    def trace_reports(self, tracer: Tracer) -> None:
        """``tracer(seq, err, msg)`` on the pump thread before each delivery report is
        served, fresh and replayed (seq -1: a purged replay report, which has no headers).
        Install it right after the producer is built: it sees the records produced from
        then on."""
        parts = self._parts
        replayed = parts.replay.ack  # the callbacks of replayed rows
        parts.clients.wrap(lambda client: _Traced(client, tracer, replayed))
        with parts.intake.lock:  # a client made already (a replay begun at the start)
            client = parts.flight.client
            if client is not None:
                traced: Any = _Traced(client, tracer, replayed)
                parts.flight.install(traced)

    @contextlib.contextmanager
    def client_wrapped(self, wrap: Callable[[Any], Any]) -> Iterator[None]:
        """Meanwhile, records go through ``wrap(client)`` (a stand-in that calls the real
        client and then fails at the instant a test needs); the real one after."""
        parts = self._parts
        flight, lock = parts.flight, parts.intake.lock
        with lock:
            real = flight.client
            flight.install(wrap(real))
        try:
            yield
        finally:
            with lock:
                flight.install(real)

    @property
    def ring(self) -> ShmRing | None:
        """The producer's shm ring (``buffer="shm"``), else None."""
        return self._parts.ring

    def delay_connect(self, seconds: float) -> None:
        """Every client made from now on waits ``seconds`` before its first metadata
        request (a recovery's connect), as on a loaded machine; the producer's stop still
        ends the wait."""
        stop = self._parts.stop
        self._parts.clients.wrap(lambda client: _SlowFirstMetadata(client, seconds, stop))

    def ticket_table(self) -> tuple[int, int]:
        """The in-flight table: (its size, the tickets free). Equal: every ticket is back."""
        return self._parts.flight.tickets()


class _Client:
    """A stand-in for a client that passes everything on to the real one."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __len__(self) -> int:
        return len(self._real)


class _Traced(_Client):
    """Each record's delivery report goes through the tracer first: with the seq it was
    produced with, or for a replayed row the seq its report's headers carry (as the
    replay itself reads it)."""

    def __init__(self, real: Any, tracer: Tracer, replayed: type) -> None:
        super().__init__(real)
        self._tracer = tracer
        self._replayed = replayed

    def produce(self, *args: Any) -> None:
        topic, value, key, partition, on_delivery, callback, timestamp, headers = args
        sent = next((int(v) for n, v in reversed(headers) if n == HEADER_SEQ), -1)
        tracer, replayed = self._tracer, isinstance(on_delivery, self._replayed)

        def report(err: KafkaError | None, msg: Message) -> None:
            seq = sent
            if replayed:
                try:
                    seq = _seq_of(msg)
                except Exception:  # a purged report has no headers
                    seq = -1
            tracer(seq, err, msg)
            on_delivery(err, msg)

        self._real.produce(topic, value, key, partition, report, callback, timestamp, headers)


class _SlowFirstMetadata(_Client):
    """The first metadata request waits (see `ProducerHooks.delay_connect()`)."""

    def __init__(self, real: Any, seconds: float, stop: threading.Event) -> None:
        super().__init__(real)
        self._wait: float | None = seconds
        self._stop = stop

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        wait, self._wait = self._wait, None
        if wait is not None and self._stop.wait(wait):
            raise _stopped()
        return self._real.list_topics(*args, **kwargs)


def _stopped() -> Exception:
    return KafkaException(KafkaError(KafkaError._TRANSPORT, "stopped while delayed"))


def producer_hooks(producer: LogProducer) -> ProducerHooks:
    """Testing hooks into ``producer``: ``trace_reports(fn)``, ``client_wrapped(wrap)``
    (a context manager), ``ring``, ``delay_connect(seconds)``, ``ticket_table()``. For
    tests only: they reach past the producer's public API."""
    return ProducerHooks(producer)
