"""The thin wrapper over confluent-kafka: the only producer code that touches librdkafka.

It builds clients (`Clients`, the engine's one way to a client), classifies
librdkafka errors once (so the policy layer branches on meaning, not on codes) and runs
health probes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from logsdk import _fork
from logsdk._resolver import resolver_ready
from logsdk._types import ClientConfig
from logsdk.errors import ConfigError

log = logging.getLogger("logsdk.producer")
rdlog = logging.getLogger("logsdk.librdkafka")

#: Errors that belong to the record itself: resending it can never succeed.
_RECORD_ERRORS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError._INVALID_ARG,
        KafkaError._BAD_MSG,
        # The record's topic: Kafka refuses the name, the client may not write to it, or it
        # does not exist (librdkafka reports that only after topic.metadata.propagation.max.ms
        # or when auto-creation is off). Resending cannot help; the record is set aside in
        # the spool's rejected table, and the others go on.
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
    }
)
#: Errors that mean the cluster (or the path to it) is gone.
_CLUSTER_DOWN = frozenset({KafkaError._ALL_BROKERS_DOWN})
#: A purged in-flight record may have been written: resend it (a duplicate at worst).
POSSIBLY_PERSISTED = frozenset({KafkaError._PURGE_INFLIGHT, KafkaError._MSG_TIMED_OUT})


def possibly_persisted(err: KafkaError, client_was_up: bool) -> bool:
    """True when a record handed back with ``err`` may be in Kafka already (it is resent:
    it may arrive twice). Besides the errors above: a record purged from the client's
    queue (``_PURGE_QUEUE``) by a client that was talking to Kafka, because librdkafka puts
    a batch whose request got no answer (a connection cut, a timeout) back in the queue
    for its retry, and the purge then hands it back as queued although the broker may
    have stored it. Python cannot ask librdkafka for a record's persistence status
    (``rd_kafka_message_status`` is not exposed), so every such record counts: an upper
    bound of the records that arrive twice, never less (measured: after a network cut
    during a steady send, hundreds of records arrived twice while none were counted)."""
    code = err.code()
    return code in POSSIBLY_PERSISTED or (client_was_up and code == KafkaError._PURGE_QUEUE)


def is_record_error(err: KafkaError) -> bool:
    """True when the failure is the record's own fault (too large, invalid)."""
    return bool(err.code() in _RECORD_ERRORS)


def is_record_exception(exc: KafkaException) -> bool:
    """True when produce() refused the record itself (too large, invalid), not the client."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and is_record_error(err)


def is_cluster_down(err: KafkaError) -> bool:
    """True for 'all brokers down' style errors."""
    return bool(err.code() in _CLUSTER_DOWN)


#: A wait on librdkafka (a metadata request) is cut into slices this long, so that a
#: probe or a connect gives up within one slice of a stop: close() never waits out a
#: whole probe timeout for an answer it no longer needs.
_SLICE_S = 0.1


def list_topics_until(
    client: Any, topic: str | None, timeout: float, stop: threading.Event | None
) -> Any:
    """``client.list_topics(topic, timeout)`` in slices of ``_SLICE_S``, given up as soon as
    ``stop`` is set; raises the last KafkaException when nothing answered in time."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return client.list_topics(topic, timeout=max(0.01, min(_SLICE_S, left)))
        except KafkaException:
            if left <= _SLICE_S or (stop is not None and stop.is_set()):
                raise


ErrorCallback = Callable[[KafkaError], None]
DeliveryCallback = Callable[[KafkaError | None, Message], None]


def new_producer(conf: ClientConfig, on_error: ErrorCallback) -> Producer:
    """A librdkafka producer whose logs go to the ``logsdk.librdkafka`` logger.

    A property librdkafka refuses (a typo, a bad value) raises `ConfigError`."""
    full: dict[str, Any] = dict(conf)
    full["error_cb"] = on_error
    full["logger"] = rdlog
    try:
        return _fork.Producer(full)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigError(f"kafka_config refused by librdkafka: {exc}") from exc


