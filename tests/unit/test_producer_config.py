"""LogProducer settings: validation, guarantees that cannot be weakened, secrets hidden."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from logsdk.errors import ConfigError
from logsdk.producer._config import ProducerConfig


def _cfg(tmp_path: Path, **kw: object) -> ProducerConfig:
    base: dict[str, object] = {
        "bootstrap_servers": "127.0.0.1:1",
        "topic": "t",
        "spool_dir": str(tmp_path),
    }
    base.update(kw)
    return ProducerConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"bootstrap_servers": ""}, "bootstrap_servers"),
        ({"topic": ""}, "topic"),
        ({"when_full": "sometimes"}, "when_full"),
        ({"buffer": "disk"}, "buffer"),
        ({"buffer_max_records": 0}, "buffer_max_records"),
        ({"stall_timeout_s": -1}, "stall_timeout_s"),
        ({"kafka_config": {"acks": "1"}}, "acks"),
        ({"kafka_config": {"enable.idempotence": False}}, "enable.idempotence"),
        ({"kafka_config": {"on_delivery": print}}, "on_delivery"),
        ({"kafka_config": {"bootstrap.servers": "x:1"}}, "bootstrap_servers"),
    ],
)
def test_bad_settings_name_the_setting(tmp_path: Path, kw: dict[str, object], match: str) -> None:
    """Each bad setting raises ConfigError naming it."""
    with pytest.raises(ConfigError, match=match):
        _cfg(tmp_path, **kw)


def test_callers_dict_not_kept(tmp_path: Path) -> None:
    """Changing the caller's kafka_config afterwards does not change the producer."""
    conf: dict[str, str | int | float | bool] = {"linger.ms": 7}
    cfg = _cfg(tmp_path, kafka_config=conf)
    conf["linger.ms"] = 99
    assert cfg.librdkafka()["linger.ms"] == 7


def test_guarantee_settings_always_set(tmp_path: Path) -> None:
    """librdkafka always gets enable.idempotence=true and acks=all."""
    conf = _cfg(tmp_path, kafka_config={"acks": "all"}).librdkafka()
    assert conf["enable.idempotence"] is True
    assert conf["acks"] == "all"


def test_secrets_hidden_from_repr(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SASL/SSL passwords never appear in repr (and so never in logs of it)."""
    cfg = _cfg(
        tmp_path,
        kafka_config={
            "sasl.password": "hunter2",
            "ssl.key.password": "s3cret",
            "sasl.username": "u",
        },
    )
    text = repr(cfg)
    assert "hunter2" not in text
    assert "s3cret" not in text
    assert "'sasl.username': 'u'" in text
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("x").info("config %r", cfg)
    assert "hunter2" not in caplog.text
    assert cfg.probe_config()["sasl.password"] == "hunter2"  # still used, just not shown


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "5", None])
@pytest.mark.parametrize("name", ["close_timeout", "flush_timeout"])
def test_handler_timeouts_must_be_finite_seconds(name: str, bad: object) -> None:
    """Refused before any producer is made: a clear error, not a hang at exit."""
    from logsdk.integrations.logging import KafkaHandler

    with pytest.raises(ConfigError, match=f"{name} must be seconds >= 0"):
        KafkaHandler(**{name: bad})
