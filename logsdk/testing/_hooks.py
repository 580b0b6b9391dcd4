"""Hooks into a LogProducer for tests (see :class:`~logsdk.producer._hooks.ProducerHooks`)."""

from __future__ import annotations

from logsdk.producer._hooks import ProducerHooks
from logsdk.producer._producer import LogProducer


def producer_hooks(producer: LogProducer) -> ProducerHooks:
    """Testing hooks into ``producer``: ``trace_reports(fn)``, ``client_wrapped(wrap)``
    (a context manager), ``ring``, ``delay_connect(seconds)``, ``ticket_table()``. For
    tests only: they reach past the producer's public API."""
    return producer._testing_hooks()
