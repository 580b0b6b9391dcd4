"""Spark's own connectors for the Spark tests and benchmarks, from Maven Central.

Two poms shipped in the package name them: ``spark_kafka/pom.xml``, Spark's Kafka source
(``spark-sql-kafka-0-10_2.13``, at the version of the pyspark installed) and
``hadoop_aws/pom.xml``, Hadoop's ``s3a://`` filesystem (``hadoop-aws`` at the version of
the Hadoop client pyspark bundles, with its AWS SDK bundle). Maven fetches each once
into logsdk's jar cache (`logsdk.testing._jars.maven_jars()`); Spark gets the files
as ``local:`` URIs in ``spark.jars`` (`spark_jars_conf()`), never through its own Ivy
(``spark.jars.packages``), so nothing is downloaded while a test runs, and no executor
copies a jar (``local:`` names a file every process of the machine already has).

A connector is built against one Spark release: a pyspark whose version differs from the
pom's fails here, before a JVM starts, with what to install
([`ConfigError`][logsdk.errors.ConfigError]).

    python -m logsdk.testing._spark      # fill the cache (make jars); prints the dirs
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from logsdk.errors import ConfigError
from logsdk.testing._jars import jar_dir, maven_jars

KAFKA_POM = Path(__file__).parent / "spark_kafka" / "pom.xml"
S3A_POM = Path(__file__).parent / "hadoop_aws" / "pom.xml"
_MAVEN = "{http://maven.apache.org/POM/4.0.0}"


def pom_property(pom: Path, name: str) -> str:
    """The value of ``<properties><name>`` in ``pom``."""
    found = ET.parse(pom).getroot().find(f"{_MAVEN}properties/{_MAVEN}{name}")
    if found is None or not (found.text or "").strip():
        raise ConfigError(f"{pom} has no property {name}")
    return (found.text or "").strip()


#: The Spark release whose Kafka connector the tests use (pyspark must be this version).
SPARK_VERSION = pom_property(KAFKA_POM, "spark.version")
#: The Hadoop release of hadoop-aws (pyspark's bundled Hadoop client must be this one).
HADOOP_VERSION = pom_property(S3A_POM, "hadoop.version")


def pyspark_versions() -> tuple[str, str | None]:
    """(pyspark's version, the version of the Hadoop client in its jars, or None)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    hadoop = sorted(jars.glob("hadoop-client-api-*.jar"))
    found = hadoop[0].name[len("hadoop-client-api-") : -len(".jar")] if hadoop else None
    return pyspark.__version__, found


def _check_pyspark(*, s3a: bool) -> None:
    spark, hadoop = pyspark_versions()
    if spark != SPARK_VERSION:
        raise ConfigError(
            f"Spark's Kafka connector here is spark-sql-kafka-0-10_2.13 {SPARK_VERSION} "
            f"({KAFKA_POM}) and the installed pyspark is {spark}: a connector runs only on "
            f"the Spark release it was built for. Install pyspark=={SPARK_VERSION} (make "
            "test's venv does), or change spark.version in the pom to a release Maven "
            "Central serves the connector for"
        )
    if s3a and hadoop != HADOOP_VERSION:
        raise ConfigError(
            f"hadoop-aws here is {HADOOP_VERSION} ({S3A_POM}) and pyspark {spark} bundles "
            f"the Hadoop client {hadoop}: they must match; change hadoop.version in the pom"
        )


def spark_kafka_jars() -> list[Path]:
    """Spark's Kafka source and its dependencies (fetched by Maven on first use)."""
    return maven_jars(KAFKA_POM, f"spark-kafka-{SPARK_VERSION}")


def hadoop_aws_jars() -> list[Path]:
    """hadoop-aws and the AWS SDK bundle (fetched by Maven on first use)."""
    return maven_jars(S3A_POM, f"hadoop-aws-{HADOOP_VERSION}")


def spark_jars(*, kafka: bool = True, s3a: bool = False) -> list[Path]:
    """The jars of the connectors asked for, after checking pyspark's versions."""
    _check_pyspark(s3a=s3a)
    return [*(spark_kafka_jars() if kafka else []), *(hadoop_aws_jars() if s3a else [])]


def spark_jars_conf(*, kafka: bool = True, s3a: bool = False) -> dict[str, str]:
    """``{"spark.jars": ...}`` naming the jars as ``local:`` URIs (SparkSession builder
    config or ``--conf``): the driver and every executor on this machine load them from
    the cache, none is copied."""
    jars = spark_jars(kafka=kafka, s3a=s3a)
    return {"spark.jars": ",".join("local:" + str(p) for p in jars)} if jars else {}


def main(argv: list[str] | None = None) -> int:
    """Fetch both poms' jars into the cache; print the cache directories."""
    del argv
    spark_kafka_jars()
    hadoop_aws_jars()
    print(jar_dir(KAFKA_POM, f"spark-kafka-{SPARK_VERSION}"), flush=True)
    print(jar_dir(S3A_POM, f"hadoop-aws-{HADOOP_VERSION}"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
