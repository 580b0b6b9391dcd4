"""One chaos run, composed: a broker, the workload, the nemesis, then the checker.

The order is the run's invariant: the nemesis ends and every fault is healed before the
producers are told to close; the producers have ended (and anything they left in a
spool or shm ring is delivered) before the topic is read back; the topic is read back
before the consumers are stopped, so that they are given the time to store all of it;
the checker reads the sink once the consumers have stopped. However the run ends, its
children are SIGKILLed and its broker stopped. Runs on the caller's thread (the main
thread of ``python -m logsdk.testing.chaos``), beside the nemesis thread it starts.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logsdk.testing.chaos import _checker, _nemesis, _workload
from logsdk.testing.chaos._workload import PARTITIONS, SEQ_BLOCK, TOPIC, Run

if TYPE_CHECKING:
    from logsdk.testing import ApacheKafka, EmbeddedBroker


def chaos(
    seed: int,
    duration: float,
    producers: int = 3,
    consumers: int = 2,
    max_in_flight: int = 1,
    seq_block: int = SEQ_BLOCK,
    broker_kind: str = "embedded",
) -> dict[str, Any]:
    """Run the workload under the nemesis for ``duration`` seconds; return the verdict.

    ``broker_kind``: ``embedded`` (Tansu, durable, behind the proxy) or ``apache`` (Apache
    Kafka, three nodes behind proxies: replication factor 3, ``min.insync.replicas=2``).
    """
    from logsdk import _owner
    from logsdk.producer._identity import ENV_SEQ_BLOCK
    from logsdk.testing import create_topic

    _owner.enable()  # here and in every child (the environment is inherited)
    os.environ[ENV_SEQ_BLOCK] = str(seq_block)
    work = Path(tempfile.mkdtemp(prefix=f"logsdk-chaos-{seed}-"))
    run = Run(
        seed,
        duration,
        work,
        broker_kind=broker_kind,
        max_in_flight=max_in_flight,
        seq_block=seq_block,
        shm=_workload.shm_available(),
    )
    t_start = time.monotonic()
    broker = _broker(broker_kind, work)
    with broker, _workload.reaped(run):
        bootstrap = broker.bootstrap_servers
        rf = 3 if broker_kind == "apache" else 1
        create_topic(bootstrap, TOPIC, PARTITIONS, replication_factor=rf)
        _workload.start(run, bootstrap, producers, consumers)
        _nemesis.unleash(run, broker, duration)
        _workload.stop_producers(run)
        # Producers closed with Kafka up, so their spools are drained; any left (a close
        # that timed out) is delivered by a fresh producer on the same spool dir.
        _workload.drain_leftover_spools(run, bootstrap)
        run.check_spools("after the producers closed")
        expected = _checker.expected(run.reports)
        topic = _checker.read_back(bootstrap, expected)
        _checker.wait_for_sink(run.db, topic.count)
        _workload.stop_consumers(run)
    return _checker.verdict(run, expected, topic, t_start)


def _broker(kind: str, work: Path) -> EmbeddedBroker | ApacheKafka:
    """The run's broker, not started: ``embedded`` (Tansu, durable, behind the proxy) or
    ``apache`` (Apache Kafka, three nodes behind proxies)."""
    from logsdk.testing import ApacheKafka, EmbeddedBroker
    from logsdk.testing._apache import TEST_JVM_OPTIONS

    if kind == "apache":
        return ApacheKafka(
            nodes=3, proxy=True, workdir=work / "kafka", jvm_options=TEST_JVM_OPTIONS
        )
    return EmbeddedBroker(durable=True, proxy=True)
