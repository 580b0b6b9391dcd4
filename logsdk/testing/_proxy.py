"""A loopback TCP proxy that can cut the network, heal it, and fake duplicate produces.

Toxiproxy is the usual tool, but it is a Go binary that no package registry we
can install from ships; the Python packages found are clients only. This proxy
is small on purpose: an asyncio loop in a daemon thread of the test process
(so it dies with that process, never an orphan), piping Kafka frames both ways.

``cut()`` resets every open connection and, until ``heal()``, resets each new
one as soon as it is accepted: to a client this is a network that went away
while the broker and its data stayed up.

``drop_produce_as_duplicate(n)`` swallows the next ``n`` ProduceRequests and
answers each one itself with DUPLICATE_SEQUENCE_NUMBER (error 46) and base
offset -1 for every partition, as Tansu does: the batch is never stored, and an
idempotent librdkafka producer reports its records as delivered. That is what a
broker that records a producer's sequence before it stores the batch does when it
fails in between and the client resends. To finish the picture (that broker has
moved its sequence past the lost batch) the proxy lowers the base sequence of the
producer's later batches to that partition by the lost record count, so the real
broker sees no gap and does not answer OUT_OF_ORDER_SEQUENCE_NUMBER (which
librdkafka would make a fatal error).

librdkafka numbers a batch's delivery reports from the base offset: with -1 the
first record reports offset -1 (``Message.offset()`` returns None in Python) and
the others 0, 1, 2...: offsets that look valid but belong to other records.

``fail_metadata(n, error_code)`` sets ``error_code`` (LEADER_NOT_AVAILABLE unless
told) on the topics of the next ``n`` responses to all-topics Metadata requests
(what ``list_topics()`` sends): the broker keeps the topics, the client sees them
listed with an error, as while a leader is being elected. Requests for named
topics (librdkafka's own refreshes) pass unchanged, so the count goes to the
caller that lists topics. It counts responses, not calls: librdkafka may send a
fresh client's first ``list_topics()`` twice (on the bootstrap connection, then
again on the broker's own), and then one call uses two.

``misreport_earliest(offset, n)`` answers ``offset`` in place of the broker's answer to
ListOffsets EARLIEST (what ``auto.offset.reset=earliest``, ``OFFSET_BEGINNING`` and the
low of ``get_watermark_offsets`` ask) in the next ``n`` responses that carry one: what
Tansu 0.6 answers when a partition's first batches were stored in another order than
their offsets (docs/engineering/broker-quirks.md), on demand instead of under load.

``hold_produce()`` holds the next ProduceRequest, and everything its client sends after
it on that connection, until ``release_held()``; then forwards them in order, even if the
client has closed the connection meanwhile. That is what an Apache Kafka broker does with
a connection whose produce request waits in purgatory (``acks=all`` with a follower in
the ISR that is not fetching): it reads nothing more from that connection until the
request is answered, then reads and appends the requests the client sent behind it,
after any client that gave up on them has purged them, closed the connection and sent
newer records through another (docs/engineering/chaos.md, "On Apache Kafka").

Everything else passes through unchanged. The proxy splits both directions into
Kafka frames (an int32 size, then the message) to know each request's
correlation id, so that a response it makes up is sent only after the responses
to every earlier request on that connection: a client expects them in order.

Parts: the Kafka wire codec (frames, headers, the requests read and the responses made
or rewritten) is `logsdk.testing._wire`, with the record batches inside a
ProduceRequest in `logsdk.testing._batches`; each fault mode is a part of
`logsdk.testing._faults`, which owns what it was armed with. This module owns the
connections. Owners: the listener, every connection (``_Conn``: the answers it is owed,
its hold) and the list of held connections belong to the proxy's event loop thread; a
test's thread arms the fault modes (each under its own lock) and hands ``cut()``,
``release_held()`` and ``stop()`` to the loop. ``_cut`` is a flag the test's thread
writes and the loop reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from logsdk.testing._faults import (
    Asked,
    EarliestMisreports,
    MetadataFaults,
    ProduceDrops,
    ProduceHolds,
)
from logsdk.testing._wire import (
    LEADER_NOT_AVAILABLE,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
    ProduceRequest,
    duplicate_response,
    frame_size,
    metadata_all_topics,
    parse_produce,
    request_header,
    response_correlation_id,
)

log = logging.getLogger("logsdk.testing.proxy")

_BUF = 256 * 1024

#: Called with each frame (size prefix, message); returns the chunks to forward.
_FrameHook = Callable[[bytes, bytes], list[bytes]]


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a dropped network path looks to a peer."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


@dataclass
class _Conn:
    """One client connection: the responses it is owed, in request order."""

    client: asyncio.StreamWriter
    #: [correlation id, None for a request forwarded to the broker or the frame to send
    #: in its place]. The head is always a forwarded request: made-up answers at the
    #: head are sent at once.
    owed: deque[tuple[int, bytes | None]] = field(default_factory=deque)
    #: correlation id -> version of the all-topics Metadata requests awaiting an answer.
    metadata: dict[int, int] = field(default_factory=dict)
    #: correlation id -> (version, the (topic, partition) pairs asked EARLIEST) of the
    #: ListOffsets requests awaiting an answer, while misreport_earliest is armed.
    earliest: dict[int, Asked] = field(default_factory=dict)
    #: The broker's side of the connection (for a hold's release).
    upstream: asyncio.StreamWriter | None = None
    #: A hold is on (see ``hold_produce``): frames from the client wait in ``pending``.
    held: bool = False
    pending: list[bytes] = field(default_factory=list)
    #: The client closed its side while held: close the broker's once released.
    ended: bool = False


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
        # The fault modes, each its own part with its own lock (logsdk.testing._faults).
        self._drops = ProduceDrops()
        self._meta = MetadataFaults()
        self._early = EarliestMisreports()
        self._holds = ProduceHolds()
        self._held: list[_Conn] = []  # connections on hold (event loop thread only)

    @property
    def is_cut(self) -> bool:
        """True between ``cut()`` and ``heal()``."""
        return self._cut

    @property
    def produce_drops_armed(self) -> int:
        """ProduceRequests still to be dropped by `drop_produce_as_duplicate()`."""
        return self._drops.armed

    @property
    def produce_drops_done(self) -> int:
        """ProduceRequests dropped (and answered as duplicates) so far."""
        return self._drops.done

    @property
    def produce_versions(self) -> frozenset[int]:
        """ProduceRequest versions seen so far (what the clients negotiated)."""
        return self._drops.versions

    @property
    def metadata_faults_done(self) -> int:
        """Metadata responses `fail_metadata()` has changed so far."""
        return self._meta.done

    def fail_metadata(
        self,
        count: int = 1,
        *,
        error_code: int = LEADER_NOT_AVAILABLE,
        topics: Iterable[str] | None = None,
    ) -> None:
        """Set ``error_code`` on ``topics`` (default: every topic) in the next ``count``
        responses to all-topics Metadata requests that list one of them.

        The broker's answer is otherwise passed as it was. Replaces any faults still
        armed (count 0 disarms).
        """
        self._meta.arm(count, error_code, topics)

    @property
    def earliest_misreports_done(self) -> int:
        """ListOffsets responses `misreport_earliest()` has changed so far."""
        return self._early.done

    def misreport_earliest(
        self, offset: int, count: int = 1, *, topics: Iterable[str] | None = None
    ) -> None:
        """Answer ``offset`` for each partition of ``topics`` (default: every topic) asked
        its earliest offset in the next ``count`` ListOffsets responses that carry one.

        Partitions the broker answered with an error, and every other answer, pass
        unchanged. Replaces any misreports still armed (count 0 disarms).
        """
        self._early.arm(offset, count, topics)

    @property
    def produce_holds_done(self) -> int:
        """ProduceRequests that began a hold (see `hold_produce()`) so far."""
        return self._holds.done

    @property
    def held_records(self) -> int:
        """Records in the ProduceRequests held since the last `hold_produce()` (the
        held one and those sent behind it on its connection)."""
        return self._holds.records

    def hold_produce(self) -> None:
        """Hold the next ProduceRequest (``acks`` != 0) and every frame its client sends
        after it on that connection, until `release_held()`: as a Kafka broker reads
        nothing more from a connection whose produce request waits in purgatory. Other
        connections pass. The held frames are forwarded in order on release, even if the
        client closed the connection meanwhile (the broker then stores what a client
        that gave up on those records sent)."""
        self._holds.arm()

    def release_held(self) -> None:
        """Forward what `hold_produce()` held (an armed hold not yet begun is
        disarmed)."""
        self._holds.disarm()
        loop = self._loop
        if loop is None:
            return

        def release() -> None:
            held, self._held = self._held, []
            for conn in held:
                conn.held = False
                up = conn.upstream
                if up is None or self._cut:
                    continue
                for chunk in conn.pending:
                    up.write(chunk)
                log.info("released %d held frame(s)", len(conn.pending) // 2)
                conn.pending.clear()
                if conn.ended:
                    up.close()  # after what was written: the client had closed its side
                    self._conns.discard(up)

        loop.call_soon_threadsafe(release)

    def _take_hold(self, frame: bytes, req: ProduceRequest, conn: _Conn) -> None:
        """Begin a hold on ``conn`` if one is armed, and count the records held."""
        if req.acks == 0 or not self._holds.take(frame, req, conn.held):
            return
        if not conn.held:
            conn.held = True
            self._held.append(conn)
        log.info("produce request (correlation id %d) held", req.correlation_id)

    def drop_produce_as_duplicate(self, count: int = 1) -> None:
        """Swallow the next ``count`` ProduceRequests and answer each with
        DUPLICATE_SEQUENCE_NUMBER and base offset -1 for all its partitions.

        The batches are never stored; an idempotent librdkafka producer reports
        their records as delivered (the first with offset -1, the rest with offsets
        0, 1, ... counted from it). Later batches of that producer to those partitions
        are renumbered so the broker sees no sequence gap. Adds to any drops still
        armed; requests with ``acks=0`` are dropped without an answer.
        """
        self._drops.arm(count)

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
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

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

    # -- per connection (all on the proxy's event loop thread) ----------------------------

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
        conn = _Conn(writer, upstream=up_writer)

        def requests(head: bytes, frame: bytes) -> list[bytes]:
            """Client to broker: note the answer owed, or swallow a produce and answer it."""
            header = request_header(frame)
            if header is None:
                return [head, frame]
            api_key, _, correlation_id = header
            if api_key != PRODUCE:
                if api_key == METADATA and (version := metadata_all_topics(frame)) is not None:
                    conn.metadata[correlation_id] = version
                if api_key == LIST_OFFSETS and (asked := self._early.asked(frame)) is not None:
                    conn.earliest[correlation_id] = asked
                conn.owed.append((correlation_id, None))
                return [head, frame]
            req = parse_produce(frame)
            if req is None:  # a version we cannot read: forward it, pass its answer
                log.warning("produce request not understood; forwarded unchanged")
                conn.owed.append((correlation_id, None))
                return [head, frame]
            if not self._drops.take(frame, req):
                self._take_hold(frame, req, conn)
                if req.acks != 0:
                    conn.owed.append((correlation_id, None))
                return [head, self._drops.renumber(frame, req)]
            if req.acks != 0:
                answer = duplicate_response(req)
                if conn.owed:  # after the answers to the requests before it
                    log.debug("answer to %d held for %d earlier", correlation_id, len(conn.owed))
                    conn.owed.append((correlation_id, answer))
                else:
                    writer.write(answer)
            return []

        def responses(head: bytes, frame: bytes) -> list[bytes]:
            """Broker to client: pass the frame, then the made-up answers owed after it."""
            correlation_id = response_correlation_id(frame)
            if correlation_id is None:
                return [head, frame]
            version = conn.metadata.pop(correlation_id, None)
            if version is not None:
                frame = self._meta.apply(frame, version)
            if (earliest := conn.earliest.pop(correlation_id, None)) is not None:
                frame = self._early.apply(frame, *earliest)
            if conn.owed and conn.owed[0][0] == correlation_id:
                conn.owed.popleft()
            else:
                log.warning(
                    "response to correlation id %d out of the expected order %s",
                    correlation_id,
                    [c for c, _ in conn.owed][:5],
                )
            out = [head, frame]
            while conn.owed and (answer := conn.owed[0][1]) is not None:
                conn.owed.popleft()
                out.append(answer)
            return out

        await asyncio.gather(
            self._pipe(reader, up_writer, requests, conn), self._pipe(up_reader, writer, responses)
        )
        self._conns.discard(writer)
        if not conn.held:  # else the release closes it (a cut or stop resets it)
            self._conns.discard(up_writer)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        on_frame: _FrameHook,
        held: _Conn | None = None,
    ) -> None:
        """Copy ``src`` to ``dst`` frame by frame through ``on_frame``, which returns
        what to forward in the frame's place; with ``held``, frames wait in its
        ``pending`` while a hold is on (see `hold_produce()`)."""
        try:
            while not self._cut:
                try:
                    head = await src.readexactly(4)
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        if held is not None and held.held:
                            held.pending.append(exc.partial)
                        else:
                            dst.write(exc.partial)
                    break
                size = frame_size(head)
                if size is None:  # not Kafka framing: copy bytes blindly
                    bad = int.from_bytes(head, "big", signed=True)
                    log.warning("frame size %d: passing the rest of the stream through", bad)
                    dst.write(head)
                    await self._copy(src, dst)
                    break
                frame = await src.readexactly(size)
                chunks = on_frame(head, frame)
                if held is not None and held.held:
                    held.pending.extend(chunks)
                    continue
                for chunk in chunks:
                    dst.write(chunk)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if self._cut:
                _reset(dst)
            elif held is not None and held.held:
                held.ended = True  # the release forwards what is pending, then closes
            else:
                dst.close()

    async def _copy(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while not self._cut:
            data = await src.read(_BUF)
            if not data:
                return
            dst.write(data)
            await dst.drain()
