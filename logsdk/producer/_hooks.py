"""Testing hooks into a LogProducer, for tests that must inject a fault at an exact instant
or look at one part's state: reached through :func:`logsdk.testing.producer_hooks`, so
that no test reaches into the producer's parts itself. Not for production use."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, Message

if TYPE_CHECKING:
    from logsdk.producer._producer import LogProducer
    from logsdk.shm._ring import ShmRing


class ProducerHooks:
    """Hooks into one producer (see the module docstring)."""

    def __init__(self, producer: LogProducer) -> None:
        self._p = producer

    def trace_reports(self, tracer: Callable[[int, KafkaError | None, Message], None]) -> None:
        """``tracer(seq, err, msg)`` on the pump thread before each delivery report is
        served, fresh and replayed (seq -1: a purged replay report, which has no headers).
        Install it right after the producer is built."""
        self._p._trace_reports(tracer)

    @contextlib.contextmanager
    def client_wrapped(self, wrap: Callable[[Any], Any]) -> Iterator[None]:
        """Meanwhile, records go through ``wrap(client)`` (a stand-in that calls the real
        client and then fails at the instant a test needs); the real one after."""
        flight, gate = self._p._flight, self._p._gate
        with gate.lock:
            real = flight.client
            flight.install(wrap(real))
        try:
            yield
        finally:
            with gate.lock:
                flight.install(real)

    @property
    def ring(self) -> ShmRing | None:
        """The producer's shm ring (``buffer="shm"``), else None."""
        return self._p._shm

    def delay_connect(self, seconds: float) -> None:
        """Every new client's first connection (a recovery's) waits ``seconds`` first, as
        on a loaded machine (a stop still ends the wait)."""
        self._p._flight.connect_delay_s = seconds

    def ticket_table(self) -> tuple[int, int]:
        """The in-flight table: (its size, the tickets free). Equal: every ticket is back."""
        flight = self._p._flight
        return len(flight.slots), len(flight.free)
