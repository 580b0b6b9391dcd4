"""LogConsumer: fetch thread -> bounded queue -> workers, with a global offset map."""

from logsdk.consumer._consumer import LogConsumer
from logsdk.consumer._handler import Handler, TransactionalHandler
from logsdk.consumer._offsets import decode_completed, encode_completed
from logsdk.consumer._records import Record, TopicPartition

__all__ = [
    "Handler",
    "LogConsumer",
    "Record",
    "TopicPartition",
    "TransactionalHandler",
    "decode_completed",
    "encode_completed",
]
