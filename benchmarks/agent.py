"""``delivery="agent"`` (issue 46): what the application's thread pays, and what the whole
pipeline (application + ``logsdk agent``) pays, against baselines measured in the same run.

- producer.agent: records/s of ``LogProducer(delivery="agent").send()`` (the application's
  thread only: the record copied into the ring), against raw confluent-kafka ``produce()``
  of the same records with the two headers every logsdk record carries, its reports served
  by a second thread (the sending loop never polls). Ratio = agent / raw (goal >= 1.0: the
  application does less than the raw client).
- agent.pipeline_cpu_us_per_record: CPU per record of the application process plus the
  agent process (``/proc/<pid>/stat``), from the first send until the application's
  flush() returns 0 (every record acknowledged by Kafka, the agent's spool unused),
  against a direct-mode ``LogProducer`` in one process doing the same (send, flush).
  Ratio = agent pipeline / direct (lower is better). params: seconds until flushed.
- agent.app_cpu_us_per_record (information): the application process alone in that run.
- agent.connections_8_workers: TCP connections open to the broker from a host running 8
  worker processes that each logged a record: with ``delivery="agent"`` (the workers and
  one agent), against the same 8 workers in direct mode (a librdkafka client each).
  Counted from /proc/net/tcp (established, to the broker's port). Lower is better.
- agent.handler_cpu_us_per_call: CPU of the calling thread (``time.thread_time``) per
  ``logging`` call through ``KafkaHandler(delivery="agent")``, against ``SysLogHandler``
  over UDP to a local socket with python-json-logger's ``JsonFormatter`` making the same
  JSON document (the rsyslog benchmark's ``syslog-json`` application side), no agent and
  no rsyslogd: the application's side only. Ratio = KafkaHandler / SysLogHandler (goal
  <= 1.0, the issue's).

Median of ``--rounds`` alternating rounds, 200-byte values with a key. Starts its own
embedded broker and, for the pipeline, one ``logsdk agent`` per round (a child process).
``--json``: the last line is ``{"results": [...]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from logsdk import LogProducer
from logsdk.shm._reader import RingReader, ring_names
from logsdk.testing import EmbeddedBroker, create_topic

VALUE = b"v" * 200
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """utime + stime of process ``pid``, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _cleanup(root: str) -> None:
    for name in ring_names(root):
        r = RingReader(name)
        r.close()
        r.unlink()


def handler_cpu(n: int) -> tuple[float, float]:
    """(KafkaHandler agent mode, SysLogHandler JSON) calling thread's CPU us per call."""
    from logging.handlers import SysLogHandler

    from pythonjsonlogger.json import JsonFormatter

    from logsdk.integrations.logging import KafkaHandler

    rec = logging.LogRecord(
        "app", logging.INFO, __file__, 1, "user %s logged in from %s", ("al", "10.0.0.1"), None
    )

    def per_call(h: logging.Handler) -> float:
        t0 = time.thread_time()
        for _ in range(n):
            h.handle(rec)
        return (time.thread_time() - t0) * 1e6 / n

    with tempfile.TemporaryDirectory() as d:
        kh = KafkaHandler(
            bootstrap_servers="127.0.0.1:1",
            topic="logs",
            spool_dir=d,
            delivery="agent",
            shm_bytes=512 << 20,
            close_timeout=0,
            flush_timeout=0,
        )
        try:
            kafka = per_call(kh)
        finally:
            kh.close()
            _cleanup(d)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        sh = SysLogHandler(address=sink.getsockname())
        sh.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s %(process)d %(threadName)s",
                rename_fields={"asctime": "timestamp", "levelname": "level", "name": "logger",
                               "process": "pid", "threadName": "thread"},
                static_fields={"host": socket.gethostname()},
            )
        )  # fmt: skip
        try:
            syslog = per_call(sh)
        finally:
            sh.close()
    return kafka, syslog


_WORKER = """
import sys, time
from logsdk import LogProducer
p = LogProducer(sys.argv[1], sys.argv[2], sys.argv[3], delivery=sys.argv[4])
p.send(b"hello")
p.flush(30)
print("ready", flush=True)
time.sleep(120)
"""


def _connections_to(port: int) -> int:
    """Established TCP connections to 127.0.0.1:``port`` (any local process)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                remote, state = fields[2], fields[3]
                if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                    n += 1
    return n


def connections(bootstrap: str, topic: str, delivery: str, workers: int = 8) -> int:
    """Connections to the broker with ``workers`` processes that logged (and an agent)."""
    port = int(bootstrap.rsplit(":", 1)[1])
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        if delivery == "agent":
            stack.enter_context(agent(d, bootstrap))
        procs = []
        for _ in range(workers):
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER, bootstrap, topic, d, delivery],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
        try:
            for proc in procs:
                assert proc.stdout is not None
                proc.stdout.readline()
            time.sleep(1.0)  # connections made after the first record settle
            return _connections_to(port)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
                if proc.stdout is not None:
                    proc.stdout.close()
            _cleanup(d)


def ring_rate(n: int) -> float:
    """send() into the ring, no agent: records/s of the calling thread."""
    with tempfile.TemporaryDirectory() as d:
        p = LogProducer("127.0.0.1:1", "logs", d, delivery="agent", shm_bytes=512 << 20)
        try:
            send = p.send
            t0 = time.perf_counter()
            for i in range(n):
                send(VALUE, key=b"%d" % (i % 16))
            return n / (time.perf_counter() - t0)
        finally:
            p.close(0)
            _cleanup(d)


def raw_rate(bootstrap: str, topic: str, n: int) -> float:
    """raw produce() with the two headers, reports served by a second thread."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "queue.buffering.max.messages": n + 1000,
        }
    )
    p.produce(topic, b"warm")
    p.flush(30)
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set():
            p.poll(0.05)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    pid = ("logsdk.producer", uuid.uuid4().hex.encode())
    acked = [0]

    def report(err: Any, msg: Any) -> None:
        if err is None:
            acked[0] += 1

    try:
        produce = p.produce
        t0 = time.perf_counter()
        for i in range(n):
            produce(
                topic,
                VALUE,
                b"%d" % (i % 16),
                headers=[pid, ("logsdk.seq", b"%d" % i)],
                on_delivery=report,
            )
        return n / (time.perf_counter() - t0)
    finally:
        p.flush(60)
        stop.set()
        t.join()


