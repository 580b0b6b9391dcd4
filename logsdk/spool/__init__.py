"""The on-disk spool (SQLite through sqlite-utils) that holds records Kafka has not acked."""

from logsdk.spool._codec import decode_headers, encode_headers
from logsdk.spool._spool import Spool

__all__ = ["Spool", "decode_headers", "encode_headers"]
