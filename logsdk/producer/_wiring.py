"""The wiring: a producer's parts, built and connected by one function.

`wire()` is the one place that says which part talks to which. It is used by the
engine (``logsdk.producer._engine``: a ``LogProducer``'s, and a drain's of another
process's slot), by the tests of the parts (no thread started: the building thread owns
them all), and by whatever else runs the engine over a spool of its own (a host agent).
It starts nothing and opens nothing but the first seq reservation: the spool (and the shm
ring) are the caller's, opened before and closed after.

A record's path through the parts, and who owns what: docs/engineering/design.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from logsdk._owner import Owner
from logsdk.producer import _client
from logsdk.producer._alarm import DiskAlarm
from logsdk.producer._config import ProducerConfig
from logsdk.producer._counters import Counters
from logsdk.producer._custody import Custody
from logsdk.producer._drains import Drain, Drains
from logsdk.producer._health import Health
from logsdk.producer._identity import SeqReserver
from logsdk.producer._inflight import Handback, InFlight
from logsdk.producer._intake import Intake
from logsdk.producer._pump import Pump, PumpParts, Requests, State
from logsdk.producer._records import HEADER_PRODUCER, Rec
from logsdk.producer._rejects import Rejects
from logsdk.producer._replay import Replayer
from logsdk.shm._ring import ShmRing
from logsdk.spool._spool import Spool


@dataclass(frozen=True)
class Parts:
    """A producer's parts, wired (see the module docstring). Each part's docstring says
    which thread owns it and what other threads may call."""

    config: ProducerConfig
    #: The slot of ``spool_dir`` the spool is (0 for a spool of its own).
    slot: int
    spool: Spool
    ring: ShmRing | None
    counters: Counters
    clients: _client.Clients
    #: Set by close(): the pump, the health thread and a new client's connect end on it.
    stop: threading.Event
    #: Notified after every pump step (flush() and close() wait on it).
    done: threading.Condition
    requests: Requests
    seqs: SeqReserver
    rejects: Rejects
    flight: InFlight
    intake: Intake
    alarm: DiskAlarm
    custody: Custody
    replay: Replayer
    pump: Pump
    drains: Drains
    health: Health


def wire(
    config: ProducerConfig,
    spool: Spool,
    slot: int = 0,
    *,
    ring: ShmRing | None = None,
    first_use: Callable[[], Intake] | None = None,
    open_drain: Callable[[int, Path], Drain] | None = None,
) -> Parts:
    """The parts of a producer on ``spool`` (opened, owned by the calling thread), wired.

    ``ring``: the shm ring every accepted record is also kept in (``buffer="shm"``).
    ``first_use``: what the first record (and every record on an intake a forked child
    left behind) asks for first; it returns the intake to take the record (by default,
    this one, ready at once). ``open_drain``: makes a drain for a free slot of
    ``spool_dir`` (None: this producer drains no other slot)."""
    counters = Counters()
    clients = _client.Clients(config.librdkafka())
    stop = threading.Event()
    done = threading.Condition()
    requests = Requests()
    owner = Owner(f"the pump state of producer {spool.producer_id}")
    pid_header = (HEADER_PRODUCER, spool.producer_id.encode())
    seqs = SeqReserver(spool, counters)
    rejects = Rejects(spool, ring, counters)
    custody: Custody | None = None  # made below, once the intake it takes from is

    def take_back(rec: Rec, may_arrive: bool) -> None:
        custody.take_back(rec, may_arrive)  # type: ignore[union-attr]  # made before any report

    handback = Handback(take_back, rejects.reject, requests.degrade)
    flight = InFlight(config, clients, pid_header, counters, handback, ring, stop)
    alarm = DiskAlarm(spool, counters, owner)

    def ready_at_once() -> Intake:
        intake.warmed()
        return intake

    intake = Intake(
        config,
        seqs.span(),
        flight=flight,
        ring=ring,
        rejects=rejects,
        counters=counters,
        wake=requests.wake,
        degrade=requests.degrade,
        alarm=lambda: alarm.reason,
        first_use=ready_at_once if first_use is None else first_use,
    )
    custody = Custody(config, intake, spool, ring, alarm, counters, owner)
    replay = Replayer(config, spool, flight, alarm, rejects, counters, requests.degrade, owner)
    pump_parts = PumpParts(spool, seqs, flight, custody, rejects, replay, alarm, counters)
    pump = Pump(config, intake, requests, stop, done, owner, pump_parts)

    def probe(timeout: float) -> bool:
        return _client.probe(config.probe_config(), config.topic, timeout, stop)

    drains = Drains(
        config,
        slot,
        open_drain=open_drain or _no_drain,
        degraded=lambda: pump.state is State.DEGRADED,
        answered=lambda: flight.answered,
        probe=probe,
        counters=counters,
        enabled=open_drain is not None,
    )
    health = Health(
        config, pump, flight, replay, counters, stop, drains.scan, lambda: intake.closing
    )
    return Parts(
        config, slot, spool, ring, counters, clients, stop, done, requests, seqs, rejects,
        flight, intake, alarm, custody, replay, pump, drains, health,
    )  # fmt: skip


def _no_drain(index: int, path: Path) -> Drain:
    raise RuntimeError("this producer drains no other slot")  # Drains(enabled=False)
