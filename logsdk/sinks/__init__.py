"""Reference sinks: TransactionalHandlers for ``LogConsumer(semantics="exactly_once")``."""

from logsdk.sinks._sqlite import SQLiteSink

__all__ = ["SQLiteSink"]
