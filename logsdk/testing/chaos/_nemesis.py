"""The nemesis: faults on a schedule drawn from the run's seed, in a thread of its own.

Two broker kinds, each with its own broker faults:

- the embedded broker (Tansu, durable, behind the proxy): ``broker_kill`` (SIGKILL, then
  a restart 1-3 s later) and ``broker_pause`` (SIGSTOP, SIGCONT 2-5 s later);
- Apache Kafka, three nodes behind proxies (``--broker apache``): ``leader_kill`` (the
  leader of a random partition SIGKILLed, restarted 1-3 s later: its leadership moves,
  it comes back and catches up) and ``node_pause`` (one node SIGSTOPped 2-5 s).

On both: ``net_cut`` (every connection reset for 2-6 s), ``spool_fill`` (a 4 s cut, long
enough to fill p0's small spool to its cap), ``consumer_kill`` (SIGKILL, restart 0.5-2 s
later) and, when a producer survives it (``shm``), ``producer_kill``.

Invariants: a fault is drawn every 3-7 s, and each is healed before the next is drawn; the
last 8 s of a run are quiet, so every fault is healed by its end; a fault that failed
does not end the nemesis (the broker is healed and made to run again). The same seed
draws the same schedule: each fault draws from the one ``random.Random(seed)`` in the
same order. Owner: the nemesis thread, from `unleash()` until it has joined it; it
appends to ``Run.events`` and ``Run.spool_problems`` and restarts ``Run``'s processes.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from logsdk.testing.chaos._workload import PARTITIONS, TOPIC, Run

log = logging.getLogger("logsdk.chaos")


@dataclass
class Step:
    """One fault being applied: what it may touch, and its name as the run's events show
    it (a fault that picks a node names it here before it acts, so a fault that fails
    is recorded with its node)."""

    run: Run
    broker: Any
    rng: random.Random
    #: Set at the end of the run: a fault waits on it, so that the end cuts it short.
    stop: threading.Event
    kind: str


#: A fault: applies itself to ``step`` and heals.
Fault = Callable[[Step], None]


def _leader_kill(step: Step) -> None:
    node = step.broker.leader_of(TOPIC, step.rng.randrange(PARTITIONS))
    step.kind = f"leader_kill(node {node})"
    step.broker.kill(node)
    step.stop.wait(step.rng.uniform(1.0, 3.0))
    ensure_broker(step.broker)


def _node_pause(step: Step) -> None:
    node = step.rng.choice(step.broker.node_ids)
    step.kind = f"node_pause(node {node})"
    step.broker.pause(node)
    step.stop.wait(step.rng.uniform(2.0, 5.0))
    step.broker.resume(node)


def _broker_kill(step: Step) -> None:
    step.broker.kill()
    step.stop.wait(step.rng.uniform(1.0, 3.0))
    ensure_broker(step.broker)


def _broker_pause(step: Step) -> None:
    step.broker.pause()
    step.stop.wait(step.rng.uniform(2.0, 5.0))
    step.broker.resume()


def _net_cut(step: Step) -> None:
    step.broker.cut()
    step.stop.wait(step.rng.uniform(2.0, 6.0))
    step.broker.heal()


def _spool_fill(step: Step) -> None:
    step.broker.cut()  # long enough for the small spool to reach its cap
    step.stop.wait(4.0)
    step.broker.heal()


def _producer_kill(step: Step) -> None:
    victim = step.rng.choice([p for p in step.run.producers if p.killable])
    victim.kill()
    victim.restarts += 1
    victim.start(step.run.work)


def _consumer_kill(step: Step) -> None:
    victim = step.rng.choice(step.run.consumers)
    victim.kill()
    step.stop.wait(step.rng.uniform(0.5, 2.0))
    victim.restarts += 1
    victim.start(step.run.work)


FAULTS: dict[str, Fault] = {
    "leader_kill": _leader_kill,
    "node_pause": _node_pause,
    "broker_kill": _broker_kill,
    "broker_pause": _broker_pause,
    "net_cut": _net_cut,
    "spool_fill": _spool_fill,
    "producer_kill": _producer_kill,
    "consumer_kill": _consumer_kill,
}


def fault_kinds(run: Run, cluster: bool) -> list[str]:
    """The faults the nemesis draws from, in the order it draws by (the seed's schedule
    depends on it): on a cluster (Apache Kafka's three nodes), a partition's leader killed
    and one node paused; on the embedded broker, the one broker killed or paused."""
    kinds = ["leader_kill", "node_pause"] if cluster else ["broker_kill", "broker_pause"]
    kinds += ["net_cut", "consumer_kill", "spool_fill"]
    if any(p.killable for p in run.producers):
        kinds.append("producer_kill")
    return kinds


def nemesis(run: Run, broker: Any, stop: threading.Event) -> None:
    """Apply faults until ``stop`` is set or the run's quiet end: one every 3-7 s, each
    healed before the next; every producer's spool is checked after each."""
    from logsdk.testing import ApacheKafka

    rng = random.Random(run.seed)
    t0 = time.monotonic()
    kinds = fault_kinds(run, isinstance(broker, ApacheKafka))
    while not stop.wait(rng.uniform(3.0, 7.0)):
        if time.monotonic() - t0 > run.duration - 8:
            break  # leave the end of the run quiet, so every fault is healed in it
        step = Step(run, broker, rng, stop, rng.choice(kinds))
        at = round(time.monotonic() - t0, 1)
        try:
            FAULTS[step.kind](step)
        except Exception as exc:  # a fault that failed must not end the nemesis
            log.error("nemesis %s failed: %s", step.kind, exc)
            with contextlib.suppress(Exception):
                broker.heal()
            ensure_broker(broker)
        run.events.append((at, step.kind))
        log.warning("nemesis at %.1fs: %s", at, step.kind)
        run.check_spools(f"after {step.kind} at {at}s")


def unleash(run: Run, broker: Any, duration: float) -> None:
    """Run the nemesis in its thread for ``duration`` seconds, then heal everything: the
    network back and every broker node running."""
    stop = threading.Event()
    thread = threading.Thread(target=nemesis, args=(run, broker, stop), daemon=True)
    thread.start()
    stop.wait(duration)
    stop.set()
    thread.join(30)
    with contextlib.suppress(Exception):
        broker.heal()
    ensure_broker(broker)


def ensure_broker(broker: Any, attempts: int = 5) -> None:
    """Make sure the broker (every node of a cluster) runs and answers: a restart can fail
    on a loaded machine, and a nemesis that stopped there would leave the rest of the run
    without a broker."""
    from logsdk.testing import ApacheKafka

    for attempt in range(1, attempts + 1):
        try:
            if isinstance(broker, ApacheKafka):
                for node in broker.node_ids:
                    if broker.is_paused(node):
                        broker.resume(node)
                    if not broker.is_running(node):
                        broker.start_node(node)
                return
            if broker.is_paused:
                broker.resume()
            if not broker.is_running():
                broker.restart()
            return
        except Exception as exc:  # BrokerStartError and the like: say so, try again
            log.error("broker restart failed (attempt %d/%d): %s", attempt, attempts, exc)
            if not isinstance(broker, ApacheKafka):
                with contextlib.suppress(Exception):
                    broker.kill()
            time.sleep(2.0)
    raise RuntimeError(f"the broker did not come back after {attempts} restarts")
