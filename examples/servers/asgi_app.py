"""An ASGI application that logs one line per request through KafkaHandler, for uvicorn.

    LOGSDK_BOOTSTRAP=localhost:9092 uvicorn --workers 2 --app-dir examples/servers asgi_app:app

uvicorn starts its workers with multiprocessing's spawn: each imports this module, so
each configures logging itself and takes its own slot of the spool dir; a worker's exit
delivers what it logged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from logging_setup import configure

configure()
log = logging.getLogger("web")


async def app(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """Log ``request <id>`` (the query string); answer 200."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    rid = scope.get("query_string", b"").decode()
    log.info("request %s", rid, extra={"rid": rid, "worker": os.getpid()})
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok\n"})
