"""logsdk: a reliable logging SDK for Kafka.

The public API is the names in ``__all__``; everything else is private.
"""

from logsdk._version import __version__
from logsdk.consumer import Handler, LogConsumer, Record, TransactionalHandler
from logsdk.errors import LogSDKError
from logsdk.producer import HEADER_PRODUCER, HEADER_SEQ, LogProducer, State

__all__ = [
    "HEADER_PRODUCER",
    "HEADER_SEQ",
    "Handler",
    "LogConsumer",
    "LogProducer",
    "LogSDKError",
    "Record",
    "State",
    "TransactionalHandler",
    "__version__",
]