class Clients:
    """Where a producer's parts get their librdkafka clients: the first send() and each
    recovery make one (`new()`), a recovery has it connect before the replay
    (`connect()`). A port: ``wrap`` lets a test tool
    ([`logsdk.testing.producer_hooks()`][logsdk.testing.producer_hooks]) see or slow every client
    made from then on.

    Any thread may make a client; `wrap()` is for the thread that set the producer
    up, before the clients it should see are made (a list append, GIL-atomic)."""

    def __init__(self, conf: ClientConfig) -> None:
        self._conf = conf
        self._wrappers: list[Callable[[Any], Any]] = []

    def new(self, on_error: ErrorCallback) -> Producer:
        """A new client whose errors go to ``on_error``."""
        client = new_producer(self._conf, on_error)
        for wrap in list(self._wrappers):
            client = wrap(client)
        return client

    def wrap(self, wrapper: Callable[[Any], Any]) -> None:
        """Every client made from now on is ``wrapper(client)``: a stand-in that calls the
        real one (see the class docstring)."""
        self._wrappers.append(wrapper)

    @staticmethod
    def connect(client: Producer, topic: str, timeout: float, stop: threading.Event) -> None:
        """Have a new client connect to the cluster's brokers before a replay starts.

        An idempotent client sends nothing before the broker gives it a producer id, and
        librdkafka asks for one on a 500 ms timer unless a broker connection comes up
        meanwhile. Its first metadata answer comes through the bootstrap connection, which
        it then closes; the first attempt finds no broker up, and with the real broker not
        yet connected (librdkafka connects on demand) the id came 0.5 to 1 s after the
        client was built, measured: the whole replay window waited for it. A second
        metadata request needs a real broker connection; once that is up the id is asked
        at once (about 70 ms after the client was built instead of 500 to 1000).
        Best effort: a failure here only leaves librdkafka to its timer; a stop gives up.
        """
        for _ in range(2):
            try:
                list_topics_until(client, topic, timeout, stop)
            except KafkaException:
                return


def purge_without_waiting(client: Producer) -> None:
    """Purge every record ``client`` holds (queued and in flight) without waiting for its
    broker threads: their PURGED reports come through poll() as usual. A blocking purge
    waits, with no timeout, for every broker thread to answer, and one that cannot (see
    `logsdk._resolver`) would hold the caller for ever.

    confluent-kafka sets librdkafka's ``RD_KAFKA_PURGE_F_NON_BLOCKING`` when ``blocking``
    is *true* (``Producer_purge``, up to 2.16 at least), hence ``blocking=True`` here;
    tests/integration/test_client_purge.py reads librdkafka's own log line to pin it."""
    client.purge(in_queue=True, in_flight=True, blocking=True)


def check_config(conf: ClientConfig) -> None:
    """Raise `ConfigError` now if librdkafka refuses ``conf`` (a client is built
    and let go), rather than in the pump thread once a client is first needed. Skipped
    where no client can connect (`logsdk._resolver`): one built there could never
    be let go."""
    if not resolver_ready():
        return
    new_producer(conf, lambda err: None)


def probe(
    conf: ClientConfig, topic: str, timeout: float, stop: threading.Event | None = None
) -> bool:
    """One health probe: a fresh client asks for metadata; True when a leader answers.
    False at once where no client can connect (`logsdk._resolver`), and within
    ``_SLICE_S`` once ``stop`` is set."""
    if not resolver_ready():
        return False
    full: dict[str, Any] = dict(conf)
    full["logger"] = rdlog
    full.setdefault("socket.connection.setup.timeout.ms", max(1000, int(timeout * 1000)))
    admin = _fork.AdminClient(full)
    try:
        md = list_topics_until(admin, None, timeout, stop)
    except KafkaException:
        return False
    if not md.brokers:
        return False
    t = md.topics.get(topic)
    if t is None:
        return True  # the topic does not exist yet: producing will create it or fail loudly
    return t.error is None and all(p.leader >= 0 for p in t.partitions.values())


def client_probe(
    client: Producer, topic: str, timeout: float, stop: threading.Event | None = None
) -> bool:
    """A probe through an existing producer's connections (used while ONLINE)."""
    try:
        md = list_topics_until(client, topic, timeout, stop)
    except KafkaException:
        return False
    t = md.topics.get(topic)
    return bool(md.brokers) and t is not None and t.error is None
