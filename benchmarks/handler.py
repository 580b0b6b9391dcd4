"""What logging through logsdk costs the application, per ``logging`` call.

- handler.logging_us_per_call: µs of one ``log.info("request %d done in %s ms", i, 12.5,
  extra={"rid": i})`` with a KafkaHandler (owned producer, embedded broker up), counting
  until every record is in Kafka (the caller's own time alone is in params), against
  python-json-logger's JsonFormatter on a StreamHandler writing to /dev/null with the same
  fields (timestamp, level, logger, message, host, pid, thread, rid), in the same run.
  Lower is better: the ratio is KafkaHandler / JSON handler (goal <= 1.3).
- handler.null_us_per_call (information): the same call with a NullHandler.
- handler.structlog_us_per_call: ``log.info("request done", rid=i, ms=12.5)`` through
  structlog with ``add_log_level``, ``TimeStamper(fmt="iso", utc=True)`` and KafkaRenderer
  (``output=False``), until every record is in Kafka, against the same chain ending in
  structlog's own ``JSONRenderer`` printing to /dev/null (a processor adds ``host``, as
  KafkaRenderer does). Goal <= 1.3.
- handler.loguru_us_per_call: ``logger.bind(rid=i).info("request {} done in {} ms", i,
  12.5)`` into a KafkaSink, until every record is in Kafka, against loguru's own JSON
  output (``serialize=True``) to /dev/null. Goal <= 1.3.

The adapters write their JSON with orjson when it is installed (extra ``orjson``, in dev);
``--encoder json`` makes them use the standard library's json instead (``params.encoder``
says which ran).

Each round is ``--records`` calls; the KafkaHandler's clock runs until its producer's
flush() returned (every record acknowledged).
Median of ``--rounds`` alternating rounds. ``--json``: the last line is
``{"results": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import MutableMapping
from typing import Any

import structlog
from loguru import logger as loguru_logger
from pythonjsonlogger.json import JsonFormatter

from logsdk.integrations import _sender
from logsdk.integrations.logging import KafkaHandler
from logsdk.integrations.loguru import KafkaSink
from logsdk.integrations.structlog import KafkaRenderer
from logsdk.producer import LogProducer
from logsdk.testing import EmbeddedBroker, create_topic


def _calls(log: logging.Logger, n: int) -> float:
    """µs per call of n logging calls (the caller's wall clock)."""
    t0 = time.perf_counter()
    for i in range(n):
        log.info("request %d done in %s ms", i, 12.5, extra={"rid": i})
    return (time.perf_counter() - t0) / n * 1e6


def _structlog_calls(log: Any, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        log.info("request done", rid=i, ms=12.5)
    return (time.perf_counter() - t0) / n * 1e6


def _loguru_calls(n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        loguru_logger.bind(rid=i).info("request {} done in {} ms", i, 12.5)
    return (time.perf_counter() - t0) / n * 1e6


def _result(name: str, value: float, baseline: str, base: float, params: dict[str, Any]) -> Any:
    return {"name": name, "unit": "µs/call", "value": round(value, 2), "baseline": baseline,
            "baseline_value": round(base, 2), "ratio": round(value / base, 3), "goal": 1.3,
            "params": params}  # fmt: skip


def _libraries(bootstrap: str, spool: str, rounds: int, n: int, devnull: Any) -> list[Any]:
    """handler.structlog_us_per_call and handler.loguru_us_per_call (see the docstring)."""
    host = socket.gethostname()
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    level = structlog.processors.add_log_level

    def add_host(_: Any, __: str, ev: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        ev.setdefault("host", host)
        return ev

    s_json = structlog.wrap_logger(
        structlog.PrintLogger(devnull),
        processors=[level, stamp, add_host, structlog.processors.JSONRenderer()],
        cache_logger_on_first_use=True,
    )
    out: dict[str, list[float]] = {"sk": [], "sj": [], "lk": [], "lj": []}
    with LogProducer(bootstrap, "handler-bench", spool) as producer:
        renderer = KafkaRenderer(producer, output=False)
        s_kafka = structlog.wrap_logger(
            structlog.PrintLogger(devnull), processors=[level, stamp, renderer],
            cache_logger_on_first_use=True,
        )  # fmt: skip
        sink = KafkaSink(producer)
        loguru_logger.remove()
        s_kafka.info("warm-up")
        if producer.flush(60):
            raise RuntimeError("warm-up record not delivered")
        for _ in range(rounds):
            t0 = time.perf_counter()
            _structlog_calls(s_kafka, n)
            if producer.flush(120):
                raise RuntimeError("records not delivered")
            out["sk"].append((time.perf_counter() - t0) / n * 1e6)
            out["sj"].append(_structlog_calls(s_json, n))
            hid = loguru_logger.add(sink, level="INFO")
            t0 = time.perf_counter()
            _loguru_calls(n)
            if producer.flush(120):
                raise RuntimeError("records not delivered")
            out["lk"].append((time.perf_counter() - t0) / n * 1e6)
            loguru_logger.remove(hid)
            hid = loguru_logger.add(devnull, level="INFO", serialize=True)
            out["lj"].append(_loguru_calls(n))
            loguru_logger.remove(hid)
        dropped = renderer.dropped + sink.dropped
    med = {k: statistics.median(v) for k, v in out.items()}
    params = {"records": n, "rounds": rounds, "dropped": dropped, "encoder": _encoder(),
              **{f"{k}_rounds_us": [round(x, 2) for x in v] for k, v in out.items()}}  # fmt: skip
    return [
        _result("handler.structlog_us_per_call", med["sk"],
                "structlog JSONRenderer to /dev/null, same processors", med["sj"], params),
        _result("handler.loguru_us_per_call", med["lk"],
                "loguru serialize=True to /dev/null", med["lj"], params),
    ]  # fmt: skip


def _encoder() -> str:
    """Which JSON library the adapters write with in this run."""
    return "json" if _sender.dumps is _sender.dumps_json else "orjson"


def _logger(name: str, handler: logging.Handler) -> logging.Logger:
    log = logging.getLogger(name)
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20_000, help="logging calls a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--encoder", choices=("auto", "json"), default="auto",
                    help="json: the adapters use the standard library's json")  # fmt: skip
    args = ap.parse_args(argv)
    if args.encoder == "json":
        _sender.dumps = _sender.dumps_json
    encoder = _encoder()
    devnull = open(os.devnull, "w")  # noqa: SIM115  # closed at the end
    json_handler = logging.StreamHandler(devnull)
    host = socket.gethostname()
    json_handler.setFormatter(
        JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s %(process)d %(threadName)s",
            rename_fields={"asctime": "timestamp", "levelname": "level", "name": "logger",
                           "process": "pid", "threadName": "thread"},
            static_fields={"host": host},
        )
    )  # fmt: skip
    kafka_ms: list[float] = []
    caller_ms: list[float] = []
    json_ms: list[float] = []
    null_ms: list[float] = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as d:
        create_topic(broker.bootstrap_servers, "handler-bench", 4)
        kafka = KafkaHandler(
            bootstrap_servers=broker.bootstrap_servers, topic="handler-bench", spool_dir=d
        )
        k_log = _logger("bench.kafka", kafka)
        j_log = _logger("bench.json", json_handler)
        n_log = _logger("bench.null", logging.NullHandler())
        k_log.info("warm-up")  # the producer's client started before the clock
        if kafka.producer.flush(60):
            raise RuntimeError("warm-up record not delivered")
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            caller_ms.append(_calls(k_log, args.records))
            if kafka.producer.flush(120):
                raise RuntimeError("records not delivered")
            # The figure: until every record is in Kafka. The producer's threads work while
            # the caller logs and after: that time is the application's too.
            kafka_ms.append((time.perf_counter() - t0) / args.records * 1e6)
            json_ms.append(_calls(j_log, args.records))
            null_ms.append(_calls(n_log, args.records))
        dropped = kafka.dropped
        kafka.close()
        libs = _libraries(broker.bootstrap_servers, d + "/libs", args.rounds, args.records, devnull)
    devnull.close()
    k, j, n = (statistics.median(x) for x in (kafka_ms, json_ms, null_ms))
    params = {"records": args.records, "rounds": args.rounds, "dropped": dropped,
              "encoder": encoder, "kafka_rounds_us": [round(x, 2) for x in kafka_ms],
              "kafka_caller_only_us": round(statistics.median(caller_ms), 2),
              "json_rounds_us": [round(x, 2) for x in json_ms]}  # fmt: skip
    results: list[dict[str, Any]] = [
        {
            "name": "handler.logging_us_per_call",
            "unit": "µs/call",
            "value": round(k, 2),
            "baseline": "python-json-logger JsonFormatter on a StreamHandler to /dev/null, "
            "same fields",
            "baseline_value": round(j, 2),
            "ratio": round(k / j, 3),
            "goal": 1.3,
            "params": params,
        },
        {
            "name": "handler.null_us_per_call",
            "unit": "µs/call",
            "value": round(n, 2),
            "baseline": None,
            "baseline_value": None,
            "ratio": None,
            "goal": None,
            "params": {"records": args.records, "rounds": args.rounds},
        },
        *libs,
    ]
    for r in results:
        ratio = "" if r["ratio"] is None else f"  ratio {r['ratio']} (goal <= {r['goal']})"
        base = "" if r["baseline_value"] is None else f" vs {r['baseline_value']} µs"
        print(f"{r['name']}: {r['value']} µs{base}{ratio}", file=sys.stderr)
    if args.json:
        print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
