"""An ASGI application that logs one line per request through KafkaHandler, for uvicorn.

    LOGSDK_BOOTSTRAP=localhost:9092 uvicorn --workers 2 --app-dir examples/servers asgi_app:app

uvicorn starts its workers with multiprocessing's spawn: each imports this module, so
each configures logging itself and takes its own slot of the spool dir.

uvicorn ends a worker by re-raising the SIGTERM it caught once its graceful shutdown is
done: the process dies by the signal, and exit hooks (``logging.shutdown()``) do not run.
So the app closes its logging in the lifespan shutdown, which delivers what the worker
logged (within the handler's ``close_timeout``) before that.
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
                logging.shutdown()  # delivers: the worker will die by SIGTERM after this
                await send({"type": "lifespan.shutdown.complete"})
                return
    rid = scope.get("query_string", b"").decode()
    log.info("request %s", rid, extra={"rid": rid, "worker": os.getpid()})
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok\n"})
