"""A loopback TCP proxy that can cut the network and heal it.

Toxiproxy is the usual tool, but it is a Go binary that no package registry we
can install from ships; the Python packages found are clients only. This proxy
is small on purpose: an asyncio loop in a daemon thread of the test process
(so it dies with that process, never an orphan), piping bytes both ways.

``cut()`` resets every open connection and, until ``heal()``, resets each new
one as soon as it is accepted: to a client this is a network that went away
while the broker and its data stayed up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading

log = logging.getLogger("logsdk.testing.proxy")

_BUF = 256 * 1024


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a dropped network path looks to a peer."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


class TcpProxy:
    """Forward ``127.0.0.1:listen_port`` to ``127.0.0.1:target_port``."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._cut = False

    @property
    def is_cut(self) -> bool:
        """True between ``cut()`` and ``heal()``."""
        return self._cut

    def start(self) -> None:
        """Listen on the port; returns once the listener is bound."""
        ready = threading.Event()
        errors: list[BaseException] = []
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(
                        self._handle, "127.0.0.1", self.listen_port, reuse_address=True
                    )
                )
            except BaseException as exc:  # reported to start() below
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="logsdk-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]

    def stop(self) -> None:
        """Close the listener and every connection."""
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._conns):
                _reset(w)
            self._conns.clear()

        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until ``heal()``."""
        self._cut = True
        loop = self._loop
        if loop is None:
            return

        async def drop() -> int:
            n = len(self._conns)
            for w in list(self._conns):
                _reset(w)
            self._conns.clear()
            return n

        n = asyncio.run_coroutine_threadsafe(drop(), loop).result(5)
        log.info("network cut: %d connection(s) reset", n)

    def heal(self) -> None:
        """Accept and forward connections again."""
        self._cut = False
        log.info("network healed")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _reset(writer)
            return
        self._conns.add(writer)
        self._conns.add(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while not self._cut:
                    data = await src.read(_BUF)
                    if not data:
                        break
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                _reset(dst) if self._cut else dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._conns.discard(writer)
        self._conns.discard(up_writer)
