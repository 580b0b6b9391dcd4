"""The `logsdk` command, run as a subprocess against a real broker, one test per command."""

from __future__ import annotations

import json
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from logsdk import LogProducer
from logsdk.testing import free_port, read_topic, tansu_binary
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import FAST, rdkafka_config, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def cli(
    *args: str, stdin: str | None = None, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m logsdk.cli ARGS`` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "logsdk.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "", **(env or {})},
    )


def consumer_settings(kafka_broker: KafkaTarget) -> list[str]:
    """``-X`` options that make a consumer group join quickly on this cluster."""
    out: list[str] = []
    for key, value in kafka_broker.client_config("consumer").items():
        if key != "bootstrap.servers":
            out += ["-X", f"{key}={value}"]
    return out


def test_help_lists_every_command() -> None:
    """`logsdk --help` lists every command, with examples; exit 0."""
    out = cli("--help")
    assert out.returncode == 0, out.stderr
    for command in ("broker", "placement", "produce", "tail", "spool", "bench"):
        assert command in out.stdout
    assert "examples:" in out.stdout


def test_produce_then_tail(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """produce: JSON lines as is, plain lines wrapped, keys from a field; tail prints them
    readably, filters with --grep, colours levels on request, and --json keeps every field."""
    topic = fresh_topic(1)
    bootstrap = kafka_broker.bootstrap_servers
    lines = [
        json.dumps({"level": "ERROR", "logger": "web", "message": "disk full", "svc": "api"}),
        "a plain line",
        json.dumps({"level": "INFO", "logger": "web", "message": "recovered", "n": 3}),
    ]
    out = cli(
        "produce", "-t", topic, "-b", bootstrap, "--spool-dir", str(tmp_path / "spool"),
        "--key-field", "svc", "--key", "default-key",
        stdin="\n".join(lines) + "\n\n",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "sent 3 record(s)" in out.stderr
    msgs = read_topic(bootstrap, topic)
    assert [m.key() for m in msgs] == [b"api", b"default-key", b"default-key"]
    assert json.loads(msgs[0].value() or b"")["message"] == "disk full"
    wrapped = json.loads(msgs[1].value() or b"")
    assert wrapped["message"] == "a plain line"
    assert wrapped["level"] == "INFO"
    assert {"timestamp", "host"} <= set(wrapped)
    assert all(dict(m.headers() or []).get("logsdk.seq") is not None for m in msgs)

    out = cli(
        "produce", "-t", topic, "-b", bootstrap, "--spool-dir", str(tmp_path / "spool"),
        "--format", "json", stdin='{"level": "DEBUG", "message": "strict"}\nnot json\n',
    )  # fmt: skip
    assert out.returncode == 1  # a line was refused: reported, skipped, the rest sent
    assert "line 2 is not a JSON object" in out.stderr
    assert "sent 1 record(s)" in out.stderr

    out = cli("tail", "-t", topic, "-b", bootstrap, "--from-beginning", "--count", "3")
    assert out.returncode == 0, out.stderr
    printed = out.stdout.splitlines()
    assert len(printed) == 3
    assert "ERROR" in printed[0]
    assert "web: disk full" in printed[0]
    assert "svc=api" in printed[0]
    assert "a plain line" in printed[1]
    assert "\033[" not in out.stdout  # not a terminal: no colour

    out = cli(
        "tail", "-t", topic, "-b", bootstrap, "--from-beginning", "--count", "1",
        "--grep", "RECOVER", "-i", "--color", "always",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "recovered" in out.stdout
    assert "disk full" not in out.stdout
    assert "\033[32mINFO" in out.stdout  # INFO in green

    out = cli("tail", "-t", topic, "-b", bootstrap, "--from-beginning", "-n", "4", "--json")
    assert out.returncode == 0, out.stderr
    docs = [json.loads(line) for line in out.stdout.splitlines()]
    assert [d["offset"] for d in docs] == [0, 1, 2, 3]
    assert docs[3]["value"] == {"level": "DEBUG", "message": "strict"}
    assert docs[0]["value"]["svc"] == "api"
    assert docs[0]["key"] == "api"
    assert "logsdk.producer" in dict(docs[0]["headers"])


def test_tail_group_resumes_after_what_it_printed(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """tail --group commits what it printed: a second run starts right after it."""
    topic = fresh_topic(1)
    bootstrap = kafka_broker.bootstrap_servers
    with LogProducer(bootstrap, topic, tmp_path) as p:
        for i in range(3):
            p.send({"level": "INFO", "message": f"m{i}"})
        assert p.flush(10) == 0
    group = f"tail-{topic}"
    args = ["tail", "-t", topic, "-b", bootstrap, "--group", group, "--from-beginning"]
    first = cli(*args, "--count", "2", *consumer_settings(kafka_broker))
    assert first.returncode == 0, first.stderr
    assert ["m0" in first.stdout, "m1" in first.stdout, "m2" in first.stdout] == [1, 1, 0]
    second = cli(*args, "--count", "1", *consumer_settings(kafka_broker))
    assert second.returncode == 0, second.stderr
    assert "m2" in second.stdout
    assert "m0" not in second.stdout


def test_tail_against_a_broker_that_is_down_says_so_in_a_few_lines() -> None:
    """`logsdk tail` towards a port nobody listens on: exit 1 within its 10 s metadata
    wait, one line saying no broker answered, librdkafka's repeated connection failure said
    once with the count of its repeats (194 identical lines before)."""
    out = cli("tail", "-t", "app-logs", "-b", f"127.0.0.1:{free_port()}", timeout=30)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("logsdk: error: no Kafka broker at 127.0.0.1:"), lines
    assert len(lines) <= 6, lines
    assert sum("Connection refused" in ln for ln in lines) <= 2, lines
    assert any("more time(s)" in ln for ln in lines), lines


def test_tail_unknown_topic_fails_cleanly(kafka_broker: KafkaTarget) -> None:
    """A missing topic: exit 1, one line on stderr, no traceback."""
    out = cli("tail", "-t", "no-such-topic-xyz", "-b", kafka_broker.bootstrap_servers)
    assert out.returncode == 1
    assert "not found" in out.stderr
    assert "Traceback" not in out.stderr


def test_spool_status_export_replay(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """produce with Kafka unreachable leaves records in the spool (exit 1, says how to
    replay); status and export read it while a producer holds it; replay refuses a held
    spool and, once free, delivers everything and empties it."""
    topic = fresh_topic(2)
    spool = tmp_path / "spool"
    dead = f"127.0.0.1:{free_port()}"
    lines = "".join(json.dumps({"level": "WARNING", "message": f"r{i}"}) + "\n" for i in range(40))
    out = cli("produce", "-t", topic, "-b", dead, "--spool-dir", str(spool), "--timeout", "1",
              stdin=lines)  # fmt: skip
    assert out.returncode == 1
    assert "logsdk spool replay" in out.stderr
    assert "Traceback" not in out.stderr

    # A live producer holds the dir (Kafka still unreachable) and adds 10 more records.
    holder = LogProducer(dead, topic, spool, **FAST)
    try:
        for i in range(40, 50):
            holder.send({"level": "INFO", "message": f"r{i}"}, headers={"app": "cli-test"})
        wait_until(lambda: holder.stats()["spool_records"] == 50, 20, "50 records spooled")
        out = cli("spool", "status", str(spool), "--json")
        assert out.returncode == 0, out.stderr
        status = json.loads(out.stdout)
        assert status["records"] == 50
        assert status["topics"][topic]["records"] == 50
        assert status["bytes"] > 0
        assert status["oldest"] <= status["newest"]
        assert status["locked_by"] == {"pid": os.getpid(), "running": True}
        assert status["producer_id"] == holder.producer_id
        human = cli("spool", "status", str(spool))
        assert human.returncode == 0, human.stderr
        assert f"in use by pid {os.getpid()}" in human.stdout

        export = tmp_path / "pending.jsonl"
        out = cli("spool", "export", str(spool), "-o", str(export))
        assert out.returncode == 0, out.stderr
        docs = [json.loads(line) for line in export.read_text().splitlines()]
        seqs = [d["seq"] for d in docs]
        assert seqs[:40] == list(range(40))
        assert seqs == sorted(set(seqs))  # send order; a new producer run skips ahead
        assert json.loads(docs[45]["value"])["message"] == "r45"
        assert docs[45]["headers"] == [["app", "cli-test"]]
        assert {d["producer"] for d in docs} == {holder.producer_id}

        out = cli("spool", "replay", str(spool), "-b", kafka_broker.bootstrap_servers)
        assert out.returncode == 1
        assert "in use by another LogProducer" in out.stderr
        assert "Traceback" not in out.stderr
    finally:
        holder.close(timeout=0)  # Kafka is unreachable for it: the records stay spooled

    out = cli("spool", "replay", str(spool), "-b", kafka_broker.bootstrap_servers)
    assert out.returncode == 0, out.stderr
    assert "50/50 (100%)" in out.stderr
    assert "replayed 50 of 50" in out.stderr
    msgs = read_topic(kafka_broker.bootstrap_servers, topic)
    assert sorted(json.loads(m.value() or b"")["message"] for m in msgs) == sorted(
        f"r{i}" for i in range(50)
    )
    out = cli("spool", "status", str(spool), "--json")
    assert json.loads(out.stdout)["records"] == 0


def test_spool_status_of_a_missing_dir_fails_cleanly(tmp_path: Path) -> None:
    """Not a spool dir: exit 1 with the reason; --debug shows the traceback."""
    out = cli("spool", "status", str(tmp_path))
    assert out.returncode == 1
    assert "is not a spool dir" in out.stderr
    assert "Traceback" not in out.stderr
    out = cli("--debug", "spool", "status", str(tmp_path))
    assert out.returncode == 1
    assert "Traceback" in out.stderr


@pytest.mark.parametrize(
    "kind", ["embedded", pytest.param("apache", marks=pytest.mark.apache_kafka)]
)
def test_broker_command_serves_topics_and_stops_on_sigterm(kind: str, tmp_path: Path) -> None:
    """`logsdk broker [--kind apache] --topic NAME:N` prints a bootstrap address that serves
    the topic, and SIGTERM stops it with exit 0, leaving no broker process behind."""
    if kind == "embedded":
        try:
            tansu_binary()
        except Exception as exc:
            pytest.skip(f"no embedded broker here: {exc}")
    data = tmp_path / "data"
    extra = ["--kind", "apache", "--data-dir", str(data)] if kind == "apache" else []
    log = (tmp_path / "broker.err").open("w")
    try:
        with subprocess.Popen(
            [sys.executable, "-m", "logsdk.cli", "broker", *extra, "--topic", "cli-topic:2"],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=ROOT,
        ) as proc:
            try:
                assert proc.stdout is not None
                with selectors.DefaultSelector() as sel:
                    sel.register(proc.stdout, selectors.EVENT_READ)
                    assert sel.select(timeout=120), "no bootstrap address within 120 s"
                bootstrap = proc.stdout.readline().strip()
                assert bootstrap.startswith("127.0.0.1:")
                admin = AdminClient(rdkafka_config({"bootstrap.servers": bootstrap}))
                try:
                    md = admin.list_topics("cli-topic", timeout=10).topics["cli-topic"]
                finally:
                    del admin  # freed (no close() to call) before its broker goes
                assert len(md.partitions) == 2
                children = _children(proc.pid)
                assert children, "the broker runs in a child process"
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=60) == 0
                assert [pid for pid in children if Path(f"/proc/{pid}").exists()] == []
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    finally:
        log.close()
    if kind == "apache":  # kept where --data-dir said: the node's log and its data
        assert (data / "node-1" / "server.log").exists()


def _children(pid: int) -> list[int]:
    """The pids of ``pid``'s children (Linux /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_broker_command_refuses_options_of_the_other_kind() -> None:
    """Options of one broker kind given to the other are a usage error (exit 2), and
    --fetch-jars prints the jar cache directory of Apache Kafka."""
    out = cli("broker", "--nodes", "3")
    assert out.returncode == 2
    assert "--kind apache" in out.stderr
    out = cli("broker", "--kind", "apache", "--durable")
    assert out.returncode == 2
    assert "--durable" in out.stderr


@pytest.mark.apache_kafka
def test_broker_command_fetch_jars_prints_the_cache() -> None:
    """`logsdk broker --kind apache --fetch-jars` fills the jar cache (a no-op when full)
    and prints the directory holding Apache Kafka's jars."""
    out = cli("broker", "--kind", "apache", "--fetch-jars")
    assert out.returncode == 0, out.stderr
    jars = Path(out.stdout.strip())
    assert any(p.name.startswith("kafka_2.13-") for p in jars.glob("*.jar"))


def test_bench_runs_the_checkout_runner_or_says_why_not(tmp_path: Path) -> None:
    """bench lists the checkout's benchmarks, runs run_all.py with the arguments after --
    (exit status passed on), and without benchmarks fails with a clear message."""
    out = cli("bench", "--list")
    assert out.returncode == 0, out.stderr
    assert {"producer", "consumer"} <= set(out.stdout.split())

    fake = tmp_path / "benchmarks"
    fake.mkdir()
    (fake / "run_all.py").write_text(
        "import sys\nprint('ran', sys.argv[1:])\nsys.exit(0 if '--ok' in sys.argv else 3)\n"
    )
    out = cli("bench", "--dir", str(fake), "--", "--ok", "--records", "10")
    assert out.returncode == 0, out.stderr
    assert "ran ['--ok', '--records', '10']" in out.stdout
    assert cli("bench", "--dir", str(fake)).returncode == 1

    out = cli("bench", "--dir", str(tmp_path / "nowhere"))
    assert out.returncode == 1
    assert "no benchmarks found" in out.stderr
    assert "Traceback" not in out.stderr


def test_spool_commands_see_every_slot(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """One spool dir, three slots: 0 held by a live producer (Kafka unreachable for it),
    1 and 2 left by processes that are gone. status and export show all three; replay
    delivers the free slots under their own producer ids, names the held one, leaves it
    alone and exits 1 (records remain, held by a live producer)."""
    from logsdk.spool import Spool

    topic = fresh_topic(1)
    spool = tmp_path / "spool"
    dead = f"127.0.0.1:{free_port()}"
    holder = LogProducer(dead, topic, spool, **FAST)
    try:
        for i in range(5):
            holder.send(b"held-%d" % i)
        assert holder.flush_durable(10) == 0
        ids = {}
        for index, n in ((1, 7), (2, 3)):
            s = Spool(spool / "slots" / str(index)).open()
            ids[index] = s.producer_id
            s.append([(topic, None, b"left-%d-%d" % (index, i), None, 1, i) for i in range(n)])
            s.close()
        out = cli("spool", "status", str(spool), "--json")
        assert out.returncode == 0, out.stderr
        status = json.loads(out.stdout)
        assert status["records"] == 15
        assert [(sl["slot"], sl["records"]) for sl in status["slots"]] == [(0, 5), (1, 7), (2, 3)]
        assert status["slots"][0]["locked_by"]["running"] is True
        export = cli("spool", "export", str(spool))
        docs = [json.loads(line) for line in export.stdout.splitlines()]
        assert [d["slot"] for d in docs] == [0] * 5 + [1] * 7 + [2] * 3
        assert {d["producer"] for d in docs if d["slot"] == 1} == {ids[1]}
        replay = cli("spool", "replay", str(spool), "-b", kafka_broker.bootstrap_servers)
        assert replay.returncode == 1, replay.stderr
        assert "slot 0: 5 record(s) held by pid" in replay.stderr
        assert "replayed 10 of 10" in replay.stderr
        got = read_topic(kafka_broker.bootstrap_servers, topic)
        pairs = {(dict(m.headers() or [])["logsdk.producer"].decode(), m.value()) for m in got}
        assert len(got) == 10
        assert (ids[1], b"left-1-6") in pairs
        assert (ids[2], b"left-2-0") in pairs
    finally:
        holder.close(timeout=0)


REPLAYED = re.compile(
    r"replayed (\d+) of (\d+) record\(s\); (\d+) left in the spool, (\d+) rejected by Kafka"
)


def replay_totals(stderr: str) -> tuple[int, int, int, int]:
    """(replayed, found, left, rejected) from replay's summary line; they must add up."""
    (m,) = REPLAYED.findall(stderr)
    replayed, found, left, rejected = map(int, m)
    assert replayed + left + rejected == found, stderr
    return replayed, found, left, rejected


def test_spool_replay_counts_what_kafka_refused_as_rejected(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A free slot (not slot 0) with 10 records and one of 1.5 MB, more than Kafka takes:
    replay delivers the 10, counts the big one as rejected (for the slot and in total),
    and exits 3 (records refused); status shows it rejected."""
    from logsdk.spool import Spool

    topic = fresh_topic(1)
    spool = tmp_path / "spool"
    Spool(spool).open().close()  # slot 0: empty
    left = Spool(spool / "slots" / "1").open()
    rows = [(topic, None, b"r%d" % i, None, 1, i) for i in range(10)]
    rows.insert(5, (topic, None, b"x" * 1_500_000, None, 1, 10))
    left.append(rows)
    left.close()

    replay = cli("spool", "replay", str(spool), "-b", kafka_broker.bootstrap_servers)
    assert replay.returncode == 3, replay.stderr
    assert "Traceback" not in replay.stderr
    assert replay_totals(replay.stderr) == (10, 11, 0, 1)
    assert "slot 1: replayed 10 of 11 record(s); 0 left, 1 rejected by Kafka" in replay.stderr
    assert "not delivered within" not in replay.stderr
    msgs = read_topic(kafka_broker.bootstrap_servers, topic)
    assert sorted(m.value() or b"" for m in msgs) == sorted(b"r%d" % i for i in range(10))
    status = json.loads(cli("spool", "status", str(spool), "--json").stdout)
    assert (status["records"], status["rejected"]) == (0, 1)


def test_spool_replay_beside_a_live_producer_counts_the_free_slots_alone(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Slot 0 held by a live producer that keeps spooling (Kafka unreachable for it) while
    replay runs; slot 1 free with 20 records. replay delivers the 20 and says so, its
    numbers adding up; slot 0 is named as live and counted in none of them; exit 1
    (records held by a live producer)."""
    from logsdk.spool import Spool

    topic = fresh_topic(1)
    spool = tmp_path / "spool"
    holder = LogProducer(f"127.0.0.1:{free_port()}", topic, spool, **FAST)
    stop = threading.Event()

    def keep_spooling() -> None:
        i = 0
        while not stop.is_set():
            holder.send(b"live-%d" % i)
            holder.flush_durable(5)
            i += 1

    sender = threading.Thread(target=keep_spooling, name="keep-spooling")
    try:
        assert holder.stats()["slot"] == 0
        free = Spool(spool / "slots" / "1").open()
        free.append([(topic, None, b"free-%d" % i, None, 1, i) for i in range(20)])
        free.close()
        sender.start()
        wait_until(lambda: holder.stats()["spool_records"] > 0, 20, "the live slot spooling")
        replay = cli("spool", "replay", str(spool), "-b", kafka_broker.bootstrap_servers)
        assert holder.stats()["spool_records"] > 0
    finally:
        stop.set()
        if sender.is_alive():
            sender.join()
        holder.close(timeout=0)
    assert replay.returncode == 1, replay.stderr
    assert replay_totals(replay.stderr) == (20, 20, 0, 0)
    assert re.search(r"slot 0: \d+ record\(s\) held by pid", replay.stderr), replay.stderr
    assert "not delivered within" not in replay.stderr
    msgs = read_topic(kafka_broker.bootstrap_servers, topic)
    assert sorted(m.value() or b"" for m in msgs) == sorted(b"free-%d" % i for i in range(20))


def test_spool_commands_on_a_path_with_uri_characters(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """status, export, check and replay work on a spool dir whose path holds a space, '#',
    '?', '%' and 'é'; the read-only ones leave no file behind in the slots they read."""
    from logsdk.spool import Spool

    topic = fresh_topic(1)
    root = tmp_path / "spool dir #1?mode=rw&x=%41 é"
    for path, n in ((root, 3), (root / "slots" / "1", 4)):
        s = Spool(path).open()
        s.reserve_seq(n)  # as a producer does before it uses a seq (check looks)
        s.append([(topic, None, b"%s-%d" % (path.name.encode(), i), None, 1, i) for i in range(n)])
        s.close()
    files = {p.relative_to(root) for p in root.rglob("*")}

    out = cli("spool", "status", str(root), "--json")
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert (status["dir"], status["records"]) == (str(root), 7)
    assert [sl["records"] for sl in status["slots"]] == [3, 4]
    assert cli("spool", "status", str(root)).returncode == 0
    out = cli("spool", "export", str(root))
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["slot"] for line in out.stdout.splitlines()] == [0] * 3 + [1] * 4
    out = cli("spool", "check", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 slot(s) checked, 0 problem(s)" in out.stdout
    assert {p.relative_to(root) for p in root.rglob("*")} == files  # no -wal/-shm made
    assert list(tmp_path.iterdir()) == [root]

    out = cli("spool", "replay", str(root), "-b", kafka_broker.bootstrap_servers)
    assert out.returncode == 0, out.stderr
    assert replay_totals(out.stderr) == (7, 7, 0, 0)
    assert len(read_topic(kafka_broker.bootstrap_servers, topic)) == 7
    assert json.loads(cli("spool", "status", str(root), "--json").stdout)["records"] == 0


def test_produce_says_which_acknowledgements_were_an_earlier_runs(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    """An earlier run left 5 records in the spool: produce sends 3 lines, delivers all 8,
    and its summary says that 5 of the acknowledged were the earlier run's."""
    from logsdk.spool import Spool

    topic = fresh_topic(1)
    spool = tmp_path / "spool"
    left = Spool(spool).open()  # slot 0 is the spool dir itself
    left.reserve_seq(5)
    left.append([(topic, None, b"left-%d" % i, None, 1, i) for i in range(5)])
    left.close()
    out = cli("produce", "-t", topic, "-b", kafka_broker.bootstrap_servers, "--spool-dir",
              str(spool), stdin="a\nb\nc\n")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        f"sent 3 record(s) to {topic}: acknowledged 8 (with 5 left in the spool by an "
        "earlier run), in spool 0" in out.stderr
    )
    assert len(read_topic(kafka_broker.bootstrap_servers, topic)) == 8


def test_produce_counts_what_it_leaves_in_every_slot_it_held(tmp_path: Path) -> None:
    """Kafka unreachable, and a process that is gone left 5 records in slot 1 of the spool
    dir: produce takes slot 0 and leaves slot 1 alone (no drain while Kafka does not
    answer), so it says it leaves its 3 records in the spool (counted in the slots it held,
    not in stats()), and prints a replay command a shell runs as shown (the path, with a
    space and a '#', quoted), which delivers slot 1 too."""
    from logsdk.spool import Spool

    spool = tmp_path / "spool dir #1"
    left = Spool(spool / "slots" / "1").open()
    left.reserve_seq(5)
    left.append([("t", None, b"left-%d" % i, None, 1, i) for i in range(5)])
    left.close()
    out = cli("produce", "-t", "t", "-b", f"127.0.0.1:{free_port()}", "--spool-dir", str(spool),
              "--timeout", "1", stdin="a\nb\nc\n")  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "sent 3 record(s)" in out.stderr
    assert f"3 record(s) not delivered within 1s are kept in {spool}" in out.stderr
    command = out.stderr.split("deliver them with: ", 1)[1].splitlines()[0]
    assert shlex.split(command) == ["logsdk", "spool", "replay", str(spool), "-b", "BOOTSTRAP"]
    status = json.loads(cli("spool", "status", str(spool), "--json").stdout)
    assert [(sl["slot"], sl["records"]) for sl in status["slots"]] == [(0, 3), (1, 5)]


@pytest.mark.slow
def test_spool_replay_reports_apart_a_slot_let_go_during_it(
    kafka_broker: KafkaTarget,
    fresh_topic: Callable[..., str],
    spawn: Callable[..., subprocess.Popen[str]],
    tmp_path: Path,
) -> None:
    """Slot 0 is held by a live producer (Kafka unreachable for it, 10 records) when replay
    starts on slot 1's 300 records (at 20/s); that producer closes meanwhile. The replay's
    producer, which looks at the free slots every 10 s, delivers slot 0 too: replay says so
    apart and counts slot 1's records alone; exit 1 (a slot was held at the start)."""
    from logsdk.spool import Spool

    topic = fresh_topic(1)
    spool = tmp_path / "spool"
    holder = LogProducer(f"127.0.0.1:{free_port()}", topic, spool, **FAST)
    try:
        for i in range(10):
            holder.send(b"held-%d" % i)
        assert holder.flush_durable(10) == 0
        free = Spool(spool / "slots" / "1").open()
        free.reserve_seq(300)
        free.append([(topic, None, b"free-%d" % i, None, 1, i) for i in range(300)])
        free.close()
        replay = spawn(
            [sys.executable, "-m", "logsdk.cli", "spool", "replay", str(spool),
             "-b", kafka_broker.bootstrap_servers, "--rate", "20", "--timeout", "120"],
            stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        assert replay.stderr is not None
        seen = []
        while not (seen and seen[-1].startswith("[")):  # its first progress line
            line = replay.stderr.readline()
            assert line, "".join(seen)
            seen.append(line)
    finally:
        holder.close(timeout=0)  # Kafka is unreachable for it: its records stay in slot 0
    stderr = "".join(seen) + replay.communicate(timeout=150)[1]
    assert replay.returncode == 1, stderr
    assert f"slot 0: 10 record(s) held by pid {os.getpid()}" in stderr
    assert "slot 1: replayed 300 of 300 record(s); 0 left, 0 rejected by Kafka" in stderr
    assert (
        f"slot 0: pid {os.getpid()} let go of it during the replay, which delivered from it "
        "too (not counted here): 0 record(s) left, 0 rejected by Kafka"
    ) in stderr
    assert replay_totals(stderr) == (300, 300, 0, 0)
    assert len(read_topic(kafka_broker.bootstrap_servers, topic)) == 310
