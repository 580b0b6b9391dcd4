"""Spark on a standalone cluster: a master and two workers (one core each, their own work
directories), the driver in its own process started by the docs' ``spark-submit`` line,
executors in other JVMs and Python workers, the staging area and the checkpoints on an S3
server (checkpoints through hadoop-aws's ``s3a://``), reading Apache Kafka with
logsdk-kafka and with Spark's own Kafka source (its jars and hadoop-aws's from the jar
cache as ``local:`` files where the docs' line has ``--packages``)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from logsdk import LogProducer
from logsdk.testing import ApacheKafka, create_topic, read_topic
from logsdk.testing._spark import HADOOP_VERSION, SPARK_VERSION, spark_jars_conf
from spark_sink._staging import Staging
from spark_sink.standalone import StandaloneCluster
from tests.conftest import FAST, wait_until
from tests.spark.conftest import S3Server, spark_missing
from tests.spark.helpers import assert_exactly, next_batch, stored_rows

pytestmark = [
    pytest.mark.spark,
    pytest.mark.spark_cluster,
    pytest.mark.integration,
    pytest.mark.apache_kafka,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "spark.md"
RECORDS = 100_000
#: Records a batch: eight batches a query, the driver killed after the third.
BATCH = 12_500
PARTITIONS = 4


def docs_submit_line() -> list[str]:
    """The ``spark-submit`` line of docs/spark.md ("Running on a cluster"), as words."""
    text = DOCS.read_text()
    block = re.search(r"<!-- cluster-submit -->\n```bash\n(.*?)```", text, re.DOTALL)
    assert block, "docs/spark.md lost its cluster-submit block"
    return shlex.split(block.group(1).replace("\\\n", " "))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Iterator[Any]:
    """Two workers, one core and 1 GiB each; executors get the S3 credentials in their
    environment (the usual chain), as an instance role or a secret would give them."""
    reason = spark_missing()
    if reason:
        pytest.skip(reason)
    with StandaloneCluster(
        tmp_path_factory.mktemp("cluster"),
        workers=2,
        cores=1,
        memory="1g",
        executor_env=s3_server.env,
    ) as c:
        yield c


class Job:
    """The docs' job, submitted to the cluster: its words, and its driver process."""

    def __init__(self, cluster: StandaloneCluster, words: list[str], log: Path) -> None:
        self.cluster, self.words, self.log = cluster, words, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        env = {**self.cluster.env(), "PYTHONPATH": str(REPO)}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [*self.words, *extra],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the driver's JVM and Python workers die with it
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(60)

    def run(self, *extra: str, timeout: float) -> None:
        self.start(*extra)
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout)
        finally:
            self.kill()
        assert rc == 0, f"the job exited with {rc}: {self.tail()}"

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


PACKAGES = (
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION},"
    f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}"
)


def s3a_settings(s3: S3Server) -> list[str]:
    """hadoop-aws's settings for the S3 server: its endpoint, path-style addressing (no
    bucket host names on 127.0.0.1), its region. Credentials: the environment's (the
    driver's, and the executors' through spark.executorEnv)."""
    conf = {
        "spark.hadoop.fs.s3a.endpoint": s3.endpoint,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
    }
    return [w for k, v in conf.items() for w in ("--conf", f"{k}={v}")]


