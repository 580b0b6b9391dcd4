"""logsdk: a reliable logging SDK for Kafka.

The public API is the names in ``__all__``; everything else is private.
"""

from logsdk.consumer import Handler, LogConsumer, Record, TransactionalHandler
from logsdk.errors import LogSDKError

__version__ = "0.1.0"

__all__ = [
    "Handler",
    "LogConsumer",
    "LogSDKError",
    "Record",
    "TransactionalHandler",
    "__version__",
]
