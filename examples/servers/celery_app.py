"""A Celery app whose tasks log through KafkaHandler, run by a prefork worker.

    LOGSDK_BOOTSTRAP=localhost:9092 CELERY_DATA=/tmp/celery-data \
        celery -A celery_app --workdir examples/servers worker --pool prefork -c 2

Logging is configured in Celery's ``setup_logging`` signal (Celery then leaves the root
logger alone): it runs in the worker's main process, whose pool children inherit the
handler through fork and start it afresh at their first log line, each in a slot of its
own under the one spool dir. A child's exit (warm shutdown, ``--max-tasks-per-child``)
delivers what it logged. The broker here is kombu's filesystem transport (no server),
under ``CELERY_DATA``; any Celery broker works the same.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import setup_logging
from logging_setup import configure

DATA = Path(os.environ.get("CELERY_DATA", "/tmp/celery-data"))
for sub in ("queue", "processed"):
    (DATA / sub).mkdir(parents=True, exist_ok=True)

app = Celery("celery_app", broker="filesystem://")
app.conf.broker_transport_options = {
    "data_folder_in": str(DATA / "queue"),
    "data_folder_out": str(DATA / "queue"),
    "data_folder_processed": str(DATA / "processed"),
}
app.conf.broker_connection_retry_on_startup = True
log = logging.getLogger("tasks")


@setup_logging.connect
def _logging(**_: Any) -> None:
    configure()


@app.task
def work(rid: int) -> None:
    """Log ``request <rid>``; leave a marker file so a caller can tell it ran."""
    log.info("request %d", rid, extra={"rid": str(rid)})
    (DATA / "done" / str(rid)).touch()
