"""LogProducer: buffer -> Kafka, spool on failure, replay on recovery (at-least-once)."""

from logsdk.producer._producer import HEADER_PRODUCER, HEADER_SEQ, LogProducer, State

__all__ = ["HEADER_PRODUCER", "HEADER_SEQ", "LogProducer", "State"]
