"""logsdk-sink option checks and row identities, without Spark running or a broker."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from spark_sink._sink import SinkOptions

FD_DIR = Path("/proc/self/fd")


def open_files_under(folder: Path) -> list[str]:
    """Paths under ``folder`` that this process holds open (read from /proc/self/fd)."""
    found = []
    for fd in os.listdir(FD_DIR):
        try:
            target = os.readlink(FD_DIR / fd)
        except OSError:
            continue  # closed meanwhile (the listing's own fd)
        if target.startswith(str(folder)):
            found.append(target)
    return sorted(found)


@pytest.mark.skipif(not FD_DIR.is_dir(), reason="needs /proc/self/fd (Linux)")
def test_sqlite_path_option_leaves_no_connection_open(tmp_path: Path) -> None:
    """SinkOptions.parse opens the sqlite.path database to check it, and closes it again."""
    # Without the cycle collector a connection left open stays visible until the end.
    gc.disable()
    try:
        SinkOptions.parse({"sqlite.path": str(tmp_path / "sink.db")})
        assert open_files_under(tmp_path) == []
    finally:
        gc.enable()
