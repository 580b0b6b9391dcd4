"""Type aliases shared across logsdk."""

from __future__ import annotations

from typing import TypeAlias

#: librdkafka properties as confluent-kafka takes them.
ClientConfig: TypeAlias = dict[str, str | int | float | bool]
