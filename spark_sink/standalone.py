"""A Spark standalone cluster on this machine, for tests and benchmarks.

One master and N workers, each a JVM started from pyspark's own distribution
(``bin/spark-class`` with the standalone ``Master`` and ``Worker`` classes), each worker
with its own work directory, cores and memory cap, so that they act as separate hosts:
their executors are other JVMs with other Python workers than the driver's. Stopped by
pid (each daemon in a process group of its own, killed by the kernel if the process
that started it dies first; a worker's executors go with it).

    with StandaloneCluster(workdir, workers=2) as cluster:
        spark = cluster.session("my-app")      # or: spark-submit --master cluster.master_url

Executors run ``python`` as ``spark.pyspark.python`` (this interpreter by default) and
get ``executor_env`` (for instance credentials for a staging bucket) in their environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logsdk.testing._processes import free_port, spawn_logged
from spark_sink._session import _LOG4J2

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

#: Daemons, executors and the driver log errors only (as local sessions), and the
#: scheduler's lost tasks (a test reads them to know a kill landed mid-batch).
LOG4J2 = (
    _LOG4J2
    + """\
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = warn
"""
)


def spark_home() -> Path:
    """pyspark's distribution (its ``bin/spark-class``, ``bin/spark-submit``, jars)."""
    import pyspark

    return Path(pyspark.__file__).parent


class StandaloneCluster:
    """A master and ``workers`` workers on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        python: str = sys.executable,
        executor_env: dict[str, str] | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        self.workdir = Path(workdir).absolute()
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.python = python
        self.executor_env = dict(executor_env or {})
        self.start_timeout = start_timeout
        self.port = free_port()
        self.ui_port = free_port()
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []
        self.log4j = self.workdir / "log4j2.properties"

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment of the daemons, and of a ``spark-submit`` against this cluster."""
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.workdir / "logs"),
            SPARK_DAEMON_JAVA_OPTS=f"-Dlog4j2.configurationFile={self.log4j.as_uri()}",
            PYSPARK_PYTHON=self.python,
            PYSPARK_DRIVER_PYTHON=self.python,
        )
        return env

    def conf(self) -> dict[str, str]:
        """Settings an application needs on this cluster (as ``--conf`` or builder config)."""
        conf = {
            "spark.master": self.master_url,
            "spark.pyspark.python": self.python,
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": "512m",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(self.workers * self.cores),
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={self.log4j.as_uri()}",
            "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile={self.log4j.as_uri()}",
        }
        for key, value in self.executor_env.items():
            conf[f"spark.executorEnv.{key}"] = value
        return conf

    def submit_args(self) -> list[str]:
        """``spark-submit`` and its ``--master``/``--conf`` arguments for this cluster."""
        args = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url]
        for key, value in self.conf().items():
            if key != "spark.master":
                args += ["--conf", f"{key}={value}"]
        return args

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / "logs" / f"{name}.out", "ab")  # noqa: SIM115 - the child's
        cmd, env = [str(spark_home() / "bin" / "spark-class"), *args], self.env()
        try:
            return spawn_logged(cmd, env, log)  # as the embedded broker's children
        finally:
            log.close()

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; returns once every worker registered."""
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.log4j.write_text(LOG4J2)
        try:
            self._master = self._spawn(
                "master",
                [
                    MASTER_CLASS,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.ui_port),
                ],
            )
            self._wait(lambda s: s is not None, "the master's status page")
            for i in range(self.workers):
                work = self.workdir / f"worker-{i}"
                work.mkdir(exist_ok=True)
                self._workers.append(
                    self._spawn(
                        f"worker-{i}",
                        [
                            WORKER_CLASS,
                            "--host",
                            "127.0.0.1",
                            "--webui-port",
                            str(free_port()),
                            "--cores",
                            str(self.cores),
                            "--memory",
                            self.memory,
                            "--work-dir",
                            str(work),
                            self.master_url,
                        ],
                    )
                )
            self._wait(
                lambda s: s is not None and s.get("aliveworkers") == self.workers,
                f"{self.workers} workers to register",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def status(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), or None if it does not answer."""
        try:
            url = f"http://127.0.0.1:{self.ui_port}/json/"
            with urllib.request.urlopen(url, timeout=2) as resp:
                status: dict[str, Any] = json.load(resp)
                return status
        except (OSError, ValueError):
            return None

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not ready(self.status()):
            for proc in [self._master, *self._workers]:
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(
                        f"a Spark daemon exited ({proc.returncode}) while waiting for {what}; "
                        f"logs in {self.workdir / 'logs'}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {self.start_timeout}s")
            time.sleep(0.2)

    def executor_pids(self) -> list[int]:
        """The pids of the executor JVMs the workers run now (children of the workers)."""
        pids = []
        for worker in self._workers:
            for child in _children(worker.pid):
                if EXECUTOR_CLASS in _cmdline(child):
                    pids.append(child)
        return pids

    def busy_executor(self, window: float = 0.5) -> int | None:
        """The pid of the executor that used the most CPU over ``window`` seconds, with
        its Python workers, if that is over a third of a core (it runs a task); else None."""

        def ticks(pid: int) -> int:
            total = 0
            for p in [pid, *_descendants(pid)]:
                try:
                    fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                total += int(fields[11]) + int(fields[12])  # utime + stime
            return total

        pids = self.executor_pids()
        before = {p: ticks(p) for p in pids}
        time.sleep(window)
        used = {p: ticks(p) - before[p] for p in pids}
        if not used:
            return None
        pid = max(used, key=lambda p: used[p])
        hz = os.sysconf("SC_CLK_TCK")
        return pid if used[pid] > window * hz / 3 else None

    def executors_launched(self) -> int:
        """How many executors the workers have launched so far (their work directories)."""
        return sum(
            1
            for i in range(len(self._workers))
            for app in (self.workdir / f"worker-{i}").glob("app-*")
            for d in app.iterdir()
            if d.is_dir()
        )

    def session(self, app_name: str = "logsdk", **conf: str) -> SparkSession:
        """A SparkSession on this cluster with spark_sink registered (driver in this process)."""
        from spark_sink import local_session

        os.environ.update({k: v for k, v in self.env().items() if k.startswith("PYSPARK_")})
        settings = {**self.conf(), **conf}
        master = settings.pop("spark.master")
        return local_session(app_name, master=master, **settings)

    def stop(self) -> None:
        """Kill the workers (with their executors) and the master, by pid."""
        for proc in [*self._workers, self._master]:
            if proc is None or proc.poll() is not None:
                continue
            for pid in [*_descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(30)
        self._workers = []
        self._master = None

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (each thread's: a JVM forks from whichever thread asks)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _descendants(pid: int) -> list[int]:
    out = []
    for child in _children(pid):
        out += [*_descendants(child), child]
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
