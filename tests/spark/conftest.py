"""Fixtures for the spark_sink tests: one quiet local SparkSession for the session."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def spark_missing() -> str | None:
    """Why Spark tests cannot run here, or None when pyspark, pyarrow and Java are present."""
    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: pip install -e '.[spark]'"
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and Path(java_home, "bin/java").exists()):
        return "Java is not installed (pyspark 4 needs a JVM 17+)"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2,2] SparkSession with spark_sink registered (a failed task is retried once)
    and Spark's own Kafka source (``format("kafka")``, its jars from the cache that
    ``make jars`` fills; Maven fetches them on first use)."""
    reason = spark_missing()
    if reason:
        pytest.skip(reason)
    # Python workers import test helpers (handlers unpickled on the driver's worker).
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from logsdk.testing._spark import spark_jars_conf
    from spark_sink import local_session

    session = local_session("logsdk-tests", **spark_jars_conf(kafka=True))
    try:
        yield session
    finally:
        session.stop()


@dataclass(frozen=True)
class S3Server:
    """A real S3 API server (moto's, in a child process) with one bucket."""

    endpoint: str
    bucket: str
    #: What a client needs in its environment (the usual AWS chain).
    env: dict[str, str]

    def uri(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    @property
    def options(self) -> dict[str, str]:
        """The sink options that point a staging URI at this server (no credentials)."""
        return {"staging.endpoint_override": self.endpoint, "staging.region": "us-east-1"}


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "logsdk-test",
    "AWS_SECRET_ACCESS_KEY": "logsdk-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server on a free port, a bucket ``staging``; credentials in os.environ
    (the driver's chain; Spark executors started after this inherit them)."""
    from logsdk.testing._processes import free_port, start_s3_server

    port = free_port()
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    server = start_s3_server(port, "staging", {**os.environ, **S3_ENV}, log, 60.0)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        saved = {k: os.environ.get(k) for k in S3_ENV}
        os.environ.update(S3_ENV)
        try:
            yield S3Server(endpoint, "staging", dict(S3_ENV))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    finally:
        server.kill()
