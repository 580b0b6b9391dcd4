"""spark_sink.local_session: a quiet session, wherever the temp dir is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.conftest import spark_missing

pytestmark = pytest.mark.spark

_COUNT = """
from spark_sink import local_session
spark = local_session("logsdk-tmpdir")
print(spark.range(3).count())
spark.stop()
"""


def test_a_temp_dir_with_uri_characters_starts_a_quiet_session(tmp_path: Path) -> None:
    """TMPDIR holds a space, '#', '%' and 'é', where local_session writes its log4j
    settings: the session starts (a space split the driver's Java options: "Could not
    find or load main class") and reads them (a '#' cut the path: Spark's default,
    chatty, log settings)."""
    reason = spark_missing()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path / "tmp dir #1 %41 é"
    tmp.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", _COUNT],
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3"]
    assert (tmp / "logsdk-spark-log4j2.properties").is_file()
    assert "default log4j profile" not in out.stderr, out.stderr
    assert "Reconfiguration failed" not in out.stderr, out.stderr
