"""KafkaHandler's JSON document, built without a broker: the timestamp as datetime writes
it, the extra fields in the order the record has them."""

from __future__ import annotations

import datetime as dt
import logging
import random
from pathlib import Path

import pytest

from logsdk.errors import ConfigError
from logsdk.integrations.logging import KafkaHandler, iso_utc, record_to_dict


def test_timestamps_are_written_as_datetime_writes_them() -> None:
    """The cached-second formatter against ``datetime.fromtimestamp(...).isoformat()``:
    random instants, whole seconds (no microseconds written), and fractions that round up
    into the next second."""
    rng = random.Random(7)
    instants = [rng.uniform(0, 4e9) for _ in range(50_000)]
    instants += [float(s) for s in range(0, 4_000_000_000, 39_999_999)]
    instants += [1764222779.9999996, 1764222779.0000004, 1764222779.5, 1.0000005, 0.0]
    # The same second again and again, then the next: the cache is used and replaced.
    instants += [1764222779.25, 1764222779.75, 1764222780.0, 1764222779.5]
    for t in instants:
        assert iso_utc(t) == dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(), t


def _record(**extra: object) -> logging.LogRecord:
    return logging.getLogger("app.doc").makeRecord(
        "app.doc", logging.INFO, __file__, 1, "n=%d", (3,), None, extra=extra or None
    )


def test_extra_fields_keep_their_order_and_leave_private_ones_out() -> None:
    doc = record_to_dict(_record(zeta=1, alpha=2, _hidden=3, mid=4), "h", {})
    assert list(doc["extra"]) == ["zeta", "alpha", "mid"]
    assert doc["message"] == "n=3"
    assert "extra" not in record_to_dict(_record(), "h", {})
    assert "extra" not in record_to_dict(_record(_only_private=1), "h", {})


def test_background_mode_refuses_the_shm_buffer(tmp_path: Path) -> None:
    """background=True holds records in the process; buffer='shm' promises they outlive
    it: the two together are refused, before any producer is made."""
    with pytest.raises(ConfigError, match="background=True"):
        KafkaHandler(
            bootstrap_servers="127.0.0.1:1",
            topic="t",
            spool_dir=tmp_path,
            buffer="shm",
            background=True,
        )
    assert not any(tmp_path.iterdir())  # no spool was opened


def test_the_document_is_built_while_another_thread_sets_the_records_attributes() -> None:
    """Background mode builds the document on its own thread while the application's
    thread may still be running other handlers on the record (a Formatter sets
    ``message`` and ``asctime``): the extra fields are read from a copy, never from a dict
    that changes size under the loop."""
    import sys
    import threading

    record = _record(user="ann", request_id=7)
    stop = threading.Event()

    def other_handlers() -> None:
        i = 0
        while not stop.is_set():
            record.__dict__[f"set_by_a_formatter_{i % 50}"] = i
            record.__dict__.pop(f"set_by_a_formatter_{(i + 25) % 50}", None)
            i += 1

    was = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=other_handlers)
    t.start()
    try:
        for _ in range(20_000):
            doc = record_to_dict(record, "h", {}, ("n=3", None))
            assert doc["extra"]["user"] == "ann"
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(was)