def submit_words(
    cluster: StandaloneCluster,
    s3: S3Server,
    bootstrap: str,
    topic: str,
    tmp: Path,
) -> list[str]:
    """The docs' line with this cluster, broker, bucket and paths in place of the
    placeholders, and the jars from the cache in place of ``--packages``; the cluster's
    own settings (log levels, addresses, the executors' environment) and the S3 server's
    after ``spark-submit``; its endpoint as a staging option."""
    words = docs_submit_line()
    swap = {
        "spark://spark-master:7077": cluster.master_url,
        "spark.pyspark.python=/opt/logsdk-venv/bin/python": (
            f"spark.pyspark.python={sys.executable}"
        ),
        "kafka-1:9092": bootstrap,
        "app-logs": topic,
        "s3a://logsdk-checkpoints/app-logs": checkpoint_uri(s3, tmp),
        "s3://logsdk-staging/app-logs": s3.uri(f"cluster-{tmp.name}"),
        "/var/lib/logsdk/app-logs.db": str(tmp / "sink.db"),
        # Maven fetched them into the cache before the tests: Ivy downloads nothing here.
        "--packages": "--conf",
        PACKAGES: "spark.jars=" + spark_jars_conf(kafka=True, s3a=True)["spark.jars"],
    }
    for old, new in swap.items():
        assert old in words, f"{old!r} is no longer in the docs' line"
        words[words.index(old)] = new
    assert words[0] == "spark-submit"
    own = cluster.submit_args()[1:]  # --master URL --conf ...: the master is the docs'
    words = [cluster.submit_args()[0], *own[2:], *s3a_settings(s3), *words[1:]]
    return [
        *words,
        "--staging-option",
        f"endpoint_override={s3.endpoint}",
        "--staging-option",
        "region=us-east-1",
    ]


def checkpoint_uri(s3: S3Server, tmp: Path) -> str:
    return f"s3a://{s3.bucket}/ckpt-{tmp.name}"


def produce_with_outage(broker: ApacheKafka, topic: str, spool: Path) -> str:
    """RECORDS records through a LogProducer, the network cut in the middle; returns its id."""
    p = LogProducer(broker.bootstrap_servers, topic, spool, **FAST)
    try:
        for i in range(RECORDS):
            p.send(b"%d" % i, key=b"%d" % (i % 64))
            if i == RECORDS // 2:
                broker.cut()
                wait_until(lambda: p.stats()["state"] == "DEGRADED", 30, "degraded by the cut")
            if i == RECORDS // 2 + RECORDS // 10:
                broker.heal()
        assert p.flush(180) == 0
    finally:
        p.close(10)
    return p.producer_id


def end_offsets(bootstrap: str, topic: str) -> dict[tuple[str, int], int]:
    """Each partition's end, from its records read (every offset below it is a record)."""
    ends = dict.fromkeys(((topic, p) for p in range(PARTITIONS)), 0)
    for m in read_topic(bootstrap, topic, timeout=180):
        key = (topic, m.partition() or 0)
        ends[key] = max(ends[key], (m.offset() or 0) + 1)
    return ends


def kill_an_executor_mid_task(cluster: StandaloneCluster, job: Job, tries: int = 5) -> None:
    """SIGKILL an executor busy with a task (by its CPU, Python workers included) until
    the driver logs a task lost with it: a kill between two tasks loses none, and Spark
    just starts another executor."""
    for _ in range(tries):
        deadline = time.monotonic() + 60
        pid = None
        while pid is None and time.monotonic() < deadline and job.alive():
            pid = cluster.busy_executor()
        assert job.alive(), job.tail()
        assert pid is not None, "no executor ran a task for 60 s"
        lost = job.log.read_text(errors="replace").count("Lost executor")
        os.kill(pid, signal.SIGKILL)
        # The driver says "Lost executor" at once, and "Lost task" with it when a task ran
        # there: a try that hit an idle executor ends in seconds, not after a long wait
        # while the queries' work runs out (seen: two idle hits of 30 s each, then none).
        wait_until(
            lambda lost=lost: job.log.read_text(errors="replace").count("Lost executor") > lost,
            30,
            "the driver to see the executor lost",
        )
        try:
            wait_until(lambda: "Lost task" in job.log.read_text(errors="replace"), 5, "a lost task")
            return
        except AssertionError:
            continue
    raise AssertionError(f"{tries} executors killed, none while it ran a task: {job.tail()}")


def seqs_in(db: Path, producer: str) -> set[int]:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT producer, seq FROM records").fetchall()
    finally:
        conn.close()
    assert {p for p, _ in rows} == {producer}
    return {s for _, s in rows}


