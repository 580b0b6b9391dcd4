"""The chaos checker without a broker: the delivery history, expected against sink, the
explanations of what is missing, and the figures merged into a results.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from logsdk.consumer import Record
from logsdk.sinks import SQLiteSink
from logsdk.testing import DeliveryReport
from logsdk.testing.chaos import TOPIC, unconfirmed_seqs
from logsdk.testing.chaos._checker import (
    Expected,
    InTopic,
    expected,
    explain_missing,
    offset_gaps,
    ownership_violations,
    sink,
    sink_count,
    unexplained_missing,
    verdict,
)
from logsdk.testing.chaos._history import delivery_history, reports
from logsdk.testing.chaos._main import merge_results
from logsdk.testing.chaos._nemesis import fault_kinds
from logsdk.testing.chaos._workload import Proc, Run

PID = "0123456789abcdef"


def report_line(pid: int, start_seq: int, accepted: int, **kw: Any) -> str:
    line = {"pid": pid, "producer_id": PID, "start_seq": start_seq, "accepted": accepted}
    return json.dumps({"dropped": 0, "degraded_s": 0.0, **line, **kw}) + "\n"


def store(db: Path, rows: list[tuple[int, int, int]], dedupe: bool = True) -> None:
    """Store ``(partition, offset, seq)`` rows of producer PID in a chaos sink at ``db``."""
    with SQLiteSink(db, dedupe=dedupe) as s:
        for part, off, seq in rows:
            headers = [("logsdk.producer", PID.encode()), ("logsdk.seq", b"%d" % seq)]
            s.process([Record(TOPIC, part, off, None, b"{}", headers, 1)])
            s.commit({(TOPIC, part): off + 1})


class Msg:
    """A record read back, as far as offset_gaps looks."""

    def __init__(self, partition: int, offset: int) -> None:
        self._p, self._o = partition, offset

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


def test_unconfirmed_is_a_report_without_offset_and_the_rest_of_its_batch() -> None:
    """A "delivered" report with no offset, and the reports at offsets 0, 1... right after
    it in its partition, are unconfirmed; an offset out of that run ends the batch."""
    lines = ["1 0 None 0 1.0\n", "2 0 0 0 1.0\n", "3 0 1 0 1.0\n", "4 0 57 0 1.0\n"]
    assert unconfirmed_seqs(lines) == {1, 2, 3}


def test_a_batch_ends_at_another_partition_a_failure_a_new_process_or_a_torn_line() -> None:
    """The run of offsets 0, 1... continues a doubtful batch only in its partition and
    until a failure report, a ``#`` line or a line torn by SIGKILL."""
    assert unconfirmed_seqs(["1 0 None 0 1\n", "2 1 0 0 1\n"]) == {1}
    assert unconfirmed_seqs(["1 0 None 0 1\n", "2 0 0 1 1\n", "3 0 1 0 1\n"]) == {1}
    assert unconfirmed_seqs(["1 0 None 0 1\n", "# pid 7\n", "2 0 0 0 1\n"]) == {1}
    assert unconfirmed_seqs(["1 0 None 0 1\n", "2 0 x", "3 0 0 0 1\n"]) == {1}


def test_reports_give_partition_offset_error_and_doubt() -> None:
    """Each line is ``(seq, (partition, offset or -1, error code, unconfirmed))``."""
    got = list(reports(["5 2 None 0 1\n", "6 2 0 0 1\n", "7 3 9 0 1\n", "8 3 None 42 1\n"]))
    assert got == [
        (5, (2, -1, 0, True)),
        (6, (2, 0, 0, True)),
        (7, (3, 9, 0, False)),
        (8, (3, -1, 42, False)),
    ]


def test_delivery_history_reads_each_producer_trace(tmp_path: Path) -> None:
    """Per producer id (from its progress report): the unconfirmed seqs and every report
    of the seqs asked for; a producer without a trace is left out."""
    (tmp_path / "p0.jsonl").write_text(report_line(1, 0, 3))
    (tmp_path / "p0.acks").write_text("# pid 1\n0 0 None 0 1\n1 0 0 0 1\n2 1 4 0 1\n2 1 5 0 1\n")
    (tmp_path / "p1.jsonl").write_text(report_line(2, 0, 3).replace(PID, "other"))
    unconfirmed, found = delivery_history(tmp_path, {PID: {2}})
    assert unconfirmed == {PID: {0, 1}}
    assert found == {PID: {2: [(1, 4, 0, False), (1, 5, 0, False)]}}


