"""The version of logsdk, single-sourced: pyproject.toml reads it, ``logsdk --version``
and ``logsdk.__version__`` report it."""

__version__ = "0.2.0.dev0"
