"""A small web app (stdlib ``http.server``) that logs every request to Kafka via KafkaHandler.

    python examples/web_app.py                                # embedded broker, serve until Ctrl-C
    python examples/web_app.py --bootstrap localhost:9092 --port 8080
    python examples/web_app.py --requests 30 --exit           # send itself 30 requests, then stop

Routes: ``/`` (hello), ``/orders/<id>`` (JSON), ``/fail`` (raises: logged with its
traceback, answered 500), ``/health`` (not logged). Every request is one JSON record
(method, path, status, duration_ms, client in ``extra``); then follow them with
``logsdk tail -t web-logs -b BOOTSTRAP``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from logsdk.integrations.logging import KafkaHandler

access = logging.getLogger("web.access")
app_log = logging.getLogger("web.app")


class App(BaseHTTPRequestHandler):
    """The routes; one access record per request."""

    def do_GET(self) -> None:
        start = time.perf_counter()
        status = 500
        try:
            status, body = self.route(self.path)
        except Exception:
            app_log.exception("unhandled error in %s", self.path)
            body = b'{"error": "internal"}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.path != "/health":
            access.log(
                logging.ERROR if status >= 500 else logging.INFO,
                "%s %s %d",
                self.command,
                self.path,
                status,
                extra={
                    "method": self.command,
                    "path": self.path,
                    "status": status,
                    "duration_ms": round((time.perf_counter() - start) * 1000, 2),
                    "client": self.client_address[0],
                },
            )

    def route(self, path: str) -> tuple[int, bytes]:
        if path in ("/", "/health"):
            return 200, b'{"hello": "world"}'
        if path.startswith("/orders/"):
            order = path.rsplit("/", 1)[1]
            return 200, json.dumps({"order": order, "status": "shipped"}).encode()
        if path == "/fail":
            raise RuntimeError("the database went away")
        return 404, b'{"error": "not found"}'

    def log_message(self, format: str, *args: object) -> None:
        """http.server's own stderr lines: replaced by the access records above."""


class Server(ThreadingHTTPServer):
    """Request threads are joined by ``server_close()``: a request's access record is
    logged after its response is sent, so closing the log handler before they end
    would lose the records of the last requests (found by a test on a loaded machine)."""

    daemon_threads = False


def self_requests(base: str, n: int) -> int:
    """GET n URLs from the app itself, cycling through the routes; returns how many failed."""
    paths = ["/", "/orders/7", "/fail", "/health"]
    errors = 0
    for i in range(n):
        try:
            with urllib.request.urlopen(base + paths[i % len(paths)], timeout=10) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            exc.close()
            errors += 1
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", help="Kafka bootstrap servers (default: an embedded broker)")
    ap.add_argument("--topic", default="web-logs")
    ap.add_argument("--spool-dir", default=None, help="default: a temporary directory")
    ap.add_argument("--port", type=int, default=0, help="HTTP port (default: a free one)")
    ap.add_argument("--requests", type=int, default=0, help="send the app N requests first")
    ap.add_argument("--exit", action="store_true", help="stop after --requests")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)-7s %(name)s: %(message)s")
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from logsdk.testing import EmbeddedBroker, create_topic

            broker = stack.enter_context(EmbeddedBroker())
            bootstrap = broker.bootstrap_servers
            create_topic(bootstrap, args.topic, 3)
            print(f"embedded broker at {bootstrap}", flush=True)
        spool = args.spool_dir or stack.enter_context(tempfile.TemporaryDirectory())
        handler = KafkaHandler(
            bootstrap_servers=bootstrap,
            topic=args.topic,
            spool_dir=spool,
            static_fields={"service": "web_app"},
        )
        logging.getLogger("web").addHandler(handler)
        server = Server(("127.0.0.1", args.port), App)
        thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_port}"
        print(f"serving on {base} (Ctrl-C to stop)", flush=True)
        failed = 0
        try:
            if args.requests:
                failed = self_requests(base, args.requests)
            if not args.exit:
                thread.join()
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            server.server_close()
            logging.getLogger("web").removeHandler(handler)
            handler.close()  # delivers to Kafka (close_timeout); what it cannot stays spooled
        stats = handler.producer.stats()
        print(
            f"requests {args.requests} (answered 500: {failed}); log records sent "
            f"{stats['sent']}, acknowledged {stats['acked']}, in spool {stats['spool_records']}, "
            f"dropped {handler.dropped}",
            flush=True,
        )
        return 0 if handler.dropped == 0 and stats["acked"] == stats["sent"] else 1


if __name__ == "__main__":
    sys.exit(main())
