"""The application's thread beside rsyslog: the same log lines through logsdk's KafkaHandler
and through the classic pipeline (``SysLogHandler`` -> rsyslogd -> omkafka -> Kafka).
logsdk's handler runs three ways: inline, ``background=True``, and ``delivery="agent"``
(the application writes into its shared-memory ring; ``logsdk agent``, started by this
script as rsyslogd is, ships to Kafka: the shipper's CPU and SIGKILL count as rsyslogd's).

    python benchmarks/peer_rsyslog.py [--records 200000] [--rate 10000] [--json]

Needs ``rsyslogd`` and its Kafka output (Debian: ``apt-get install rsyslog rsyslog-kafka``);
without them it says so and reports nothing. rsyslogd runs in the foreground with a
config, socket, pid file and work directory of its own (never the system's ``/dev/log``).
The broker is librdkafka's mock cluster (one broker, topics of 64 partitions), in a child
process. Both pipelines write the same JSON document per line (timestamp, level, logger,
message, host, pid, thread and a ``rid`` field): KafkaHandler as it always does,
SysLogHandler through python-json-logger's JsonFormatter with the same fields.

Three runs per pipeline, each application a child process of this script:

- **steady**: ``--records`` lines as fast as the application can log them. Per call: wall
  time, and the CPU time of the application's own thread (``time.thread_time``); the
  whole pipeline's CPU per record: the application process (every thread, the producer's
  and librdkafka's included) plus rsyslogd, from the first line until every line is in
  Kafka.
- **outage**: ``--records`` lines paced at ``--rate`` lines/s; the broker goes down 25% into
  the run for ``--outage`` seconds. Call latency (p50, p99, max) before the outage, during
  it and after the broker is back; seconds from the broker's return until every line logged
  before it was in Kafka (a consumer in this process notes when each line first arrives);
  missing lines and duplicates at the end (lines carry their number; logsdk's duplicates
  also carry the same (producer, seq) headers, so a consumer can drop them).
- **crash**: with the broker down, ``--crash-lines`` lines are logged; one second later the
  shipper is SIGKILLed (rsyslogd; for logsdk the application process itself, the producer
  being in it) and started again on the same work directory (spool), the broker comes
  back, and the lines that reach Kafka are counted.

``--json``: the last line is ``{"results": [...]}`` (peer.* figures).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 64
OMKAFKA = "/usr/lib/x86_64-linux-gnu/rsyslog/omkafka.so"
#: Bytes of padding in each line's message: the JSON document is about 200 bytes.
PAD = 40


def _quiet() -> logging.Logger:
    """The logger of this script's own clients: their connection errors in an outage are
    expected, and not shown."""
    quiet = logging.getLogger("peer.clients")
    if not quiet.handlers:
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
    return quiet


def _rsyslogd() -> str | None:
    """rsyslogd's path (on PATH, or where Debian puts it for root), or None."""
    return shutil.which("rsyslogd") or next(
        (p for p in ("/usr/sbin/rsyslogd", "/sbin/rsyslogd") if os.path.exists(p)), None
    )


def rsyslog_missing() -> str | None:
    """Why the peer cannot run here, or None."""
    if _rsyslogd() is None:
        return "rsyslogd is not installed (Debian: apt-get install rsyslog rsyslog-kafka)"
    libdirs = [Path(OMKAFKA).parent, Path("/usr/lib/rsyslog"), Path("/usr/lib64/rsyslog")]
    if not any((d / "omkafka.so").exists() for d in libdirs):
        return "rsyslog's Kafka output omkafka is not installed (Debian: rsyslog-kafka)"
    return None


# -- rsyslogd ------------------------------------------------------------------------------

RSYSLOG_CONF = """\
# The classic reliable pipeline: imuxsock -> main queue -> omkafka with a disk-assisted
# action queue kept across a restart, retried for ever, librdkafka's own queue and retries.
global(workDirectory="{work}" maxMessageSize="64k")
module(load="imuxsock" SysSock.Use="off")
module(load="omkafka")
template(name="msgonly" type="string" string="%msg%")
# For an application that sends plain lines: the JSON document is built here.
template(name="json" type="list" option.jsonf="on") {{
  property(outname="timestamp" name="timereported" dateFormat="rfc3339" format="jsonf")
  property(outname="level" name="syslogseverity-text" format="jsonf")
  property(outname="logger" name="programname" format="jsonf")
  property(outname="message" name="msg" format="jsonf")
  property(outname="host" name="hostname" format="jsonf")
  property(outname="pid" name="procid" format="jsonf")
}}
input(type="imuxsock" Socket="{sock}" CreatePath="on" RateLimit.Interval="0" Ruleset="kafka")
ruleset(name="kafka") {{
  action(type="omkafka" topic="{topic}" broker=["{broker}"] template="{template}"
         partitions.auto="on"
         resubmitOnFailure="on" keepFailedMessages="on" failedMsgFile="{work}/omkafka-failed.data"
         action.resumeRetryCount="-1"
         queue.type="LinkedList" queue.filename="omkafka-q" queue.spoolDirectory="{work}"
         queue.size="500000" queue.maxDiskSpace="1g" queue.saveOnShutdown="on"
         queue.dequeueBatchSize="1024")
}}
# rsyslogd's own messages: to a file, for a failed run's diagnosis.
*.* action(type="omfile" file="{work}/rsyslogd.log")
"""