def test_expected_counts_each_process_last_line(tmp_path: Path) -> None:
    """Two lives of one producer (two pids) both count, each by its last whole line; a
    torn line is skipped; drops, losses at close and time degraded add up."""
    path = tmp_path / "p0.jsonl"
    path.write_text(
        report_line(1, 0, 20)
        + report_line(1, 0, 40, dropped=3, degraded_s=1.5)
        + report_line(2, 4096, 10, lost_on_close=2, degraded_s=0.5)
        + '{"pid": 2, "produc'
    )
    exp = expected([path])
    assert exp.seqs == {PID: set(range(40)) | set(range(4096, 4106))}
    assert exp.dropped == {PID: 3}
    assert exp.lost_on_close == {PID: 2}
    assert exp.degraded_s == 2.0


def test_sink_reads_seqs_and_rows(tmp_path: Path) -> None:
    """The sink's seqs per producer and its row count; a sink not yet made counts 0."""
    db = tmp_path / "sink.db"
    assert sink_count(db) == 0
    store(db, [(0, 0, 7), (0, 1, 8), (1, 0, 7)], dedupe=False)
    assert sink(db) == ({PID: {7, 8}}, 3)
    assert sink_count(db) == 3


def test_explain_missing_classifies_by_delivery_reports(tmp_path: Path) -> None:
    """No report, failures only, unconfirmed, acked where another record is, acked where
    none is: each missing record gets one kind, and the first few are shown."""
    db = tmp_path / "sink.db"
    store(db, [(0, 10, 99)])
    history = {
        PID: {
            2: [(0, -1, 1, False)],
            3: [(0, -1, 0, True)],
            4: [(0, 10, 0, False)],
            5: [(0, 11, 0, False)],
        }
    }
    got = explain_missing(history, {PID: {1, 2, 3, 4, 5}, "quiet": set()}, db, limit=2)
    assert {k: v for k, v in got.items() if k != "examples"} == {
        "no_report": 1,
        "failed_only": 1,
        "unconfirmed": 1,
        "acked_taken": 1,
        "acked_empty": 1,
    }
    assert got["examples"] == [
        f"{PID[:8]}:1 no_report []",
        f"{PID[:8]}:2 failed_only [(0, -1, 1, False)]",
    ]
    assert explain_missing(history, {PID: set()}, db) == {}


def test_offset_gaps_name_each_hole_per_partition() -> None:
    """Offsets are read from 0: a hole at the start, in the middle, none for a repeat."""
    msgs = [Msg(0, o) for o in (2, 3, 3, 7)] + [Msg(1, o) for o in (1, 0)]
    assert offset_gaps(msgs) == ["p0: 0-1", "p0: 4-6"]


def test_drops_explain_at_most_themselves_per_producer() -> None:
    """A producer's missing records beyond its own drops and losses at close are
    unexplained; another producer's drops do not count for it."""
    lost = {"a": {1, 2, 3}, "b": {1}, "c": set()}
    assert unexplained_missing(lost, {"a": 1, "c": 5}, {"a": 1}) == {"a": 1, "b": 1}


def test_ownership_violations_from_the_children_logs(tmp_path: Path) -> None:
    """Lines saying "ownership violation:" in any child's log are collected."""
    (tmp_path / "p0.log").write_text("fine\nERROR ownership violation: x by y\n")
    (tmp_path / "c0.log").write_text("fine\n")
    assert ownership_violations(tmp_path) == ["p0.log: ERROR ownership violation: x by y"]


def a_run(work: Path) -> Run:
    run = Run(seed=5, duration=60.0, work=work, shm=True)
    run.producers.append(Proc("p0", [], killable=False, spool=work / "p0", buffer="memory"))
    run.consumers.append(Proc("c0", [], killable=True))
    run.events.append((4.2, "net_cut"))
    return run


def test_verdict_ok_when_the_sink_holds_each_accepted_record_once(tmp_path: Path) -> None:
    """Every accepted record in the sink once, the one out of order resent after an
    unconfirmed report: ok, with the figures the command prints."""
    run = a_run(tmp_path)
    store(run.db, [(0, o, o) for o in range(4)])
    (tmp_path / "p0.jsonl").write_text(report_line(1, 0, 4))
    (tmp_path / "p0.acks").write_text("3 0 None 0 1\n")
    (tmp_path / "c0.latency").write_text("1.25")
    exp = Expected({PID: set(range(4))}, {PID: 0}, {PID: 0}, 0.0)
    wire = DeliveryReport(order_violations=1, order_violators=[(PID, 3)])
    v = verdict(run, exp, InTopic(wire, ["p0: 4-4"], {PID: set(range(4))}), t_start=0.0)
    assert (v["accepted"], v["in_sink"], v["missing"], v["duplicates"]) == (4, 4, 0, 0)
    assert v["order_violations_after_unconfirmed"] == 1
    assert v["unconfirmed_reports"] == 1
    assert (v["max_latency_s"], v["offset_gaps"], v["events"]) == (
        1.25,
        ["p0: 4-4"],
        ["4.2s net_cut"],
    )
    assert v["verdict"] == "ok"


