"""The record a handler sees: plain Python values, never a confluent-kafka ``Message``."""

from __future__ import annotations

from dataclasses import dataclass, field

#: (topic, partition): how partitions are named throughout the consumer.
TopicPartition = tuple[str, int]


@dataclass(slots=True)
class Record:
    """One Kafka record as handed to a :class:`~logsdk.Handler`.

    Treat it as read-only: the consumer tracks offsets on its own, so changing a
    field changes nothing but what the handler itself sees. ``headers`` is a list of
    ``(name, value)`` pairs in wire order (names may repeat); ``timestamp`` is in
    milliseconds since the epoch, or None when the broker gave none.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int | None = None

    def header(self, name: str) -> bytes | None:
        """The value of the last header called ``name``, or None."""
        for k, v in reversed(self.headers):
            if k == name:
                return v
        return None

    @property
    def topic_partition(self) -> TopicPartition:
        """``(topic, partition)``, the key of offset dictionaries."""
        return (self.topic, self.partition)