def test_executor_and_driver_killed_mid_batch_every_record_stored_once(
    cluster: StandaloneCluster,
    s3_server: S3Server,
    apache_cluster_factory: Any,
    spark: Any,
    tmp_path: Path,
) -> None:
    """100,000 records on Apache Kafka (a network cut while they were sent) read on the
    cluster by logsdk-kafka, written three ways at once (logsdk-sink staged on S3,
    foreachBatch, parquet), and by Spark's own Kafka source into logsdk-sink; every
    checkpoint on S3 (s3a://). One executor SIGKILLed while tasks ran (Spark reran them),
    then the driver SIGKILLed while a batch was staged; the same line again with
    --available-now, each query resumed from its checkpoint on S3: every Kafka record
    stored once by each sink, every record LogProducer accepted among them, the staging
    area empty."""
    broker = apache_cluster_factory(1, proxy=True)
    topic = create_topic(broker.bootstrap_servers, "cluster-logs", PARTITIONS)
    producer = produce_with_outage(broker, topic, tmp_path / "spool")
    ends = end_offsets(broker.bootstrap_servers, topic)
    assert sum(ends.values()) >= RECORDS

    words = submit_words(cluster, s3_server, broker.bootstrap_servers, topic, tmp_path)
    sinks = ["--sink", "sink", "--sink", "foreach", "--sink", "parquet", "--sink", "kafka:sink"]
    more = [*sinks, "--parquet", str(tmp_path / "parquet"), "--max-offsets", str(BATCH)]
    job = Job(cluster, words, tmp_path / "driver.log")
    db = tmp_path / "sink.db"
    spark_db = Path(str(db) + ".kafka")  # Spark's source -> logsdk-sink
    staging = Staging.parse(s3_server.uri(f"cluster-{tmp_path.name}"), s3_server.options)
    checkpoints = Staging.parse(checkpoint_uri(s3_server, tmp_path), s3_server.options)
    launched = cluster.executors_launched()
    job.start(*more)
    try:
        wait_until(
            lambda: (
                (
                    next_batch(db, "cluster-sink") >= 1
                    and next_batch(spark_db, "cluster-sink-kafka") >= 1
                )
                or not job.alive()
            ),
            300,
            "a batch of each logsdk-sink query",
        )
        assert job.alive(), job.tail()
        assert len(cluster.executor_pids()) == 2, cluster.executor_pids()
        kill_an_executor_mid_task(cluster, job)
        wait_until(
            lambda: (staging.listing() and next_batch(db, "cluster-sink") >= 3) or not job.alive(),
            300,
            "a batch staged after the executor was replaced",
        )
        assert job.alive(), job.tail()
        job.kill()
    finally:
        job.kill()
    applied = len(stored_rows(db))
    assert 0 < applied < sum(ends.values()), f"driver kill was not mid-run: {applied}"
    applied = len(stored_rows(spark_db))
    assert 0 < applied < sum(ends.values()), f"driver kill was not mid-run (kafka): {applied}"
    assert cluster.executors_launched() >= launched + 3  # 2, then one at least replaced
    saved = {p.split("/")[0] for p in checkpoints.listing() if p.endswith("metadata")}
    assert saved == {"sink", "foreach", "parquet", "kafka-sink"}, saved

    job.run(*more, "--available-now", timeout=600)
    assert_exactly(stored_rows(db), ends)
    assert seqs_in(db, producer) == set(range(RECORDS))
    assert_exactly(stored_rows(spark_db), ends)
    assert seqs_in(spark_db, producer) == set(range(RECORDS))
    foreach = Path(str(db) + ".foreach")
    assert_exactly(stored_rows(foreach), ends)
    assert staging.listing() == []
    parquet = spark.read.parquet(str(tmp_path / "parquet"))
    rows = sorted((r.partition, r.offset) for r in parquet.select("partition", "offset").collect())
    assert rows == sorted((p, o) for (_, p), n in ends.items() for o in range(n))
    log = job.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
