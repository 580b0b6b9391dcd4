"""``logsdk placement`` run as a subprocess: output, files and the 0/1/2 exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from logsdk.placement import Broker, Cluster, Topic, make_brokers, plan, reassignment_json


def load_assignment_doc(
    doc: dict[str, Any], base: dict[str, dict[int, list[int]]]
) -> dict[str, dict[int, list[int]]]:
    """``base`` with the partitions a reassignment JSON lists replaced."""
    out = {t: dict(parts) for t, parts in base.items()}
    for p in doc["partitions"]:
        out[p["topic"]][p["partition"]] = p["replicas"]
    return out


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logsdk.cli", "placement", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_plan_json_is_kafka_reassignment_format() -> None:
    """plan --json prints the reassignment JSON, one entry per partition."""
    out = run("plan", "--brokers", "6", "--racks", "a,b,c", "--topics", "logs:12:3", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["version"] == 1
    assert len(doc["partitions"]) == 12
    assert all(len(set(p["replicas"])) == 3 for p in doc["partitions"])


def test_plan_kafka_matches_library() -> None:
    """plan --strategy kafka gives the same replicas as plan() with the same seed."""
    out = run("plan", "--brokers", "5", "--topics", "t:10:3", "--strategy", "kafka", "--json")
    expected = plan(Cluster(make_brokers(range(5)), (Topic("t", 10, 3),)), "kafka", seed="0")
    assert json.loads(out.stdout) == reassignment_json(expected)


def test_plan_with_current_shows_moves(tmp_path: Path) -> None:
    """plan --current on a cluster with one more broker prints the diff and the moved share."""
    twelve = Cluster(make_brokers(range(12), ["a", "b", "c"]), (Topic("logs", 60, 3),))
    now = tmp_path / "now.json"
    now.write_text(json.dumps(reassignment_json(plan(twelve, "ring"))))
    cluster = twelve.with_brokers((*twelve.brokers, Broker(12, "a")))
    cfile = tmp_path / "cluster.json"
    cfile.write_text(json.dumps(cluster.to_dict()))
    out = run(
        "plan", "--cluster", str(cfile), "--current", str(now), "--output", "p.json", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "moved:" in out.stdout
    assert "+12" in out.stdout
    assert json.loads((tmp_path / "p.json").read_text())["partitions"]


def test_diff_between_files(tmp_path: Path) -> None:
    """diff --current A --proposed B lists the changed partition and a summary."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(reassignment_json({"t": {0: [1, 2], 1: [2, 3]}})))
    b.write_text(json.dumps(reassignment_json({"t": {0: [1, 2], 1: [3, 4]}})))
    out = run("diff", "--current", str(a), "--proposed", str(b))
    assert out.returncode == 0, out.stderr
    assert "t-1: [2, 3] -> [3, 4]  +4 -2 leader 2 -> 3" in out.stdout


def test_describe_cluster_file(tmp_path: Path) -> None:
    """describe --json reports the metrics of the cluster file's current assignment."""
    cluster = Cluster(
        (Broker(0, "a"), Broker(1, "a")), (Topic("t", 2, 2),), {"t": {0: [0, 1], 1: [1, 0]}}
    )
    cfile = tmp_path / "c.json"
    cfile.write_text(json.dumps(cluster.to_dict()))
    out = run("describe", "--cluster", str(cfile), "--json")
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["metrics"]
    assert m["replicas"] == {"0": 2, "1": 2}
    assert m["rack_violations"] == 0


def test_bad_input_exits_1_without_traceback() -> None:
    """RF above the brokers exits 1 with one error line naming the topic, no traceback."""
    out = run("plan", "--brokers", "2", "--topics", "logs:3:3")
    assert out.returncode == 1
    assert "topic 'logs': replication factor 3" in out.stderr
    assert "Traceback" not in out.stderr


def test_bad_usage_exits_2() -> None:
    """A malformed --topics spec is a usage error (exit 2) that shows the expected form."""
    out = run("plan", "--brokers", "3", "--topics", "logs:three:1")
    assert out.returncode == 2
    assert "NAME:PARTITIONS:RF" in out.stderr


