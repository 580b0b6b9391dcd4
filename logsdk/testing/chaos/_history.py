"""The delivery history: one line per delivery report a producer got, written as it comes
and read back by the checker.

Part of the checker's history, as a Jepsen history records every operation's outcome: a
missing record acknowledged at offset -1 got a "duplicate sequence" reply, one
acknowledged at an offset the topic holds another record at was acked and not kept, and
one never acknowledged was lost before Kafka.

The line format (``seq partition offset error time``) has this module as its one owner:
`trace_deliveries()` writes it, `reports()` reads it. A trace file belongs to the
producer process that appends to it (line-buffered, so a SIGKILL loses no whole line); the
checker reads it once every producer has ended.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

#: One delivery report from a producer's trace: partition, offset (-1: none), error code,
#: and whether it is unconfirmed (no offset, or the rest of such a batch: see below).
Report = tuple[int, int, int, bool]


def trace_acks(p: Any, path: Path) -> None:
    """Append one line per delivery report of producer ``p`` to ``path`` (see
    `trace_deliveries()`), and librdkafka's debug log (``eos``: the producer ids and
    epochs it was given) next to it, in ``<path>.rdkafka.log``."""
    out = open(path, "a", buffering=1)  # noqa: SIM115 - line-buffered: a SIGKILL loses no line
    out.write(f"# pid {os.getpid()}\n")
    rd = logging.getLogger("logsdk.librdkafka")
    h = logging.FileHandler(path.with_suffix(".rdkafka.log"))
    h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    rd.addHandler(h)
    rd.setLevel(logging.DEBUG)
    rd.propagate = False
    trace_deliveries(p, out.write)


def trace_deliveries(p: Any, write: Callable[[str], object]) -> None:
    """Trace the delivery reports of LogProducer ``p``: each report first calls
    ``write("seq partition offset error time\\n")`` (error 0: delivered; offset None: no
    offset given; seq -1: a purged replay report, which has no headers).
    `unconfirmed_seqs()` reads these lines back.

    Install it right after the producer is built: the reports of a replay its pump began
    in the meantime (a spool left by a previous process) may be missing.
    """

    def line(seq: int, err: Any, msg: Any) -> None:
        code = 0 if err is None else err.code()
        write(f"{seq} {msg.partition()} {msg.offset()} {code} {time.time():.3f}\n")

    from logsdk.testing import producer_hooks

    producer_hooks(p).trace_reports(line)


def reports(lines: Iterable[str]) -> Iterator[tuple[int, Report]]:
    """``(seq, report)`` for each line written by `trace_deliveries()`, in order,
    with the producer's ``_unconfirmed`` rule replayed: a "delivered" report without an
    offset, and the rest of its batch (the same partition, offsets 0, 1, 2... right after
    it), are unconfirmed. A ``#`` line (a new process) and a torn line end a batch."""
    chain: tuple[int, int] | None = None  # (partition, next offset) of a doubtful batch
    for raw in lines:
        parts = raw.split()
        if len(parts) < 4 or raw.startswith("#"):
            chain = None
            continue
        try:
            seq, part, code = int(parts[0]), int(parts[1]), int(parts[3])
            off = -1 if parts[2] == "None" else int(parts[2])
        except ValueError:
            chain = None  # a line torn by SIGKILL
            continue
        bad = False
        if code == 0:
            if off < 0:
                bad, chain = True, (part, 0)
            elif chain == (part, off):
                bad, chain = True, (part, off + 1)
            else:
                chain = None
        else:
            chain = None
        yield seq, (part, off, code, bad)


def unconfirmed_seqs(lines: Iterable[str]) -> set[int]:
    """The seqs whose "delivered" report no offset confirmed, from the lines
    `trace_deliveries()` wrote: librdkafka's success after a broker's "duplicate
    sequence number" reply. The producer resends those records; when the broker had
    not in fact stored them (the embedded broker's quirk) they land after records sent
    later, so these seqs explain order violations a reader then sees."""
    return {seq for seq, report in reports(lines) if report[3]}


def delivery_history(
    work: Path, want: dict[str, set[int]]
) -> tuple[dict[str, set[int]], dict[str, dict[int, list[Report]]]]:
    """Read the producers' traces (``p*.acks`` in ``work``): per producer id, the seqs
    that got an *unconfirmed* "delivered" report, and every report of the seqs in
    ``want``.

    librdkafka turns a "duplicate sequence number" reply into success with the batch's
    base offset -1: the batch's first record has no offset and the rest of it follow at
    once with the offsets 0, 1, 2... (the producer's ``_unconfirmed`` rule, replayed here).
    A trace belongs to the producer id on the first line of its progress report
    (``p*.jsonl``, see `logsdk.testing.chaos._workload`).
    """
    unconfirmed: dict[str, set[int]] = {}
    found: dict[str, dict[int, list[Report]]] = {}
    for rep in sorted(work.glob("p*.jsonl")):
        try:
            pid = json.loads(rep.read_text().splitlines()[0])["producer_id"]
        except (IndexError, KeyError, ValueError):
            continue
        acks = rep.with_suffix(".acks")
        if not acks.exists():
            continue
        seqs, mine, doubt = want.get(pid, set()), found.setdefault(pid, {}), set()
        with acks.open() as f:
            for seq, report in reports(f):
                if report[3]:
                    doubt.add(seq)
                if seq in seqs:
                    mine.setdefault(seq, []).append(report)
        unconfirmed[pid] = doubt
    return unconfirmed, found
