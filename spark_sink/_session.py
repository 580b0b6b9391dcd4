"""A quiet local SparkSession for tests, examples and benchmarks."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# pyspark runs as a "shell": Spark lowers the REPL logger to WARN unless it is set.
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


def local_session(
    app_name: str = "logsdk", master: str = "local[2,2]", **conf: str
) -> SparkSession:
    """A local SparkSession with spark_sink registered, logging at error level only.

    ``local[N,F]`` retries a failed task F-1 times instead of failing the query.
    Sets ``SPARK_LOCAL_IP=127.0.0.1`` (unless set) and ``PYSPARK_PYTHON`` to this
    interpreter, so the Python workers import the same installed spark_sink and
    pyarrow. Starting a session takes several seconds (a JVM starts).
    """
    from pyspark.sql import SparkSession

    from spark_sink import register

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log4j = Path(tempfile.gettempdir()) / "logsdk-spark-log4j2.properties"
    if not log4j.exists() or log4j.read_text() != _LOG4J2:
        tmp = log4j.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_LOG4J2)
        os.replace(tmp, log4j)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # A URI, percent-encoded: Spark splits the option at spaces, and a '#', '?' or '%'
        # in the temp dir's path would be URI syntax.
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j.as_uri()}")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
