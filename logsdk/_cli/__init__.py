"""Subcommands of the ``logsdk`` command, one module each, registered by ``logsdk.cli``.

Each module has ``register(subparsers)``, which adds its parser(s) and sets ``func``
(``args -> exit code``). Errors are raised as [`logsdk.errors`][logsdk.errors] types and turned
into exit codes by ``logsdk.cli.main``: ``_common.UsageError`` is bad usage (2), any
other [`LogSDKError`][logsdk.errors.LogSDKError] or ``OSError`` a failure (1).
"""
