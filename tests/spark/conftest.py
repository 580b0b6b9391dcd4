"""Fixtures for the spark_sink tests: one quiet local SparkSession for the session."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
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
    """A local[2,2] SparkSession with spark_sink registered (a failed task is retried once)."""
    reason = spark_missing()
    if reason:
        pytest.skip(reason)
    # Python workers import test helpers (handlers unpickled on the driver's worker).
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from spark_sink import local_session

    session = local_session("logsdk-tests")
    try:
        yield session
    finally:
        session.stop()
