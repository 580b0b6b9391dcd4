"""Producer settings for fault tests and chaos runs: short probes, short stall timeout."""

from __future__ import annotations

from typing import Any

#: Probes every 0.2 s, a stall declared after 3 s, reconnects backed off at most 0.2 s:
#: fault tests see outages start and end within a second or two.
FAST_RECOVERY: dict[str, Any] = {
    "stall_timeout_s": 3.0,
    "probe_interval_s": 0.2,
    "probe_timeout_s": 1.0,
    "probe_backoff_max_s": 0.5,
    "kafka_config": {"reconnect.backoff.max.ms": 200},
}
