"""The OpenTelemetry Collector reads what KafkaLogExporter wrote: every field checked.

    python examples/otel_collector.py                      # Apache Kafka started here
    python examples/otel_collector.py --bootstrap HOST:PORT --encoding otlp_json
    python examples/otel_collector.py --build-only         # build (or find) the Collector

1. The Collector: built from its Go modules by the OpenTelemetry Collector Builder
   (``go.opentelemetry.io/collector/cmd/builder``) from ``examples/otelcol/builder-config.yaml``
   (the Kafka receiver, the file exporter, the debug exporter), once, into
   ``~/.cache/logsdk/otelcol/otelcol-logsdk-DIGEST`` (``$LOGSDK_OTELCOL_CACHE`` instead of
   ``~/.cache/logsdk/otelcol``), DIGEST naming the manifest's content (less comments) and
   the builder's version: a changed manifest gets a Collector of its own. Needs Go 1.26+
   (the modules' go.mod) and the Go module proxy the first time, and about 4 minutes of
   CPU (``GOFLAGS=-p=2`` unless GOFLAGS is set).
2. Apache Kafka (``logsdk.testing.ApacheKafka``, one node) unless ``--bootstrap`` names a
   cluster.
3. For each encoding (``otlp_proto``, ``otlp_json``): an app logs ``--records`` log records
   through ``KafkaLogExporter`` into a new topic, each with a body (text, or a map),
   severity number and text, an event name, attributes (int, the int64 limits, float, bool,
   bytes, list, map), timestamps (time and observed time), trace and span ids and flags
   (half of them inside a span), its resource and its scope (name, version, attributes).
4. The Collector reads the topic (``receivers: kafka`` with that ``encoding``) and its file
   exporter writes what it got as OTLP JSON lines; each field of each log record there is
   compared with what the app logged, and a verdict per field is printed. Exit status 1 if
   any field of any log record differs, or a log record is missing or twice.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import fcntl
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from logsdk.integrations.otel import ENCODINGS, KafkaLogExporter
from logsdk.testing import ApacheKafka, create_topic

#: The builder's release: the Collector release of the manifest's core modules.
BUILDER = "go.opentelemetry.io/collector/cmd/builder"
BUILDER_VERSION = "v0.165.0"
MANIFEST = Path(__file__).resolve().parent / "otelcol" / "builder-config.yaml"
#: The binary's name: ``dist.name`` in the manifest.
BINARY = "otelcol-logsdk"
ENV_CACHE = "LOGSDK_OTELCOL_CACHE"

SCOPE = ("app.orders", "1.2", {"scope.kind": "example"})
SEVERITIES = [
    SeverityNumber.TRACE,
    SeverityNumber.DEBUG,
    SeverityNumber.INFO,
    SeverityNumber.WARN,
    SeverityNumber.ERROR,
    SeverityNumber.FATAL,
]
#: The fields compared, in the order the verdict prints them.
FIELDS = [
    "body",
    "severity_number",
    "severity_text",
    "event_name",
    "attributes",
    "time_unix_nano",
    "observed_time_unix_nano",
    "trace_id",
    "span_id",
    "flags",
    "resource",
    "scope",
]


# -- the Collector ---------------------------------------------------------------------


def cache_root() -> Path:
    """``$LOGSDK_OTELCOL_CACHE``, else ``$XDG_CACHE_HOME/logsdk/otelcol``, else
    ``~/.cache/logsdk/otelcol``."""
    explicit = os.environ.get(ENV_CACHE, "").strip()
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "logsdk" / "otelcol"


def collector_dir(manifest: Path = MANIFEST) -> Path:
    """The cache directory of the Collector ``manifest`` builds (may not exist): named
    after the builder's version and the manifest's lines less its comments and blank lines
    (what the builder reads), so that a changed comment does not cost a build."""
    lines = [ln.rstrip() for ln in manifest.read_text().splitlines()]
    read = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    content = "\n".join([BUILDER_VERSION, *read]).encode()
    return cache_root() / f"{BINARY}-{hashlib.sha256(content).hexdigest()[:12]}"


def collector_binary(manifest: Path = MANIFEST) -> Path:
    """The Collector ``manifest`` describes: from the cache, else built there now.

    A cache directory is complete or absent (built in a temporary directory beside it,
    renamed into place once the binary runs); one build at a time (an ``flock``).
    """
    target = collector_dir(manifest)
    if (target / BINARY).is_file():
        return target / BINARY
    go = shutil.which("go")
    if go is None:
        sys.exit(
            "building the Collector needs Go 1.26+ (none on PATH): install it, or pass "
            "--collector PATH to a Collector with the kafka receiver and file exporter"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / BINARY).is_file():  # another process built it while we waited
            return target / BINARY
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            _build(go, manifest, tmp)
            (tmp / "dist").rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target / BINARY


def _build(go: str, manifest: Path, tmp: Path) -> None:
    env = {**os.environ, "GOBIN": str(tmp / "bin")}
    env.setdefault("GOFLAGS", "-p=2")  # a shared 2-core machine: two compilers at once
    started = time.monotonic()
    print(
        f"building the Collector ({manifest.name}, builder {BUILDER_VERSION}) in {tmp}", flush=True
    )
    steps = [
        ([go, "install", f"{BUILDER}@{BUILDER_VERSION}"], tmp),
        ([str(tmp / "bin" / "builder"), "--config", str(tmp / "builder-config.yaml")], tmp),
    ]
    shutil.copyfile(manifest, tmp / "builder-config.yaml")  # output_path ./dist: under tmp
    for cmd, cwd in steps:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
            sys.exit(f"building the Collector failed ({' '.join(cmd[:2])}):\n{tail}")
    version = subprocess.run(
        [str(tmp / "dist" / BINARY), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"built {version} in {time.monotonic() - started:.0f} s", flush=True)


def collector_config(bootstrap: str, topic: str, encoding: str, out: Path) -> dict[str, Any]:
    """The Collector's configuration: the topic's log records, read with ``encoding``, into
    ``out`` as OTLP JSON lines. Its own telemetry is off (no port of its own is opened)."""
    return {
        "receivers": {
            "kafka": {
                "brokers": bootstrap.split(","),
                "logs": {"topics": [topic], "encoding": encoding},
                "group_id": f"otelcol-{topic}",
                "initial_offset": "earliest",
            }
        },
        "exporters": {"file": {"path": str(out), "format": "json", "flush_interval": "100ms"}},
        "service": {
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
            "pipelines": {"logs": {"receivers": ["kafka"], "exporters": ["file"]}},
        },
    }


def _die_with_parent() -> None:
    """In the Collector's process before exec: the kernel SIGKILLs it if this script dies
    (Linux; started from the main thread, which lives as long as the script)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG


