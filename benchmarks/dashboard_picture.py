"""The Grafana dashboard's panels, drawn from its own queries over a real scrape.

    python benchmarks/dashboard_picture.py [--rate 2000] [--before 20] [--outage 20]
        [--after 30] [--png docs/img/grafana-dashboard.png]

Grafana itself cannot be installed on this machine (no package for it among the registries
it reaches), so this draws the panels of ``dashboards/logsdk-grafana.json`` with
matplotlib, at the dashboard's layout (``gridPos``), from the answers a real Prometheus
server (``prometheus`` on PATH: Debian's package, ``apt-get install prometheus``) gives to
each panel's own queries. What it runs: the embedded broker behind its TCP proxy; a
``LogProducer`` sending ``--rate`` records/s from one thread; a ``LogConsumer`` reading the
topic; a ``PrometheusExporter`` serving both, scraped by Prometheus every second; the network
cut for ``--outage`` s after ``--before`` s, then healed, ``--after`` s more. Then every
panel's query is asked of Prometheus over the run (``query_range``, 1 s steps;
``$__rate_interval`` is 4 s, four scrapes, and ``$__range`` the run's length) and drawn.

Writes the PNG and, beside it, ``<png>.json``: the dashboard file's SHA-256 and the panels
drawn (tests/unit/test_docs_diagrams.py fails when the dashboard changed after the picture).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from logsdk import LogConsumer, LogProducer
from logsdk.metrics import PrometheusExporter
from logsdk.testing import EmbeddedBroker, create_topic, free_port

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "dashboards" / "logsdk-grafana.json"
SCRAPE_S = 1
RATE_INTERVAL = f"{4 * SCRAPE_S}s"

STATE_COLOURS = {
    "ONLINE": "#56a64b",
    "DEGRADED": "#f2cc0c",
    "RECOVERING": "#3274d9",
    "CLOSED": "#8e8e8e",
}


def prometheus(target: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus scraping ``target`` (host:port) every second; its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("needs Prometheus on PATH: apt-get install prometheus (Debian), or a release")
    config = workdir / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: {SCRAPE_S}s, evaluation_interval: {SCRAPE_S}s}}\n"
        "scrape_configs:\n"
        "  - job_name: app\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "prometheus.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    sys.exit(f"Prometheus did not get ready: {(workdir / 'prometheus.log').read_text()[-2000:]}")


def query_range(url: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": SCRAPE_S})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body["status"] != "success":
        raise RuntimeError(f"{expr}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The workload under Prometheus; the panels' answers and the run's marks."""
    marks: dict[str, float] = {}
    with EmbeddedBroker(proxy=True) as broker:
        topic = create_topic(broker.bootstrap_servers, "dashboard", 4)
        producer = LogProducer(broker.bootstrap_servers, topic, workdir / "spool")
        consumer = LogConsumer(
            broker.bootstrap_servers, "dashboard", [topic], lambda r: None,
            kafka_config={"auto.offset.reset": "earliest"},
        )  # fmt: skip
        exporter = PrometheusExporter(producer, consumer, labels={"service": "checkout"})
        with exporter, consumer:
            deadline = time.monotonic() + 120  # the group joined before the run starts
            while not consumer.stats()["assigned"] and time.monotonic() < deadline:
                time.sleep(0.2)
            prom, url = prometheus(f"127.0.0.1:{exporter.port}", workdir)
            try:
                time.sleep(2 * SCRAPE_S)  # the first scrapes before the first record
                start = time.time()
                t0 = time.monotonic()
                total = args.before + args.outage + args.after
                n = 0
                pad = b"x" * 190
                while (now := time.monotonic() - t0) < total:
                    if "cut" not in marks and now >= args.before:
                        broker.cut()
                        marks["cut"] = time.time()
                    if "heal" not in marks and now >= args.before + args.outage:
                        broker.heal()
                        marks["heal"] = time.time()
                    while n < int(now * args.rate):
                        producer.send(b"%09d" % n + pad, key=b"%d" % (n % 16))
                        n += 1
                    time.sleep(0.005)
                left = producer.flush(60)
                time.sleep(3 * SCRAPE_S)  # the last scrapes after the flush
                end = time.time()
                rng = f"{int(end - start)}s"
                panels = []
                for panel in json.loads(DASHBOARD.read_text())["panels"]:
                    series = []
                    for target in panel["targets"]:
                        expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL)
                        expr = expr.replace("$__range", rng)
                        for s in query_range(url, expr, start, end):
                            series.append({"target": target, "metric": s["metric"],
                                           "values": s["values"]})  # fmt: skip
                    panels.append({"panel": panel, "series": series})
            finally:
                prom.terminate()
                prom.wait(10)
        producer.close(30)
    return {"start": start, "end": end, "marks": marks, "sent": n, "left": left, "panels": panels}


def short(metric: dict[str, str]) -> dict[str, str]:
    """A producer id (32 hex digits) cut to its first 8, as a reader tells them apart."""
    return {k: (v[:8] + "…" if k == "producer_id" and len(v) > 8 else v) for k, v in metric.items()}


