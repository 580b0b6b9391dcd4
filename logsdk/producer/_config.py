"""Validated producer settings, converted once to librdkafka properties."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from logsdk._types import ClientConfig
from logsdk.errors import ConfigError

WhenFull = Literal["block", "drop_oldest", "drop_newest", "raise"]
WHEN_FULL = ("block", "drop_oldest", "drop_newest", "raise")

#: librdkafka properties the SDK sets itself; a caller may not override them.
_OWNED: dict[str, str | int | float | bool] = {
    "enable.idempotence": True,
    "acks": "all",
}
_FORBIDDEN = ("on_delivery", "delivery.report.only.error", "error_cb", "transactional.id")
_SECRET_WORDS = ("password", "secret", "token", "key.pem", "private", "oauthbearer.config", "jaas")
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")


def check_topic(topic: object, what: str = "topic") -> str:
    """``topic`` if Kafka accepts it as a topic name, else `ConfigError`."""
    if not isinstance(topic, str) or not _TOPIC_RE.fullmatch(topic) or topic in (".", ".."):
        raise ConfigError(
            f"{what} {topic!r} is not a valid Kafka topic name: use 1-249 characters "
            "from A-Z a-z 0-9 . _ - (and not '.' or '..')"
        )
    return topic


def check_seconds(value: object, name: str) -> float:
    """``value`` as float seconds if it is a finite number >= 0, else `ConfigError`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError(f"{name} must be seconds >= 0, got {value!r}")
    return float(value)


def is_secret(name: str) -> bool:
    """True for properties whose values must never be logged or shown."""
    low = name.lower()
    return any(w in low for w in _SECRET_WORDS)


def redacted(conf: Mapping[str, str | int | float | bool]) -> ClientConfig:
    """A copy of ``conf`` with secret values replaced by ``'***'``."""
    return {k: ("***" if is_secret(k) else v) for k, v in conf.items()}


@dataclass(frozen=True)
class ProducerConfig:
    """Everything a [`LogProducer`][logsdk.LogProducer] is configured with."""

    bootstrap_servers: str
    topic: str
    spool_dir: str
    buffer: Literal["memory", "shm"] = "memory"
    kafka_config: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    spool_synchronous: str = "NORMAL"
    spool_max_bytes: int | None = 1 << 30
    when_full: WhenFull = "block"
    max_block_s: float = 10.0
    buffer_max_records: int = 100_000
    stall_timeout_s: float = 10.0
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 2.0
    probe_backoff_max_s: float = 5.0
    recovery_probes: int = 3
    replay_batch: int = 2_000
    replay_max_rate: float | None = 200_000.0
    message_max_bytes: int = 1_000_000
    shm_name: str | None = None
    shm_bytes: int = 64 << 20
    delivery: Literal["direct", "agent"] = "direct"
    start_agent: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers must be a non-empty 'host:port[,host:port]'")
        check_topic(self.topic)
        if not isinstance(self.spool_dir, (str, os.PathLike)) or not str(self.spool_dir):
            raise ConfigError("spool_dir must be a directory path")
        if self.buffer not in ("memory", "shm"):
            raise ConfigError(f"buffer must be 'memory' or 'shm', got {self.buffer!r}")
        if self.delivery not in ("direct", "agent"):
            raise ConfigError(f"delivery must be 'direct' or 'agent', got {self.delivery!r}")
        if not isinstance(self.start_agent, bool):
            raise ConfigError(f"start_agent must be True or False, got {self.start_agent!r}")
        if self.start_agent and self.delivery != "agent":
            raise ConfigError("start_agent=True needs delivery='agent'")
        if self.when_full not in WHEN_FULL:
            raise ConfigError(f"when_full must be one of {WHEN_FULL}, got {self.when_full!r}")
        positive = {
            "max_block_s": self.max_block_s,
            "buffer_max_records": self.buffer_max_records,
            "stall_timeout_s": self.stall_timeout_s,
            "probe_interval_s": self.probe_interval_s,
            "probe_timeout_s": self.probe_timeout_s,
            "probe_backoff_max_s": self.probe_backoff_max_s,
            "recovery_probes": self.recovery_probes,
            "replay_batch": self.replay_batch,
            "message_max_bytes": self.message_max_bytes,
            "shm_bytes": self.shm_bytes,
        }
        for name, value in positive.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        if self.replay_max_rate is not None and self.replay_max_rate <= 0:
            raise ConfigError(f"replay_max_rate must be > 0 or None, got {self.replay_max_rate}")
        if not isinstance(self.kafka_config, Mapping):
            raise ConfigError("kafka_config must be a mapping of librdkafka properties")
        for key in _FORBIDDEN:
            if key in self.kafka_config:
                raise ConfigError(f"kafka_config may not set {key!r}: logsdk manages it")
        for key, required in _OWNED.items():
            if key in self.kafka_config and str(self.kafka_config[key]).lower() not in (
                str(required).lower(),
                "-1" if key == "acks" else "true",
            ):
                raise ConfigError(
                    f"kafka_config {key}={self.kafka_config[key]!r} would break the "
                    f"at-least-once guarantee; logsdk requires {key}={required!r}"
                )
        if "bootstrap.servers" in self.kafka_config:
            raise ConfigError("pass bootstrap_servers as its own argument, not in kafka_config")
        # Never keep the caller's dict: a later change to it must not change us.
        object.__setattr__(self, "kafka_config", dict(self.kafka_config))
        object.__setattr__(self, "spool_dir", os.fspath(self.spool_dir))

    def librdkafka(self) -> ClientConfig:
        """librdkafka properties for the producer client."""
        conf: ClientConfig = {
            "bootstrap.servers": self.bootstrap_servers,
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
            "queue.buffering.max.messages": self.buffer_max_records,
            "message.max.bytes": self.message_max_bytes,
            "reconnect.backoff.max.ms": 1000,
        }
        conf.update(self.kafka_config)
        conf.update(_OWNED)
        return conf

    def probe_config(self) -> ClientConfig:
        """Properties for the short-lived health-probe client (no producer settings)."""
        conf: ClientConfig = {"bootstrap.servers": self.bootstrap_servers}
        for k, v in self.kafka_config.items():
            if k.startswith(("security.", "sasl.", "ssl.", "client.", "socket.", "broker.")):
                conf[k] = v
        return conf

    def __repr__(self) -> str:
        return (
            f"ProducerConfig(bootstrap_servers={self.bootstrap_servers!r}, topic={self.topic!r}, "
            f"spool_dir={self.spool_dir!r}, buffer={self.buffer!r}, delivery={self.delivery!r}, "
            f"kafka_config={redacted(self.kafka_config)!r}, when_full={self.when_full!r})"
        )
