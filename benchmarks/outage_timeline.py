"""A producer through a broker outage, in a picture: records/s sent, acknowledged, spooled
and replayed, and the spool's depth, over time.

    python benchmarks/outage_timeline.py [--rate 20000] [--before 10] [--outage 10]
        [--after 20] [--png docs/img/outage-timeline.png] [--json]

Starts the embedded broker behind its TCP proxy, sends ``--rate`` records/s of 200 bytes
from one thread through a ``LogProducer``, cuts the network for ``--outage`` seconds
after ``--before`` seconds, heals it and keeps sending for ``--after`` seconds, then
``flush()``. The producer has the default settings. A sampler reads ``stats()`` every
0.1 s. Prints the figures (records sent, acknowledged, spooled, replayed; seconds from
the heal to an empty spool; every record in Kafka, counted by (producer, seq)) and draws
the PNG (matplotlib: ``make plots``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from logsdk import LogProducer
from logsdk.testing import EmbeddedBroker, check_delivery, create_topic, read_topic

ROOT = Path(__file__).resolve().parents[1]


def run(args: argparse.Namespace) -> dict[str, Any]:
    samples: list[dict[str, Any]] = []
    marks: dict[str, float] = {}
    with EmbeddedBroker(proxy=True) as broker, tempfile.TemporaryDirectory() as spool:
        topic = create_topic(broker.bootstrap_servers, "outage", 4)
        p = LogProducer(broker.bootstrap_servers, topic, spool)  # the default settings
        stop = threading.Event()
        t0 = time.monotonic()

        def sample() -> None:
            while not stop.is_set():
                s = p.stats()
                samples.append(
                    {
                        "t": time.monotonic() - t0,
                        "sent": s["sent"],
                        "acked": s["acked"],
                        "spooled": s["spooled"],
                        "replayed": s["replayed"],
                        "spool_records": s["spool_records"],
                        "state": s["state"],
                    }
                )
                stop.wait(0.1)

        sampler = threading.Thread(target=sample, name="sampler", daemon=True)
        sampler.start()
        pad = b"x" * 190
        total = args.before + args.outage + args.after
        n = 0
        try:
            while True:
                now = time.monotonic() - t0
                if now >= total:
                    break
                if "cut" not in marks and now >= args.before:
                    broker.cut()
                    marks["cut"] = now
                if "heal" not in marks and now >= args.before + args.outage:
                    broker.heal()
                    marks["heal"] = now
                due = int(now * args.rate)
                while n < due:
                    p.send(b"%09d" % n + pad, key=b"%d" % (n % 64))
                    n += 1
                time.sleep(0.002)
            left = p.flush(120)
            marks["flushed"] = time.monotonic() - t0
        finally:
            time.sleep(0.3)
            stop.set()
            sampler.join()
            p.close(10)
        rep = check_delivery(read_topic(broker.bootstrap_servers, topic, timeout=180))
        missing = len(rep.missing(p.producer_id, range(n)))
    empty_at = next(
        (s["t"] for s in samples if s["t"] > marks["heal"] and s["spool_records"] == 0),
        None,
    )
    return {
        "records": n,
        "left_after_flush": left,
        "missing": missing,
        "duplicates": rep.duplicates,
        "spooled": samples[-1]["spooled"],
        "replayed": samples[-1]["replayed"],
        "max_spool_depth": max(s["spool_records"] for s in samples),
        "heal_to_empty_spool_s": None if empty_at is None else round(empty_at - marks["heal"], 2),
        "marks": {k: round(v, 2) for k, v in marks.items()},
        "samples": samples,
        "rate": args.rate,
    }


def rates(samples: list[dict[str, Any]], key: str, window: float = 0.5) -> tuple[list, list]:
    """Records/s of counter ``key`` over ``window`` seconds, at each window's end."""
    ts, rs = [], []
    last = samples[0]
    for s in samples[1:]:
        if s["t"] - last["t"] >= window:
            ts.append(s["t"])
            rs.append((s[key] - last[key]) / (s["t"] - last["t"]))
            last = s
    return ts, rs


def plot(result: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, marks = result["samples"], result["marks"]
    fig, (top, bottom, states) = plt.subplots(
        3, 1, figsize=(10, 6.6), sharex=True, height_ratios=[2, 1, 0.25]
    )
    # acknowledged first, wide and pale: after the heal it is the replay's line
    ts, rs = rates(samples, "acked")
    top.plot(ts, [r / 1000 for r in rs], label="acknowledged by Kafka", lw=5, alpha=0.35)
    for key, label in (
        ("sent", "sent (accepted by send())"),
        ("spooled", "committed to the spool"),
        ("replayed", "replayed from the spool"),
    ):
        ts, rs = rates(samples, key)
        top.plot(ts, [r / 1000 for r in rs], label=label)
    top.set_ylabel("thousand records/s")
    top.legend(loc="upper left", fontsize=8)
    bottom.plot(
        [s["t"] for s in samples], [s["spool_records"] / 1000 for s in samples], color="tab:red"
    )
    bottom.set_ylabel("spool depth\n(thousand records)")
    colors = {"ONLINE": "tab:green", "DEGRADED": "tab:red", "RECOVERING": "tab:orange"}
    start = samples[0]
    for prev, cur in zip(samples, [*samples[1:], None], strict=True):
        if cur is None or cur["state"] != prev["state"]:
            end = prev["t"] if cur is None else cur["t"]
            states.axvspan(start["t"], end, color=colors.get(start["state"], "0.5"))
            if end - start["t"] > 2:
                states.text((start["t"] + end) / 2, 0.5, start["state"], ha="center",
                            va="center", fontsize=8, color="white")  # fmt: skip
            start = cur if cur is not None else start
    states.set_yticks([])
    states.set_ylabel("state", rotation=0, ha="right", va="center")
    states.set_xlabel("seconds")
    for ax in (top, bottom):
        ax.axvspan(marks["cut"], marks["heal"], color="0.85", zorder=0)
        ax.grid(alpha=0.3)
    top.text(
        (marks["cut"] + marks["heal"]) / 2, top.get_ylim()[1] * 0.92, "network cut",
        ha="center", fontsize=9,
    )  # fmt: skip
    fig.suptitle(
        f"LogProducer through a {marks['heal'] - marks['cut']:.0f} s network cut, "
        f"{result['rate']:,} records/s: {result['records']:,} sent, "
        f"missing {result['missing']}, spool empty {result['heal_to_empty_spool_s']} s "
        "after the heal",
        fontsize=10,
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=20_000, help="records/s sent")
    ap.add_argument("--before", type=float, default=10.0)
    ap.add_argument("--outage", type=float, default=10.0)
    ap.add_argument("--after", type=float, default=20.0)
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "outage-timeline.png")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON last")
    args = ap.parse_args(argv)
    result = run(args)
    plot(result, args.png)
    figures = {k: v for k, v in result.items() if k != "samples"}
    for key, value in figures.items():
        print(f"{key:24} {value}")
    print(f"{'png':24} {args.png}")
    if args.json:
        print(json.dumps(figures))
    return 0 if result["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