def legend(target: dict[str, Any], metric: dict[str, str]) -> str:
    fmt: str = target.get("legendFormat") or ""
    for k, v in short(metric).items():
        fmt = fmt.replace("{{" + k + "}}", v).replace("{{ " + k + " }}", v)
    return fmt or ",".join(f"{k}={v}" for k, v in metric.items()) or target["expr"][:40]


def draw(result: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    panels = result["panels"]
    rows = max(p["panel"]["gridPos"]["y"] + p["panel"]["gridPos"]["h"] for p in panels)
    unit = 0.62  # inches a grid row
    fig = plt.figure(figsize=(16, rows * unit * 0.72), facecolor="#181b1f")
    t0 = result["start"]
    for item in panels:
        panel, pos = item["panel"], item["panel"]["gridPos"]
        ax = fig.add_axes(
            (
                pos["x"] / 24 + 0.048,
                1 - (pos["y"] + pos["h"]) / rows + 0.018,
                pos["w"] / 24 - 0.058,
                pos["h"] / rows - 0.045,
            )
        )
        ax.set_facecolor("#111217")
        ax.set_title(panel["title"], color="#ccccdc", fontsize=10, loc="left")
        ax.tick_params(colors="#9fa7b3", labelsize=8)
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        ax.grid(color="#2c3235", linewidth=0.6)
        ax.yaxis.set_major_formatter(EngFormatter())  # 40k, 8.6M: as Grafana's short unit
        for mark in ("cut", "heal"):
            if mark in result["marks"]:
                ax.axvline(result["marks"][mark] - t0, color="#e02f44", linewidth=0.8, ls="--")
        if panel["type"] == "state-timeline":
            draw_states(ax, item["series"], t0)
            continue
        for s in item["series"]:
            ts = [float(t) - t0 for t, _ in s["values"]]
            vs = [float(v) for _, v in s["values"]]
            # (a label starting with "_" would be left out of the legend: "_TRANSPORT")
            label = legend(s["target"], s["metric"])
            ax.plot(ts, vs, linewidth=1.3, label=" " + label if label[:1] == "_" else label)
        if not any(float(v) for s in item["series"] for _, v in s["values"]):
            ax.set_ylim(0, 1)  # all zero: the axis of a flat line at 0
        if item["series"]:
            ax.legend(fontsize=7, loc="upper left", facecolor="#181b1f", labelcolor="#ccccdc",
                      edgecolor="#2c3235")  # fmt: skip
        else:
            ax.text(0.5, 0.5, "No data", color="#9fa7b3", ha="center", transform=ax.transAxes)
        ax.set_xlim(0, result["end"] - t0)
    fig.text(0.5, 0.003, "seconds since the start of the run; dashed red: the network cut and "
             "healed", color="#9fa7b3", ha="center", fontsize=8)  # fmt: skip
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, facecolor=fig.get_facecolor())


def draw_states(ax: Any, series: list[dict[str, Any]], t0: float) -> None:
    """Each producer's row coloured by the state its series says it was in."""
    rows = sorted({short(s["metric"]).get("producer_id", "?") for s in series})
    for s in series:
        row = rows.index(short(s["metric"]).get("producer_id", "?"))
        state = s["metric"].get("state", "?")
        for t, _ in s["values"]:
            ax.broken_barh([(float(t) - t0 - SCRAPE_S / 2, SCRAPE_S)], (row + 0.1, 0.8),
                           color=STATE_COLOURS.get(state, "#b877d9"))  # fmt: skip
    ax.set_yticks([r + 0.5 for r in range(len(rows))], rows, fontsize=7)
    ax.set_ylim(0, max(1, len(rows)))
    seen = sorted({s["metric"].get("state", "?") for s in series})
    for state in seen:
        ax.bar(0, 0, color=STATE_COLOURS.get(state, "#b877d9"), label=state)
    ax.legend(fontsize=7, loc="upper right", ncol=len(seen), facecolor="#181b1f",
              labelcolor="#ccccdc", edgecolor="#2c3235")  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=2000, help="records/s sent")
    ap.add_argument("--before", type=float, default=20.0)
    ap.add_argument("--outage", type=float, default=20.0)
    ap.add_argument("--after", type=float, default=30.0)
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "grafana-dashboard.png")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args, Path(tmp))
    draw(result, args.png)
    drawn = {
        "dashboard_sha256": hashlib.sha256(DASHBOARD.read_bytes()).hexdigest(),
        "panels": [p["panel"]["title"] for p in result["panels"]],
        # each series' label and highest value over the run
        "series": {
            p["panel"]["title"]: {
                legend(s["target"], s["metric"]): max(float(v) for _, v in s["values"])
                for s in p["series"]
            }
            for p in result["panels"]
        },
        "sent": result["sent"],
        "left_after_flush": result["left"],
        "run": time.strftime("%Y-%m-%d", time.gmtime(result["start"])),
        "settings": {k: v for k, v in vars(args).items() if k != "png"},
    }
    args.png.with_suffix(".json").write_text(json.dumps(drawn, indent=1) + "\n")
    print(json.dumps(drawn, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
