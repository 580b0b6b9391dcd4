"""Spark's connector jars are for the Spark and Hadoop the tests run, checked without a JVM."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from logsdk.errors import ConfigError
from logsdk.testing import _spark
from logsdk.testing._spark import HADOOP_VERSION, SPARK_VERSION

REPO = Path(__file__).resolve().parents[2]


def test_the_makefile_installs_the_pyspark_the_connector_pom_names() -> None:
    """make test's venv gets pyspark at the version of spark-sql-kafka in the pom, and
    installs it (a pin nothing uses would let the two drift)."""
    text = (REPO / "Makefile").read_text()
    pin = re.search(r"^PYSPARK := (\S+)$", text, re.MULTILINE)
    assert pin is not None, "the Makefile lost its PYSPARK pin"
    assert pin.group(1) == SPARK_VERSION
    assert "'pyspark==$(PYSPARK)'" in text
    assert "$(PY) -m logsdk.testing._spark" in text  # make jars fills the cache


def test_installed_pyspark_and_its_hadoop_match_the_poms() -> None:
    """The pyspark installed here is the pom's Spark, and bundles the pom's Hadoop client."""
    pytest.importorskip("pyspark")
    spark, hadoop = _spark.pyspark_versions()
    assert (spark, hadoop) == (SPARK_VERSION, HADOOP_VERSION)


def test_another_pyspark_is_refused_before_a_jvm_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pyspark of another release fails with the version to install, as does a Hadoop
    client that hadoop-aws does not match."""
    monkeypatch.setattr(_spark, "pyspark_versions", lambda: ("4.3.0", HADOOP_VERSION))
    with pytest.raises(ConfigError, match=rf"Install pyspark=={re.escape(SPARK_VERSION)}"):
        _spark.spark_jars()
    monkeypatch.setattr(_spark, "pyspark_versions", lambda: (SPARK_VERSION, "3.4.1"))
    with pytest.raises(ConfigError, match=r"hadoop-aws here is .* Hadoop client 3\.4\.1"):
        _spark.spark_jars(kafka=False, s3a=True)