class Shipper:
    """What ships the lines outside the application (rsyslogd, or logsdk's host agent): a
    process the script starts (``proc``); its CPU so far, SIGKILL, stop."""

    proc: subprocess.Popen[Any] | None = None

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of the process so far."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


class Rsyslogd(Shipper):
    """rsyslogd in the foreground with its own config, socket, pid file and work dir."""

    def __init__(self, root: Path, broker: str, topic: str, template: str = "json") -> None:
        self.root = root
        self.work = root / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.sock = str(root / "log.sock")
        self.conf = root / "rsyslog.conf"
        self.conf.write_text(
            RSYSLOG_CONF.format(
                work=self.work, sock=self.sock, topic=topic, broker=broker, template=template
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> Rsyslogd:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.sock)
        pidfile = self.root / "rsyslogd.pid"
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()
        self.proc = subprocess.Popen(
            [_rsyslogd() or "rsyslogd", "-n", "-f", str(self.conf), "-i", str(pidfile)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "stderr.log", "ab"),  # noqa: SIM115  # the child's
        )
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "stderr.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"rsyslogd did not start: {tail}")
            time.sleep(0.02)
        return self


class Agent(Shipper):
    """``logsdk agent`` on the pipeline's spool root, in the foreground, as a systemd unit
    runs it: the shipper of the ``kafka-agent`` pipeline."""

    def __init__(self, spool_root: Path, broker: str, replay_max_rate: float = 0.0) -> None:
        self.root = spool_root
        self.root.mkdir(parents=True, exist_ok=True)
        self.broker = broker
        self.replay_max_rate = replay_max_rate
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 30.0) -> Agent:
        argv = [sys.executable, "-m", "logsdk.cli", "agent", "--spool-root", str(self.root),
                "--bootstrap-servers", self.broker]  # fmt: skip
        if self.replay_max_rate:
            argv += ["--replay-max-rate", str(self.replay_max_rate)]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=open(self.root.parent / "agent-stderr.log", "a"),  # noqa: SIM115  # the child's
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "logsdk agent: draining ..." once it holds the root
        if "draining" not in line:
            self.proc.kill()
            tail = (self.root.parent / "agent-stderr.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"logsdk agent did not start: {line!r} {tail}")
        return self


# -- the application (a child process) -----------------------------------------------------


#: The applications: a plain line to rsyslogd (which makes the JSON document), the JSON
#: document made in the application and sent to rsyslogd, and logsdk's KafkaHandler
#: (inline, in background mode, and with ``delivery="agent"``: the record written into
#: the process's shared-memory ring, shipped by ``logsdk agent``, the host agent); then
#: the same through structlog (JSONRenderer -> logging -> SysLogHandler, against logsdk's
#: KafkaRenderer) and loguru (a plain line through SysLogHandler as its sink, against
#: logsdk's KafkaSink), in the steady run.
KINDS = ("syslog", "syslog-json", "kafka", "kafka-bg", "kafka-agent", "structlog-syslog",
         "structlog-kafka", "loguru-syslog", "loguru-kafka")  # fmt: skip
#: logsdk's KafkaHandler pipelines: inline (the default), ``background=True`` (the
#: document built and sent on the handler's own thread) and ``delivery="agent"`` (shipped
#: by the host agent, another process); the suffix of their figures.
_HANDLERS = (("kafka", ""), ("kafka-bg", ".background"), ("kafka-agent", ".agent"))
#: The pipelines that run in every run (the others in the steady run only: their shipper's
#: side is the same as one of these).
_ALL_RUNS = ("syslog", "kafka", "kafka-bg", "kafka-agent")
#: Pipelines that send to rsyslogd, and of those the ones whose line is already JSON.
_TO_RSYSLOG = ("syslog", "syslog-json", "structlog-syslog", "loguru-syslog")
_JSON_LINES = ("syslog-json", "structlog-syslog")
#: The application logs through this many loggers (``app.0`` ...), line i through
#: ``app.<i % LOGGERS>``: KafkaHandler keys a record by its logger's name, and with one
#: logger every line would go to one partition (the mock broker keeps 5 MiB of each).
LOGGERS = 64


def _app_logger(kind: str, conf: dict[str, Any]) -> tuple[logging.Logger, logging.Handler]:
    log = logging.getLogger("app")
    log.propagate = False
    log.setLevel(logging.INFO)
    handler: logging.Handler
    if kind.startswith("syslog"):
        from logging.handlers import SysLogHandler

        handler = SysLogHandler(address=conf["sock"], socktype=socket.SOCK_DGRAM)
        if kind == "syslog-json":  # the JSON document made in the application
            from pythonjsonlogger.json import JsonFormatter

            handler.ident = "app: "  # the syslog tag: %msg% is what follows it
            handler.setFormatter(
                JsonFormatter(
                    "%(asctime)s %(levelname)s %(name)s %(message)s %(process)d %(threadName)s",
                    rename_fields={"asctime": "timestamp", "levelname": "level",
                                   "name": "logger", "process": "pid",
                                   "threadName": "thread"},
                    static_fields={"host": socket.gethostname()},
                )
            )  # fmt: skip
        else:  # a plain line, the classic way; rsyslogd makes the JSON document
            handler.setFormatter(
                logging.Formatter("%(name)s[%(process)d]: %(message)s rid=%(rid)d")
            )
    else:
        from logsdk.integrations.logging import KafkaHandler

        extra: dict[str, Any] = {}
        if conf.get("replay_max_rate"):
            extra["replay_max_rate"] = float(conf["replay_max_rate"])
        handler = KafkaHandler(
            bootstrap_servers=conf["bootstrap"],
            topic=conf["topic"],
            spool_dir=conf["spool"],
            background=kind == "kafka-bg",
            delivery="agent" if kind == "kafka-agent" else "direct",
            **extra,
        )
    log.handlers[:] = [handler]
    return log, handler


#: ``emit(i)`` logs line ``i``; ``close()`` ends the pipeline as an exit would; the producer
#: (logsdk's pipelines) or None.
Emitters = tuple[list[Callable[[int], None]], Callable[[], None], Any]


def _syslog_handler(conf: dict[str, Any], fmt: str) -> logging.Handler:
    from logging.handlers import SysLogHandler

    handler = SysLogHandler(address=conf["sock"], socktype=socket.SOCK_DGRAM)
    handler.setFormatter(logging.Formatter(fmt))
    return handler


def _emitters(kind: str, conf: dict[str, Any]) -> Emitters:
    """One logging call per logger for ``kind`` (line i through logger ``i % LOGGERS``),
    each the way an application of that library writes it."""
    pad = "x" * PAD
    names = [f"app.{j}" for j in range(LOGGERS)]
    logsdk_args = {"bootstrap_servers": conf.get("bootstrap"), "topic": conf.get("topic"),
                   "spool_dir": conf.get("spool")}  # fmt: skip
    if conf.get("replay_max_rate"):
        logsdk_args["replay_max_rate"] = float(conf["replay_max_rate"])
    if kind.startswith("structlog"):
        import structlog

        chain: list[Any] = [
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ]
        if kind == "structlog-syslog":  # the usual production setup: JSON through logging
            root = logging.getLogger("app")
            root.propagate = False
            root.setLevel(logging.INFO)
            handler = _syslog_handler(conf, "%(message)s")
            handler.ident = "app: "  # type: ignore[attr-defined]  # the tag: %msg% follows
            root.handlers[:] = [handler]
            chain.append(structlog.processors.JSONRenderer())
            factory: Any = structlog.stdlib.LoggerFactory()
            close, producer = handler.close, None
        else:
            from logsdk.integrations.structlog import KafkaRenderer

            kafka = KafkaRenderer(output=False, **logsdk_args)
            chain.append(kafka)
            factory = structlog.PrintLoggerFactory()
            close, producer = kafka.close, kafka.producer
        structlog.configure(processors=chain, logger_factory=factory,
                            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
                            cache_logger_on_first_use=True)  # fmt: skip
        infos = [structlog.get_logger(n).bind(logger=n).info for n in names]
        return (
            [(lambda i, f=f: f("request done", rid=i, ms=12.5, pad=pad)) for f in infos],
            close,
            producer,
        )
    if kind.startswith("loguru"):
        from loguru import logger

        logger.remove()
        if kind == "loguru-syslog":  # a stdlib handler as loguru's sink
            handler = _syslog_handler(conf, "%(message)s")
            logger.add(handler, level="INFO",
                       format="{name}[{process}]: {message} rid={extra[rid]}")  # fmt: skip
            close, producer = logger.remove, None
        else:
            from logsdk.integrations.loguru import KafkaSink

            sink = KafkaSink(**logsdk_args)
            logger.add(sink, level="INFO", format="{message}")
            close, producer = logger.remove, sink.producer
        # A logger per name (loguru names a record by its module; an application's modules
        # log under their own names).
        infos = [logger.patch(lambda r, n=n: r.update(name=n)).info for n in names]  # type: ignore[typeddict-item]
        return (
            [(lambda i, f=f: f("request {} done in {} ms {}", i, 12.5, pad, rid=i)) for f in infos],
            close,
            producer,
        )
    _, handler = _app_logger(kind, conf)
    stdlib = [logging.getLogger(n).info for n in names]
    return (
        [
            (lambda i, f=f: f("request %d done in %s ms %s", i, 12.5, pad, extra={"rid": i}))
            for f in stdlib
        ],
        handler.close,
        getattr(handler, "producer", None),
    )


def _quantiles(lat_ns: list[int]) -> dict[str, float]:
    if not lat_ns:
        return {"calls": 0}
    s = sorted(lat_ns)
    n = len(s)
    return {
        "calls": n,
        "p50_us": round(s[n // 2] / 1e3, 1),
        "p99_us": round(s[min(n - 1, n * 99 // 100)] / 1e3, 1),
        "p999_us": round(s[min(n - 1, n * 999 // 1000)] / 1e3, 1),
        "max_us": round(s[-1] / 1e3, 1),
    }


def _trace_gc() -> list[tuple[int, int, int, str, int]]:
    """Time each collection of Python's collector: (start ns, end ns, generation, thread,
    objects collected)."""
    log: list[tuple[int, int, int, str, int]] = []
    began = [0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.monotonic_ns()
        else:
            log.append((began[0], time.monotonic_ns(), info["generation"],
                        threading.current_thread().name, info["collected"]))  # fmt: skip

    gc.callbacks.append(on_gc)
    return log


def app_main(kind: str, mode: str, conf: dict[str, Any]) -> int:
    """The application: log lines as told, report what its thread saw as JSON on stdout."""
    if conf.get("switch_interval"):
        sys.setswitchinterval(float(conf["switch_interval"]))
    gc_log = _trace_gc() if conf.get("gc_trace") else None
    emit, close, producer = _emitters(kind, conf)
    if conf.get("gc_freeze"):
        gc.freeze()  # what the start-up made is never walked again by the collector
    emit[0](-1)  # warm-up (a line with a negative rid is not counted)
    if producer is not None:
        deadline = time.monotonic() + 60
        while producer.stats()["sent"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # background mode: the handler's thread sends it
        if producer.flush(max(0.0, deadline - time.monotonic())):
            raise RuntimeError("warm-up line not delivered")
    print("ready", flush=True)
    go = json.loads(sys.stdin.readline())
    n, rate, first = int(conf["records"]), float(conf.get("rate") or 0), int(conf.get("first", 0))
    starts = [0] * n
    lats = [0] * n
    mono = time.monotonic_ns
    t0 = int(go["t0"] * 1e9)
    while mono() < t0:
        time.sleep(0.0005)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    th0, w0 = time.thread_time_ns(), mono()
    cpus = [0] * n if conf.get("call_cpu") else None
    tcpu = time.thread_time_ns
    if rate:
        step = 1e9 / rate
        for i in range(n):
            due = t0 + int(i * step)
            now = mono()
            if due > now + 1_000_000:  # more than 1 ms ahead: sleep (else log at once)
                time.sleep((due - now) / 1e9)
            if cpus is not None:
                c = tcpu()
                s = mono()
                emit[i % LOGGERS](first + i)
                e = mono()
                cpus[i] = tcpu() - c
            else:
                s = mono()
                emit[i % LOGGERS](first + i)
                e = mono()
            starts[i], lats[i] = s, e - s
    else:
        for i in range(n):
            s = mono()
            emit[i % LOGGERS](first + i)
            e = mono()
            starts[i], lats[i] = s, e - s
    th1, w1 = time.thread_time_ns(), mono()
    out: dict[str, Any] = {
        "wall_us_per_call": (w1 - w0) / n / 1e3,
        "thread_cpu_us_per_call": (th1 - th0) / n / 1e3,
        "calls_us_sum": sum(lats) / n / 1e3,
        "overall": _quantiles(lats),
    }
    windows = go.get("windows") or {}
    for name, (a, b) in windows.items():
        lo, hi = int(a * 1e9), int(b * 1e9)
        out[name] = _quantiles([lat for s, lat in zip(starts, lats, strict=True) if lo <= s < hi])
    out["last_call_end"] = (starts[-1] + lats[-1]) / 1e9
    # The slowest calls, with when they started (seconds from the first call).
    slow = sorted(range(n), key=lats.__getitem__)[-20:]
    out["slowest"] = [[round((starts[i] - t0) / 1e9, 3), round(lats[i] / 1e6, 2)] for i in slow]
    if cpus is not None:  # [start s, wall ms, the call's own thread CPU ms]
        out["slowest"] = [
            [*row, round(cpus[i] / 1e6, 2)] for row, i in zip(out["slowest"], slow, strict=True)
        ]
    if gc_log is not None:  # collections of 2 ms or more: [start s, ms, gen, thread, freed]
        out["gc"] = [[round((a - t0) / 1e9, 3), round((b - a) / 1e6, 2), g, th, c]
                     for a, b, g, th, c in gc_log if b - a >= 2_000_000]  # fmt: skip
        out["gc_tracked_objects"] = len(gc.get_objects())
    if mode == "crash":
        print(json.dumps(out), flush=True)
        time.sleep(3600)  # SIGKILLed by the parent
    close()  # logsdk's deliver (close_timeout), as at exit
    if producer is not None:
        out["stats"] = {k: v for k, v in producer.stats().items()
                        if isinstance(v, (int, float, str))}  # fmt: skip
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    out["process_cpu_s"] = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    out["done"] = time.monotonic()
    print(json.dumps(out), flush=True)
    return 0


# -- the parent: broker, shipper, consumer -------------------------------------------------


#: The headers that name a logsdk record: (producer, seq).
_ID_HEADERS = ("logsdk.producer", "logsdk.seq")


class Seen:
    """A consumer of the whole topic on a thread: when each line (its ``rid``) first
    arrived, how many times, and for logsdk's lines their (producer, seq) identities."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.first: dict[int, float] = {}
        self.count: dict[int, int] = {}
        self.ids: dict[int, set[tuple[Any, ...]]] = {}
        self.messages = 0
        self._stop = threading.Event()
        quiet = _quiet()
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"peer-{topic}",
                            "enable.auto.commit": False, "fetch.wait.max.ms": 20,
                            "logger": quiet})  # fmt: skip
        self._c.assign([TopicPartition(topic, p, -2) for p in range(PARTITIONS)])
        self._t = threading.Thread(target=self._run, name="seen", daemon=True)
        self._t.start()

    def _run(self) -> None:
        # Light on purpose (it runs beside the pipelines on 2 cores): the line's number
        # is cut out of its JSON, not parsed; headers only kept for logsdk's lines.
        first, count, ids = self.first, self.count, self.ids
        while not self._stop.is_set():
            msgs = self._c.consume(5000, 0.05)
            now = time.monotonic()
            for m in msgs:
                value = m.value()
                if m.error() or not value:
                    continue
                at = value.find(b'"rid":')
                if at >= 0:
                    at += 6
                else:  # a plain line made JSON by rsyslogd: "... rid=5"
                    at = value.rfind(b"rid=")
                    if at < 0:
                        continue
                    at += 4
                while value[at : at + 1] == b" ":  # python-json-logger writes '"rid": 5'
                    at += 1
                end = at
                while end < len(value) and value[end] in b"-0123456789":
                    end += 1
                rid = int(value[at:end])
                if rid < 0:
                    continue
                self.messages += 1
                if rid in first:
                    count[rid] += 1
                else:
                    first[rid] = now
                    count[rid] = 1
                hdrs = m.headers()
                if hdrs:
                    ident = tuple(h[1] for h in hdrs if h[0] in _ID_HEADERS)
                    ids.setdefault(rid, set()).add(ident)

    def wait_for(self, rids: range, timeout: float, quiet_s: float = 0.0) -> bool:
        """Until every rid arrived (then ``quiet_s`` more, for late duplicates)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(r in self.first for r in rids):
                time.sleep(quiet_s)
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self._stop.set()
        self._t.join(10)
        self._c.close()

    def report(self, rids: range) -> dict[str, Any]:
        missing = sum(1 for r in rids if r not in self.first)
        dups = sum(c - 1 for r, c in self.count.items() if r in rids and c > 1)
        # A duplicate a consumer can drop: the copies carry one (producer, seq) identity.
        same_id = sum(1 for r, c in self.count.items() if r in rids and c > 1
                      and len(self.ids.get(r, ())) == 1)  # fmt: skip
        return {"missing": missing, "duplicates": dups, "duplicated_lines_identified": same_id}


class App:
    """An application child process (this script with ``--app``)."""

    def __init__(self, kind: str, mode: str, conf: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--app", kind, "--mode", mode, "--conf", json.dumps(conf)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the {kind} application did not start: {line!r}")

    def go(self, t0: float, windows: dict[str, tuple[float, float]] | None = None) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"t0": t0, "windows": windows or {}}) + "\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 600.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout)
            raise RuntimeError(f"the application failed (exit {self.proc.returncode})")
        return json.loads(line)  # type: ignore[no-any-return]

    def wait(self, timeout: float = 120.0) -> None:
        self.proc.wait(timeout)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


class Bench:
    def __init__(self, args: argparse.Namespace, cluster: Any, root: Path) -> None:
        self.args = args
        self.cluster = cluster
        self.root = root
        self.bootstrap = cluster.bootstrap_servers
        self._n = 0

    def topic(self, name: str) -> str:
        self._n += 1
        return self.cluster.create_topic(f"peer-{name}-{self._n}", PARTITIONS)  # type: ignore[no-any-return]

    def down(self) -> None:
        for b in self.cluster.broker_ids:
            self.cluster.broker_down(b)

    def up(self) -> None:
        for b in self.cluster.broker_ids:
            self.cluster.broker_up(b)

    def shipper(self, kind: str, topic: str, name: str) -> tuple[dict[str, Any], Shipper | None]:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        conf: dict[str, Any] = {
            "topic": topic,
            "bootstrap": self.bootstrap,
            "spool": str(d / "spool"),
        }
        if kind in _TO_RSYSLOG:
            template = "msgonly" if kind in _JSON_LINES else "json"
            rs = Rsyslogd(d / "rsyslog", self.bootstrap, topic, template).start()
            conf["sock"] = rs.sock
            return conf, rs
        if kind == "kafka-agent":
            return conf, Agent(d / "spool", self.bootstrap, self.args.replay_max_rate).start()
        return conf, None

    # -- the runs --

    @contextlib.contextmanager
    def pipeline(
        self, kind: str, run: str
    ) -> Iterator[tuple[dict[str, Any], Shipper | None, Seen]]:
        """A fresh topic, the shipper (rsyslogd, logsdk's host agent, or none: logsdk's
        producer is in the application), and a consumer of the topic; all stopped on the
        way out."""
        topic = self.topic(f"{kind}-{run}")
        conf, rs = self.shipper(kind, topic, f"{kind}-{run}")
        seen = Seen(self.bootstrap, topic)
        try:
            yield conf, rs, seen
        finally:
            seen.close()
            if rs:
                rs.stop()

    def steady(self, kind: str) -> dict[str, Any]:
        n = self.args.records
        with self.pipeline(kind, "steady") as (conf, rs, seen):
            conf["records"] = n
            app = App(kind, "steady", conf)
            cpu0 = rs.cpu_s() if rs else 0.0
            t0 = time.monotonic() + 0.3
            app.go(t0)
            res = app.result()
            app.wait()
            if not seen.wait_for(range(n), timeout=300):
                raise RuntimeError(f"{kind}: lines missing after 300 s: {seen.report(range(n))}")
            shipper_cpu = (rs.cpu_s() - cpu0) if rs else 0.0
            res["shipper_cpu_s"] = shipper_cpu
            res["pipeline_cpu_us_per_record"] = (res["process_cpu_s"] + shipper_cpu) / n * 1e6
            res["all_in_kafka_s"] = max(seen.first[r] for r in range(n)) - t0
            seen.wait_for(range(n), timeout=1, quiet_s=2.0)  # late duplicates
            res.update(seen.report(range(n)))
            return res

    def outage(self, kind: str) -> dict[str, Any]:
        a = self.args
        n, rate = a.records, a.rate
        run_s = n / rate
        down_at, up_at = run_s * 0.25, run_s * 0.25 + a.outage
        with self.pipeline(kind, "outage") as (conf, _, seen):
            conf.update(records=n, rate=rate, switch_interval=a.switch_interval,
                        replay_max_rate=a.replay_max_rate, gc_trace=a.gc_trace,
                        call_cpu=a.call_cpu,
                        gc_freeze=a.gc_freeze)  # fmt: skip
            app = App(kind, "outage", conf)
            t0 = time.monotonic() + 0.3
            windows = {"before": (t0, t0 + down_at), "during": (t0 + down_at, t0 + up_at),
                       "after": (t0 + up_at, t0 + run_s + 3600)}  # fmt: skip
            app.go(t0, windows)
            time.sleep(max(0.0, t0 + down_at - time.monotonic()))
            self.down()
            time.sleep(max(0.0, t0 + up_at - time.monotonic()))
            self.up()
            healed = time.monotonic()
            res = app.result()
            app.wait()
            ok = seen.wait_for(range(n), timeout=180, quiet_s=2.0)
            # Every line logged before the heal (line i is due at t0 + i / rate) in Kafka.
            before_heal = range(min(n, int((healed - t0) * rate)))
            res["caught_up_s"] = (
                round(max(seen.first[r] for r in before_heal) - healed, 2) if ok else None
            )
            res["down_at_s"], res["up_at_s"] = down_at, up_at
            res.update(seen.report(range(n)))
            return res

    def crash(self, kind: str) -> dict[str, Any]:
        n = self.args.crash_lines
        with self.pipeline(kind, "crash") as (conf, rs, seen):
            conf.update(records=n)
            try:
                app = App(kind, "crash", conf)  # warmed up: connected to the broker
                self.down()
                app.go(time.monotonic())
                app.result()
                time.sleep(1.0)
                if rs:  # the shipper
                    rs.kill()
                    app.kill()
                    rs.start()
                else:  # the producer is in the application
                    app.kill()
                    conf.update(records=1, first=n)  # a new process on the same spool
                self.up()
                if not rs:
                    again = App(kind, "steady", conf)
                    again.go(time.monotonic())
                    again.result()
                    again.wait()
                seen.wait_for(range(n), timeout=60, quiet_s=2.0)
                return {"lines": n, **seen.report(range(n))}
            finally:
                self.up()


def _r(name: str, unit: str, value: float, baseline: str, base: float | None,
       goal: float | None, params: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    ratio = None if not base else round(value / base, 3)
    return {"name": name, "unit": unit, "value": round(value, 2), "baseline": baseline,
            "baseline_value": None if base is None else round(base, 2), "ratio": ratio,
            "goal": goal, "params": params}  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rate", type=float, default=10_000.0, help="lines/s in the outage run")
    ap.add_argument("--outage", type=float, default=10.0, help="seconds the broker is down")
    ap.add_argument("--crash-lines", type=int, default=2_000)
    ap.add_argument("--runs", default="steady,outage,crash")
    ap.add_argument("--pipelines", default=",".join(KINDS),
                    help="all but syslog and kafka run in the steady run only")  # fmt: skip
    ap.add_argument(
        "--replay-max-rate",
        type=float,
        default=0.0,
        help="KafkaHandler's replay_max_rate in the outage run (default: its own)",
    )
    ap.add_argument(
        "--switch-interval",
        type=float,
        default=0.0,
        help="sys.setswitchinterval() in the applications (default: Python's)",
    )
    ap.add_argument("--gc-trace", action="store_true",
                    help="outage run: report the collector's pauses of 2 ms or more")  # fmt: skip
    ap.add_argument("--gc-freeze", action="store_true",
                    help="outage run: gc.freeze() in the applications once set up")  # fmt: skip
    ap.add_argument("--call-cpu", action="store_true",
                    help="outage run: each call's own thread CPU too, given with the slowest "
                         "calls (costs a clock read a call)")  # fmt: skip
    ap.add_argument("--results", type=Path, help="merge the peer.* figures into this file")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--app", choices=KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--conf", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)  # fmt: skip
    if args.app:
        return app_main(args.app, args.mode, json.loads(args.conf))
    why = rsyslog_missing()
    if why:
        print(f"peer_rsyslog: skipped: {why}", file=sys.stderr)
        if args.json:
            print(json.dumps({"results": []}))
        return 0
    from logsdk.testing import MockCluster

    out: dict[str, dict[str, Any]] = {}
    kinds = args.pipelines.split(",")
    with MockCluster(brokers=1).start() as cluster, tempfile.TemporaryDirectory() as d:
        bench = Bench(args, cluster, Path(d))
        for run in args.runs.split(","):
            for kind in kinds:
                if kind not in _ALL_RUNS and run != "steady":
                    continue  # the shipper's side is the same as syslog's
                print(f"peer_rsyslog: {kind} {run} ...", file=sys.stderr, flush=True)
                out[f"{kind}.{run}"] = getattr(bench, run)(kind)
                print(json.dumps(out[f"{kind}.{run}"]), file=sys.stderr, flush=True)
    results = summarise(out, args)
    for r in results:
        base = "" if r["baseline_value"] is None else f" vs {r['baseline_value']}"
        goal = "" if r["goal"] is None else f"  ratio {r['ratio']} (goal <= {r['goal']})"
        print(f"{r['name']}: {r['value']} {r['unit']}{base}{goal}", file=sys.stderr)
    if args.results:
        merge_results(args.results, results)
    if args.json:
        print(json.dumps({"results": results}))
    return 0


def merge_results(path: Path, results: list[dict[str, Any]]) -> None:
    """Put the peer.* figures into a results.json, replacing earlier ones (others kept)."""
    data: dict[str, Any] = {"results": []}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
    names = {r["name"] for r in results}
    data["results"] = [r for r in data.get("results", []) if r["name"] not in names] + results
    path.write_text(json.dumps(data, indent=2) + "\n")


def _commit() -> str | None:
    """The checkout's commit (``+`` when it has changes), or None outside a git checkout."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("+" if dirty else "")


def summarise(out: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The peer.* figures: logsdk (value) against rsyslog (baseline), where both ran."""
    params: dict[str, Any] = {"records": args.records, "partitions": PARTITIONS,
                              "loggers": LOGGERS, "python": sys.version.split()[0],
                              "date": time.strftime("%Y-%m-%d", time.gmtime()),
                              "commit": _commit()}  # fmt: skip
    res: list[dict[str, Any]] = []
    for (kkind, ksuffix), (base_kind, bsuffix, what) in itertools.product(_HANDLERS, (
        ("syslog", "", "SysLogHandler, plain line (rsyslogd makes the JSON)"),
        ("syslog-json", ".json_in_app", "SysLogHandler, python-json-logger (same fields)"),
    )):  # fmt: skip
        suffix = ksuffix + bsuffix
        s, k = out.get(f"{base_kind}.steady"), out.get(f"{kkind}.steady")
        if not (s and k):
            continue
        p = {**params, "rsyslogd_cpu_s": round(s["shipper_cpu_s"], 2),
             "kafka_process_cpu_s": round(k["process_cpu_s"], 2),
             "kafka_shipper_cpu_s": round(k["shipper_cpu_s"], 2),
             "syslog_process_cpu_s": round(s["process_cpu_s"], 2),
             "p99_us": [k["overall"]["p99_us"], s["overall"]["p99_us"]],
             "max_us": [k["overall"]["max_us"], s["overall"]["max_us"]]}  # fmt: skip
        res += _steady_figures("peer.", suffix, k, s, what, p)
    for lib, what in (
        ("structlog", "structlog JSONRenderer -> logging -> SysLogHandler"),
        ("loguru", "loguru with SysLogHandler as its sink, plain line (rsyslogd makes the JSON)"),
    ):
        s, k = out.get(f"{lib}-syslog.steady"), out.get(f"{lib}-kafka.steady")
        if not (s and k):
            continue
        p = {**params, "rsyslogd_cpu_s": round(s["shipper_cpu_s"], 2),
             "p99_us": [k["overall"]["p99_us"], s["overall"]["p99_us"]],
             "max_us": [k["overall"]["max_us"], s["overall"]["max_us"]]}  # fmt: skip
        res += _steady_figures(f"peer.{lib}.", "", k, s, what, p)
    for kkind, suffix in _HANDLERS:
        res += _outage_figures(out, params, args, kkind, suffix)
    s, k = out.get("syslog.crash"), out.get("kafka.crash")
    if s and k:
        res.append(_r("peer.shipper_sigkill_lost", "lines", k["missing"], "rsyslogd SIGKILLed",
                      s["missing"], None, {"lines": args.crash_lines}))  # fmt: skip
    s, k = out.get("syslog.crash"), out.get("kafka-bg.crash")
    if s and k:
        res.append(_r("peer.shipper_sigkill_lost.background", "lines", k["missing"],
                      "rsyslogd SIGKILLed", s["missing"], None,
                      {"lines": args.crash_lines}))  # fmt: skip
    s, k = out.get("syslog.crash"), out.get("kafka-agent.crash")
    if s and k:  # the agent and the application SIGKILLed, as rsyslogd and its application
        res.append(_r("peer.shipper_sigkill_lost.agent", "lines", k["missing"],
                      "rsyslogd SIGKILLed", s["missing"], None,
                      {"lines": args.crash_lines}))  # fmt: skip
    return res


def _steady_figures(
    prefix: str,
    suffix: str,
    k: dict[str, Any],
    s: dict[str, Any],
    what: str,
    p: dict[str, Any],
) -> list[dict[str, Any]]:
    """The steady run's figures of logsdk's pipeline ``k`` against the syslog one ``s``."""
    return [
        _r(f"{prefix}app_thread_cpu_us_per_call{suffix}", "µs/call",
           k["thread_cpu_us_per_call"], what, s["thread_cpu_us_per_call"], 1.0, p),
        _r(f"{prefix}app_wall_us_per_call{suffix}", "µs/call", k["wall_us_per_call"], what,
           s["wall_us_per_call"], None, p),
        _r(f"{prefix}pipeline_cpu_us_per_record{suffix}", "µs/record",
           k["pipeline_cpu_us_per_record"], f"{what}, app + rsyslogd",
           s["pipeline_cpu_us_per_record"], 1.0, p),
    ]  # fmt: skip


def _outage_figures(
    out: dict[str, dict[str, Any]],
    params: dict[str, Any],
    args: argparse.Namespace,
    kkind: str,
    suffix: str,
) -> list[dict[str, Any]]:
    """The outage run's figures for one of logsdk's handler pipelines."""
    res: list[dict[str, Any]] = []
    s, k = out.get("syslog.outage"), out.get(f"{kkind}.outage")
    if s and k:
        p = {**params, "rate": args.rate, "outage_s": args.outage,
             "replay_max_rate": args.replay_max_rate or "default",
             "kafka": {w: k[w] for w in ("before", "during", "after")},
             "syslog": {w: s[w] for w in ("before", "during", "after")},
             "missing": [k["missing"], s["missing"]],
             "duplicates": [k["duplicates"], s["duplicates"]],
             "duplicates_identified": [k["duplicated_lines_identified"],
                                       s["duplicated_lines_identified"]]}  # fmt: skip
        kd = max(k["during"]["max_us"], k["after"]["max_us"]) / 1e3
        sd = max(s["during"]["max_us"], s["after"]["max_us"]) / 1e3
        res += [
            _r(f"peer.outage_max_call_ms{suffix}", "ms", kd, "SysLogHandler to rsyslogd", sd,
               None, {**p, "goal_ms": 2.0}),
            _r(f"peer.outage_p99_us{suffix}", "µs",
               max(k["during"]["p99_us"], k["after"]["p99_us"]),
               "the same pipeline before the outage", k["before"]["p99_us"], 1.0, p),
        ]  # fmt: skip
        if k["caught_up_s"] is not None and s["caught_up_s"] is not None:
            res.append(_r(f"peer.outage_caught_up_s{suffix}", "s", k["caught_up_s"],
                          "rsyslog omkafka", s["caught_up_s"], None, p))  # fmt: skip
    return res


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
