"""spark_sink: a PySpark Structured Streaming Kafka source and exactly-once sinks.

- ``logsdk-kafka``: a Python data source (stream and batch) over confluent-kafka.
- ``logsdk-sink``: a streaming sink applying each batch once through a
  [`TransactionalHandler`][logsdk.TransactionalHandler] (e.g.
  [`SQLiteSink`][logsdk.sinks.SQLiteSink]).
- [`ForeachBatchSink`][spark_sink.ForeachBatchSink]: the same guarantee through ``foreachBatch``.
- `spark_sink.logs`: parse and dedupe the JSON records of ``KafkaHandler``.

Call [`register()`][spark_sink.register] once per SparkSession. Names are imported lazily, so
``spark_sink._options`` (offset planning) works without pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_sink._session import local_session
    from spark_sink._sink import (
        ForeachBatchSink,
        HandlerSink,
        apply_batch,
        encode_handler,
        next_batch_id,
    )
    from spark_sink._source import KafkaSource

_LAZY = {
    "ForeachBatchSink": "spark_sink._sink",
    "HandlerSink": "spark_sink._sink",
    "apply_batch": "spark_sink._sink",
    "encode_handler": "spark_sink._sink",
    "next_batch_id": "spark_sink._sink",
    "KafkaSource": "spark_sink._source",
    "local_session": "spark_sink._session",
}

__all__ = [
    "ForeachBatchSink",
    "HandlerSink",
    "KafkaSource",
    "apply_batch",
    "encode_handler",
    "local_session",
    "next_batch_id",
    "register",
    "set_active",
]


def register(spark: SparkSession) -> None:
    """Register ``logsdk-kafka`` and ``logsdk-sink`` with ``spark``'s data sources.

    The Python workers must import spark_sink and pyarrow: run Spark with the Python
    that has logsdk installed (``PYSPARK_PYTHON``), as a package, not ``addPyFile``.
    """
    from spark_sink._sink import HandlerSink
    from spark_sink._source import KafkaSource

    spark.dataSource.register(KafkaSource)
    spark.dataSource.register(HandlerSink)
    set_active(spark)


def set_active(spark: SparkSession) -> None:
    """Make ``spark`` the JVM's active session for the calling thread.

    ``writeStream.format("logsdk-sink").start()`` finds Python data sources through
    the JVM's *active* session, which is per JVM thread and was found unset in
    pytest (the error is ``DATA_SOURCE_NOT_FOUND``). Call this before ``start()``
    in a thread that did not create the session.
    """
    jvm = spark._jvm  # pyspark has no public call for this
    if jvm is None:
        raise RuntimeError("this SparkSession has no JVM (Spark Connect?): nothing to set")
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spark_sink' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