def test_verdict_fails_on_an_unexplained_loss_and_says_where(tmp_path: Path) -> None:
    """Two records missing, one dropped by the producer's policy: one unexplained, the
    loss placed in the topic or in the consumers, the run FAIL."""
    run = a_run(tmp_path)
    store(run.db, [(0, 0, 0), (0, 1, 1)])
    (tmp_path / "p0.jsonl").write_text(report_line(1, 0, 4))
    (tmp_path / "p0.acks").write_text("2 0 2 0 1\n")
    exp = Expected({PID: set(range(4))}, {PID: 1}, {PID: 0}, 0.0)
    v = verdict(run, exp, InTopic(DeliveryReport(), [], {PID: {0, 1, 2}}), t_start=0.0)
    assert (v["missing"], v["missing_raw"], v["dropped"]) == (1, 2, 1)
    assert (v["not_in_topic"], v["in_topic_not_in_sink"]) == (1, 1)
    assert v["missing_reports"] == {
        "acked_empty": 1,
        "no_report": 1,
        "examples": [f"{PID[:8]}:2 acked_empty [(0, 2, 0, False)]", f"{PID[:8]}:3 no_report []"],
    }
    assert v["verdict"] == "FAIL"


def test_verdict_fails_on_a_duplicate_another_order_violation_or_a_spool_problem(
    tmp_path: Path,
) -> None:
    """A record twice in the sink, a record out of order with a confirmed report, or a
    problem in a spool each fail the run on their own."""
    exp = Expected({PID: {0, 1}}, {}, {}, 0.0)
    topic = InTopic(DeliveryReport(), [], {PID: {0, 1}})
    run = a_run(tmp_path / "dup")
    run.work.mkdir()
    store(run.db, [(0, 0, 0), (0, 1, 1), (0, 2, 1)], dedupe=False)
    assert verdict(run, exp, topic, 0.0)["duplicates"] == 1
    assert verdict(run, exp, topic, 0.0)["verdict"] == "FAIL"
    run = a_run(tmp_path / "order")
    run.work.mkdir()
    store(run.db, [(0, 0, 0), (0, 1, 1)])
    wire = DeliveryReport(order_violations=1, order_violators=[(PID, 0)])
    assert verdict(run, exp, InTopic(wire, [], topic.seqs), 0.0)["verdict"] == "FAIL"
    assert verdict(run, exp, topic, 0.0)["verdict"] == "ok"
    run.spool_problems.append("after net_cut at 4.2s: p0: bad")
    assert verdict(run, exp, topic, 0.0)["verdict"] == "FAIL"


def test_merge_results_replaces_this_seed_and_broker_only(tmp_path: Path) -> None:
    """chaos.* figures of the same seed and broker are replaced; other seeds, other
    brokers and other figures are kept."""
    path = tmp_path / "results.json"
    other = {"name": "producer.rate", "value": 1, "params": {}}
    seed2 = {"name": "chaos.missing", "value": 9, "params": {"seed": 2}}
    apache = {"name": "chaos.missing", "value": 8, "params": {"seed": 1, "broker": "apache"}}
    old = {"name": "chaos.missing", "value": 7, "params": {"seed": 1}}
    path.write_text(json.dumps({"results": [other, seed2, apache, old]}))
    v = {
        "seed": 1,
        "duration_s": 60.0,
        "shm": True,
        "max_in_flight": 1,
        "verdict": "ok",
        "missing": 0,
        "duplicates": 0,
        "accepted": 10,
        "dropped": 1,
        "max_latency_s": 2.0,
        "degraded_s": 3.0,
    }
    merge_results(path, v)
    got = json.loads(path.read_text())["results"]
    assert got[:3] == [other, seed2, apache]
    assert [r["name"] for r in got[3:]] == [
        f"chaos.{k}"
        for k in ("missing", "duplicates", "accepted", "dropped", "max_latency_s", "degraded_s")
    ]
    assert got[3]["params"]["broker"] == "embedded"
    assert got[3]["value"] == 0


def test_nemesis_draws_broker_faults_by_kind_and_kills_only_survivable_producers(
    tmp_path: Path,
) -> None:
    """The embedded broker is killed or paused, a cluster loses a leader or a paused node;
    a producer is killed only when one survives it (shm)."""
    run = a_run(tmp_path)
    assert fault_kinds(run, cluster=False) == [
        "broker_kill",
        "broker_pause",
        "net_cut",
        "consumer_kill",
        "spool_fill",
    ]
    run.producers.append(Proc("p1", [], killable=True, spool=tmp_path / "p1", buffer="shm"))
    assert fault_kinds(run, cluster=True)[:2] == ["leader_kill", "node_pause"]
    assert fault_kinds(run, cluster=True)[-1] == "producer_kill"
