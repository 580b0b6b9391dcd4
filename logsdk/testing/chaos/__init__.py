"""A Jepsen-style chaos run: a workload, a nemesis and a checker.

``python -m logsdk.testing.chaos --duration 300 --seed N [--json]``

- Workload (`_workload`): several producer processes (LogProducer, memory and
  shared-memory buffers where available) send JSON log records to one topic; a consumer
  group of LogConsumer processes stores them exactly-once in one SQLite file
  (SQLiteSink with dedupe on the logsdk headers).
- Nemesis (`_nemesis`), on a schedule drawn from ``--seed``: SIGKILL + restart of
  the (durable) broker, SIGSTOP/SIGCONT of the broker, a network cut through the proxy,
  SIGKILL + restart of a producer (only ones whose buffer survives it: ``shm``) and of a
  consumer, and a long cut that fills one producer's small spool to its cap. With
  ``--broker apache`` the broker is Apache Kafka, three nodes (replication factor 3,
  ``min.insync.replicas=2``), and its faults are the leader of a partition SIGKILLed
  and restarted, and one node SIGSTOPped and resumed.
- Checker (`_checker`): every record a producer's ``send()`` accepted (reported by
  the producer as it goes, so a SIGKILL loses no bookkeeping) must be in the sink exactly
  once, except those its own counters say the overflow policy dropped. The producers'
  delivery reports (`_history`) explain what went missing or out of order.
  Ownership checks (`logsdk._owner`) are on in every process of the run, and
  producers reserve seqs in small blocks (``--seq-block``) so that a run crosses many
  reservations; a violation logged by any child fails the run. After each fault, and
  once the producers have closed, every producer's spool dir is checked read-only
  (``logsdk spool check``): a problem found there fails the run too.
- `chaos()` (`_run`) composes them; `main()` (`_main`) is the command.

The last line with ``--json`` is one JSON object: accepted, in_sink, missing,
duplicates, dropped, max_latency_s, degraded_s, events, verdict. Exit status 1 on
any loss or duplicate.

Tests that trace a producer's delivery reports import `trace_deliveries()` and
`unconfirmed_seqs()` from here.
"""

from logsdk.testing.chaos._history import trace_deliveries, unconfirmed_seqs
from logsdk.testing.chaos._main import main
from logsdk.testing.chaos._run import chaos
from logsdk.testing.chaos._workload import (
    FAST,
    PARTITIONS,
    RATE,
    SEQ_BLOCK,
    SMALL_SPOOL,
    TOPIC,
)

__all__ = [
    "FAST",
    "PARTITIONS",
    "RATE",
    "SEQ_BLOCK",
    "SMALL_SPOOL",
    "TOPIC",
    "chaos",
    "main",
    "trace_deliveries",
    "unconfirmed_seqs",
]