@contextlib.contextmanager
def agent(root: str, bootstrap: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "logsdk.cli", "agent", "--spool-root", root, "-b", bootstrap],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def pipeline(bootstrap: str, topic: str, n: int) -> tuple[float, float, float]:
    """(app + agent CPU s, app CPU s, seconds until flushed) for n records."""
    with tempfile.TemporaryDirectory() as d, agent(d, bootstrap) as proc:
        p = LogProducer(bootstrap, topic, d, delivery="agent", shm_bytes=512 << 20)
        try:
            a0, c0, t0 = _cpu_s(proc.pid), time.process_time(), time.perf_counter()
            for i in range(n):
                p.send(VALUE, key=b"%d" % (i % 16))
            left = p.flush(120)
            took = time.perf_counter() - t0
            app, ag = time.process_time() - c0, _cpu_s(proc.pid) - a0
        finally:
            p.close(5)
        if left:
            raise RuntimeError(f"{left} record(s) not taken by the agent")
    return app + ag, app, took


def direct(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    """(process CPU s, seconds until flushed) of a direct-mode LogProducer."""
    with tempfile.TemporaryDirectory() as d:
        p = LogProducer(bootstrap, topic, d)
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            for i in range(n):
                p.send(VALUE, key=b"%d" % (i % 16))
            left = p.flush(120)
            took = time.perf_counter() - t0
            cpu = time.process_time() - c0
        finally:
            p.close(5)
        if left:
            raise RuntimeError(f"{left} record(s) not acknowledged")
    return cpu, took


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    n, rounds = args.records, args.rounds
    ring, raw, pipe, app, direct_cpu, took_pipe, took_direct = [], [], [], [], [], [], []
    kh, sh = [], []
    conns: dict[str, int] = {}
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        for r in range(rounds):
            topic = create_topic(bootstrap, f"agent-bench-{r}", 4)
            k, s = handler_cpu(min(n, 50_000))
            kh.append(k)
            sh.append(s)
            ring.append(ring_rate(n))
            raw.append(raw_rate(bootstrap, topic, n))
            cpu, app_cpu, took = pipeline(bootstrap, topic, n)
            pipe.append(cpu * 1e6 / n)
            app.append(app_cpu * 1e6 / n)
            took_pipe.append(took)
            dcpu, dtook = direct(bootstrap, topic, n)
            direct_cpu.append(dcpu * 1e6 / n)
            took_direct.append(dtook)
        topic = create_topic(bootstrap, "agent-bench-conns", 4)
        conns = {mode: connections(bootstrap, topic, mode) for mode in ("direct", "agent")}
    med = statistics.median
    params = {"records": n, "value_bytes": len(VALUE), "rounds": rounds, "broker": "embedded"}
    results = [
        {
            "name": "producer.agent",
            "unit": "records/s",
            "value": round(med(ring)),
            "baseline": "raw confluent-kafka produce() with the two headers, reports polled "
            "by a second thread (sending loop only)",
            "baseline_value": round(med(raw)),
            "ratio": round(med(ring) / med(raw), 3),
            "goal": 1.0,
            "params": params,
        },
        {
            "name": "agent.pipeline_cpu_us_per_record",
            "unit": "us/record",
            "value": round(med(pipe), 2),
            "baseline": "direct-mode LogProducer, one process, send then flush",
            "baseline_value": round(med(direct_cpu), 2),
            "ratio": round(med(pipe) / med(direct_cpu), 3),
            "goal": None,
            "params": {
                **params,
                "flushed_s_agent": round(med(took_pipe), 2),
                "flushed_s_direct": round(med(took_direct), 2),
            },
        },
        {
            "name": "agent.connections_8_workers",
            "unit": "connections",
            "value": conns["agent"],
            "baseline": "the same 8 workers in direct mode (a librdkafka client each)",
            "baseline_value": conns["direct"],
            "ratio": round(conns["agent"] / max(1, conns["direct"]), 3),
            "goal": None,
            "params": {"workers": 8, "brokers": 1, "broker": "embedded"},
        },
        {
            "name": "agent.handler_cpu_us_per_call",
            "unit": "us/call",
            "value": round(med(kh), 2),
            "baseline": "SysLogHandler over UDP with python-json-logger's JsonFormatter",
            "baseline_value": round(med(sh), 2),
            "ratio": round(med(kh) / med(sh), 3),
            "goal": 1.0,
            "params": {**params, "records": min(n, 50_000)},
        },
        {
            "name": "agent.app_cpu_us_per_record",
            "unit": "us/record",
            "value": round(med(app), 2),
            "baseline": None,
            "baseline_value": None,
            "ratio": None,
            "goal": None,
            "params": params,
        },
    ]
    for r in results:
        print(
            f"{r['name']:36} {r['value']:>12} {r['unit']:10} baseline {r['baseline_value']} "
            f"ratio {r['ratio']}  {r['params']}"
        )
    if args.json:
        print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
