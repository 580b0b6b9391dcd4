"""spark_sink: PySpark Structured Streaming source and exactly-once sink for logsdk."""

__all__: list[str] = []