@contextlib.contextmanager
def running(
    binary: Path, config: dict[str, Any], workdir: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """The Collector running on ``config`` (YAML being a superset of JSON, written as JSON);
    its output in ``workdir/otelcol.log``; stopped (SIGTERM, then SIGKILL) on the way out,
    and killed by the kernel if this script is."""
    path = workdir / "otelcol.json"
    path.write_text(json.dumps(config, indent=2))
    with open(workdir / "otelcol.log", "wb") as log:  # a new log each time
        proc = subprocess.Popen(
            [str(binary), "--config", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- what the app logs -------------------------------------------------------------------


@dataclass
class Logged:
    """What the app logged in one log record, as OTLP carries it."""

    body: Any
    severity_number: int
    severity_text: str
    event_name: str
    attributes: dict[str, Any]
    time_unix_nano: int
    observed_time_unix_nano: int
    trace_id: str | None
    span_id: str | None
    flags: int
    resource: dict[str, Any] = field(default_factory=dict)
    scope: tuple[str, str, dict[str, Any]] = SCOPE


def log_records(exporter: KafkaLogExporter, count: int, service: str) -> dict[int, Logged]:
    """``count`` log records through ``exporter`` (a BatchLogRecordProcessor, as apps use),
    half inside a span; what each carried, by its ``i`` attribute."""
    provider = LoggerProvider(
        resource=Resource.create({"service.name": service, "deployment.environment": "example"}),
        shutdown_on_exit=False,
    )
    provider.add_log_record_processor(
        BatchLogRecordProcessor(exporter, schedule_delay_millis=50, max_export_batch_size=64)
    )
    logger = provider.get_logger(SCOPE[0], SCOPE[1], attributes=SCOPE[2])
    tracer = TracerProvider().get_tracer("app")
    resource = dict(provider.resource.attributes)
    logged: dict[int, Logged] = {}
    for i in range(count):
        severity = SEVERITIES[i % len(SEVERITIES)]
        body: Any = f"order {i} paid: café ✓ 注文"
        if i % 5 == 4:
            body = {"order": i, "lines": [{"sku": "A-1", "qty": 2}], "paid": True}
        attributes = {
            "i": i,
            "int64.max": 2**63 - 1,
            "int64.min": -(2**63),
            "order.total": i / 3 + 0.1,  # no short decimal: the float's round trip shows
            "paid": i % 2 == 0,
            "digest": hashlib.sha256(str(i).encode()).digest()[:8],
            "tags": ["a", f"t{i}", 3, 2.5, False],
            "customer": {"id": i, "tier": "gold", "scores": [1, 2], "vip": i % 3 == 0},
        }
        if i % 7 == 6:  # floats JSON has no number for, empty values, escapes, astral text
            attributes.update({"nan": math.nan, "inf": math.inf, "-inf": -math.inf})
            attributes.update({"empty.str": "", "empty.list": [], "empty.map": {}})
            attributes["text"] = 'tab\t nl\n nul\x00 quote" \u2028 🎉'
        if i % 11 == 10:
            body = "" if i % 2 else b"\x00\xffraw"
        stamp = time.time_ns()
        emit = {
            "body": body,
            "severity_number": severity,
            "severity_text": severity.name,
            "attributes": attributes,
            "event_name": "order.paid",
            "timestamp": stamp,
            "observed_timestamp": stamp + 1_000 + i,
        }
        trace_id = span_id = None
        flags = 0
        if i % 2 == 0:
            with tracer.start_as_current_span(f"pay {i}") as span:
                ctx = span.get_span_context()
                logger.emit(**emit)
            trace_id, span_id = format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
            flags = int(ctx.trace_flags)
        else:
            logger.emit(**emit)
        logged[i] = Logged(
            body,
            severity.value,
            severity.name,
            "order.paid",
            attributes,
            stamp,
            stamp + 1_000 + i,
            trace_id,
            span_id,
            flags,
            resource,
        )
    provider.shutdown()  # exports what the processor holds; the exporter closes its producer
    return logged


# -- what the Collector wrote ------------------------------------------------------------


def any_value(value: dict[str, Any]) -> Any:
    """An OTLP/JSON ``AnyValue`` as Python (int64 as a JSON string or number; bytes as
    base64; a list and a map as Python's). A value with no field set is None."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return value["boolValue"]
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return key_values(value["kvlistValue"].get("values", []))
    return None


def key_values(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    return {kv["key"]: any_value(kv.get("value", {})) for kv in pairs}


def as_logged(value: Any) -> Any:
    """A value as OTLP gives it back: tuples as lists."""
    if isinstance(value, (list, tuple)):
        return [as_logged(v) for v in value]
    if isinstance(value, dict):
        return {k: as_logged(v) for k, v in value.items()}
    return value


def same(got: Any, expected: Any) -> bool:
    """``got == expected``, NaN equal to NaN (and a float never equal to an int or bool)."""
    if isinstance(expected, float):
        return isinstance(got, float) and (
            got == expected or (math.isnan(got) and math.isnan(expected))
        )
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(same(g, e) for g, e in zip(got, expected, strict=True))
        )
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and got.keys() == expected.keys()
            and all(same(got[k], v) for k, v in expected.items())
        )
    return type(got) is type(expected) and got == expected


def collector_records(out: Path) -> list[dict[str, Any]]:
    """Each log record the Collector's file exporter wrote (OTLP JSON, one request a line),
    its fields as :class:`Logged` names them."""
    rows: list[dict[str, Any]] = []
    if not out.exists():
        return rows
    # Lines end at b"\n" only (str.splitlines also splits at U+2028, which JSON may carry
    # raw); a last line without one is still being written.
    for line in out.read_bytes().split(b"\n")[:-1]:
        if not line.strip():
            continue
        for rl in json.loads(line).get("resourceLogs", []):
            resource = key_values(rl.get("resource", {}).get("attributes", []))
            for sl in rl.get("scopeLogs", []):
                sc = sl.get("scope", {})
                scope = [
                    sc.get("name", ""),
                    sc.get("version", ""),
                    key_values(sc.get("attributes", [])),
                ]
                for lr in sl.get("logRecords", []):
                    rows.append(
                        {
                            "body": any_value(lr.get("body", {})),
                            "severity_number": lr.get("severityNumber", 0),
                            "severity_text": lr.get("severityText", ""),
                            "event_name": lr.get("eventName", ""),
                            "attributes": key_values(lr.get("attributes", [])),
                            "time_unix_nano": int(lr.get("timeUnixNano", 0)),
                            "observed_time_unix_nano": int(lr.get("observedTimeUnixNano", 0)),
                            "trace_id": lr.get("traceId") or None,
                            "span_id": lr.get("spanId") or None,
                            "flags": lr.get("flags", 0),
                            "resource": resource,
                            "scope": scope,
                        }
                    )
    return rows


@dataclass
class Verdict:
    """Per field: the log records whose field matched, and the first that did not."""

    total: int
    matched: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIELDS, 0))
    first_miss: dict[str, str] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    twice: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        every = all(n == self.total for n in self.matched.values())
        return every and not self.missing and not self.twice


def compare(logged: dict[int, Logged], rows: list[dict[str, Any]]) -> Verdict:
    """Each row the Collector wrote beside the log record the app logged (by ``i``)."""
    verdict = Verdict(total=len(logged))
    seen: set[int] = set()
    for row in rows:
        i = row["attributes"].get("i")
        if i not in logged or i in seen:
            verdict.twice.append(i)
            continue
        seen.add(i)
        want = logged[i]
        for name in FIELDS:
            expected = as_logged(getattr(want, name))
            if same(row[name], expected):
                verdict.matched[name] += 1
            else:
                verdict.first_miss.setdefault(
                    name, f"log record {i}: logged {expected!r}, Collector wrote {row[name]!r}"
                )
    verdict.missing = sorted(set(logged) - seen)
    return verdict


def report(encoding: str, verdict: Verdict) -> None:
    print(f"\n{encoding}: {verdict.total} log records logged")
    for name in FIELDS:
        n = verdict.matched[name]
        mark = "match" if n == verdict.total else "DIFFER"
        print(f"  {name:<24} {n:>5}/{verdict.total}  {mark}")
        if name in verdict.first_miss:
            print(f"      first: {verdict.first_miss[name]}")
    if verdict.missing:
        print(f"  missing: {len(verdict.missing)} (first {verdict.missing[:5]})")
    if verdict.twice:
        print(f"  unexpected or twice: {len(verdict.twice)} (first {verdict.twice[:5]})")
    print(f"  verdict: {'every field matches' if verdict.ok else 'FIELDS DIFFER'}")


# -- the run -------------------------------------------------------------------------------


def check(
    binary: Path, bootstrap: str, encoding: str, records: int, workdir: Path, timeout: float
) -> Verdict:
    """One encoding: log into a new topic, have the Collector read it, compare."""
    topic = f"otlp-logs-{encoding}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    exporter = KafkaLogExporter(
        bootstrap_servers=bootstrap,
        topic=topic,
        spool_dir=workdir / f"spool-{encoding}",
        encoding=encoding,
    )
    logged = log_records(exporter, records, service="checkout")
    print(
        f"{encoding}: {exporter.exported} log records in {exporter.records} Kafka records "
        f"on {topic}",
        flush=True,
    )
    out = workdir / f"{topic}.jsonl"
    config = collector_config(bootstrap, topic, encoding, out)
    started = time.monotonic()
    with running(binary, config, workdir) as proc:
        deadline = started + timeout
        rows = collector_records(out)
        while len(rows) < records and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)  # the file exporter flushes every 100 ms: a poll, not a handshake
            rows = collector_records(out)
        exited = proc.poll()
    log_path = workdir / "otelcol.log"
    if exited is not None or len(rows) < records:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        print(
            f"{encoding}: the Collector wrote {len(rows)} of {records} log records in "
            f"{time.monotonic() - started:.0f} s (exit status {exited}); its log:\n{tail}"
        )
    else:
        print(
            f"{encoding}: the Collector wrote {len(rows)} log records in "
            f"{time.monotonic() - started:.1f} s",
            flush=True,
        )
    log_path.rename(workdir / f"{topic}.log")
    return compare(logged, collector_records(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", help="a Kafka cluster (default: start Apache Kafka here)")
    parser.add_argument("--encoding", choices=[*ENCODINGS, "both"], default="both")
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--collector", type=Path, help="a Collector binary to use (not built)")
    parser.add_argument("--build-only", action="store_true", help="build it, print its path")
    parser.add_argument("--workdir", type=Path, help="keep configs, outputs and logs there")
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds the Collector has to write every log record",
    )
    args = parser.parse_args(argv)
    binary = args.collector or collector_binary()
    if args.build_only:
        print(binary)
        return 0
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    print(f"Collector: {binary} ({version.stdout.strip()})", flush=True)
    encodings = list(ENCODINGS) if args.encoding == "both" else [args.encoding]
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        workdir.mkdir(parents=True, exist_ok=True)
        bootstrap = args.bootstrap
        if bootstrap is None:
            kafka = stack.enter_context(ApacheKafka(nodes=1))
            bootstrap = kafka.bootstrap_servers
            print(f"Apache Kafka at {bootstrap}", flush=True)
        verdicts = {
            e: check(binary, bootstrap, e, args.records, workdir, args.timeout) for e in encodings
        }
    for encoding, verdict in verdicts.items():
        report(encoding, verdict)
    return 0 if all(v.ok for v in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
