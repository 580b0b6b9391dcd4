"""logsdk: a reliable logging SDK for Kafka.

The public API is the names in ``__all__``; everything else is private.
"""

from logsdk.errors import LogSDKError
from logsdk.producer import HEADER_PRODUCER, HEADER_SEQ, LogProducer, State

__version__ = "0.1.0"

__all__ = [
    # producing
    "HEADER_PRODUCER",
    "HEADER_SEQ",
    "LogProducer",
    # errors (the rest are in logsdk.errors)
    "LogSDKError",
    "State",
    "__version__",
]
