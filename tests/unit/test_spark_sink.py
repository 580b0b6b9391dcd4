"""logsdk-sink option checks and row identities, without Spark running or a broker."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from logsdk.errors import SinkError, SparkSourceError
from logsdk.sinks import SQLiteSink
from spark_sink._sink import SinkOptions, _decode_handler

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


@pytest.mark.parametrize(("given", "level"), [(None, "NORMAL"), ("full", "FULL"), ("OFF", "OFF")])
def test_sqlite_synchronous_option_sets_the_sinks_level(
    tmp_path: Path, given: str | None, level: str
) -> None:
    """sqlite.synchronous (default NORMAL) is the level of the SQLiteSink each commit uses."""
    options = {"sqlite.path": str(tmp_path / "sink.db")}
    if given is not None:
        options["sqlite.synchronous"] = given
    handler = _decode_handler(SinkOptions.parse(options).handler)
    assert isinstance(handler, SQLiteSink)
    assert handler.synchronous == level


def test_bad_sqlite_synchronous_is_named(tmp_path: Path) -> None:
    """A level SQLite does not have fails with SparkSourceError naming the option."""
    with pytest.raises(SparkSourceError, match=r"sqlite\.synchronous must be one of OFF, NORMAL"):
        SinkOptions.parse({"sqlite.path": str(tmp_path / "s.db"), "sqlite.synchronous": "FAST"})
    assert not (tmp_path / "s.db").exists()  # refused before the database is created


def test_rows_without_kafka_columns_never_share_an_identity() -> None:
    """Plain rows of two tasks in two batches get four disjoint sets of identities."""
    import pyarrow as pa

    from spark_sink._sink import records_from_arrow

    table = pa.table({"level": ["INFO", "WARN", "ERROR"], "n": [1, 2, 3]})
    seen = [
        (r.topic, r.partition, r.offset)
        for batch_id in (0, 1)
        for task in (0, 1)
        for r in records_from_arrow(table, "s", batch_id=batch_id, task=task)
    ]
    assert len(seen) == 12
    assert len(set(seen)) == 12
    [first] = records_from_arrow(table.slice(0, 1), "s", batch_id=5, task=3)
    assert (first.topic, first.partition, first.offset) == ("s", 3, 5 << 32)
    assert json.loads(first.value) == {"level": "INFO", "n": 1}


def test_batch_id_too_large_for_a_row_identity_is_refused() -> None:
    """A batch id whose identities would not fit a 64-bit offset raises SinkError."""
    import pyarrow as pa

    from spark_sink._sink import records_from_arrow

    with pytest.raises(SinkError, match="batch id"):
        records_from_arrow(pa.table({"n": [1]}), "s", batch_id=1 << 31, task=0)


def test_sqlite_options_beside_a_handler_are_refused(tmp_path: Path) -> None:
    """sqlite.* options configure the sink built from sqlite.path; beside a handler they
    would be ignored silently, so start() refuses them, naming them."""
    from spark_sink import encode_handler

    with SQLiteSink(str(tmp_path / "h.db")) as sink:
        handler = encode_handler(sink)
    with pytest.raises(SparkSourceError, match=r"sqlite\.dedupe, sqlite\.table apply only"):
        SinkOptions.parse({"handler": handler, "sqlite.table": "t", "sqlite.dedupe": "true"})