def test_plan_current_after_weight_change_reports_moves(tmp_path: Path) -> None:
    """plan --cluster (broker 0 now weight 3) --current: replicas move and the count is shown."""
    six = Cluster(make_brokers(range(6), ["a", "b", "c"]), (Topic("logs", 600, 3),))
    now = tmp_path / "now.json"
    now.write_text(json.dumps(reassignment_json(plan(six, "ring"))))
    heavier = six.with_brokers((Broker(0, "a", 3.0), *six.brokers[1:]))
    cfile = tmp_path / "cluster.json"
    cfile.write_text(json.dumps(heavier.to_dict()))
    out = run(
        "plan", "--cluster", str(cfile), "--current", str(now), "--output", "p.json", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    moved = [line for line in out.stdout.splitlines() if "moved:" in line]
    assert moved
    assert int(moved[0].split()[1]) > 0
    assert json.loads((tmp_path / "p.json").read_text())["partitions"]


def test_plan_previous_brokers_move_what_the_ring_says(tmp_path: Path) -> None:
    """plan --previous (the old weights): broker 0 (weight 1 -> 3) takes its full share, 450."""
    six = Cluster(make_brokers(range(6), ["a", "b", "c"]), (Topic("logs", 600, 3),))
    before = plan(six, "ring")
    now = tmp_path / "now.json"
    now.write_text(json.dumps(reassignment_json(before)))
    old = tmp_path / "old.json"
    old.write_text(json.dumps(six.to_dict()))
    heavier = six.with_brokers((Broker(0, "a", 3.0), *six.brokers[1:]))
    cfile = tmp_path / "cluster.json"
    cfile.write_text(json.dumps(heavier.to_dict()))
    args = ["plan", "--cluster", str(cfile), "--current", str(now), "--previous", str(old)]
    out = run(*args, "--json")
    assert out.returncode == 0, out.stderr
    proposed = load_assignment_doc(json.loads(out.stdout), before)
    assert sum(0 in reps for reps in proposed["logs"].values()) == 450


def test_current_with_fewer_partitions_than_declared_is_refused(tmp_path: Path) -> None:
    """--current holding 2 partitions of a topic declared with 6 exits 1 naming both counts.

    The plan would otherwise ask kafka-reassign-partitions.sh to move partitions 2-5,
    which do not exist.
    """
    now = tmp_path / "now.json"
    now.write_text(json.dumps(reassignment_json({"logs": {0: [0, 1], 1: [1, 2]}})))
    out = run("plan", "--brokers", "3", "--topics", "logs:6:2", "--current", str(now))
    assert out.returncode == 1, out.stdout
    assert "topic 'logs'" in out.stderr
    assert "2 partitions" in out.stderr
    assert "declares 6" in out.stderr
    assert "Traceback" not in out.stderr


def test_plan_with_nothing_to_move_writes_no_file(tmp_path: Path) -> None:
    """A plan equal to --current says "nothing to reassign" and writes no (empty) JSON.

    kafka-reassign-partitions.sh rejects {"version": 1, "partitions": []}.
    """
    cluster = Cluster(make_brokers(range(6), ["a", "b", "c"]), (Topic("logs", 12, 3),))
    now = tmp_path / "now.json"
    now.write_text(json.dumps(reassignment_json(plan(cluster, "ring"))))
    args = ["--brokers", "6", "--racks", "a,b,c", "--topics", "logs:12:3", "--current", str(now)]
    out = run("plan", *args, "--output", "p.json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "nothing to reassign" in out.stdout
    assert not (tmp_path / "p.json").exists()


def test_racks_naming_no_rack_is_refused() -> None:
    """--racks "," names no rack: exit 1 with a message (it was a ZeroDivisionError)."""
    out = run("plan", "--brokers", "3", "--racks", ",", "--topics", "t:2:2")
    assert out.returncode == 1
    assert "--racks" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_load_factor_is_a_usage_error(value: str) -> None:
    """--load-factor nan/inf is refused with a message (they raised ValueError/OverflowError)."""
    out = run("plan", "--brokers", "3", "--topics", "t:2:2", f"--load-factor={value}")
    assert out.returncode == 2
    assert "load factor must be a finite number" in out.stderr
    assert "Traceback" not in out.stderr


def test_huge_vnodes_is_refused_before_building_the_ring() -> None:
    """--vnodes 100000000 is refused at once with the limit (it was killed by the OOM killer)."""
    out = run("plan", "--brokers", "3", "--topics", "t:2:2", "--vnodes", "100000000")
    assert out.returncode == 1
    assert "virtual nodes" in out.stderr
    assert "--vnodes" in out.stderr
    assert "Traceback" not in out.stderr
