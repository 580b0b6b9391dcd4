"""A WSGI application that logs one line per request through KafkaHandler, for gunicorn.

    LOGSDK_BOOTSTRAP=localhost:9092 gunicorn -w 3 --max-requests 1000 \
        --chdir examples/servers wsgi_app:app

With or without ``--preload``, with workers recycled by ``--max-requests``: every worker
logs through its own slot of the one spool dir, and a worker's exit (recycled, or at
SIGTERM) delivers what it logged. No ``post_fork`` hook is needed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from logging_setup import configure

configure()
log = logging.getLogger("web")


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Log ``request <id>`` (the query string) with the worker's pid; answer 200."""
    rid = environ.get("QUERY_STRING", "")
    log.info("request %s", rid, extra={"rid": rid, "worker": os.getpid()})
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\n"]
