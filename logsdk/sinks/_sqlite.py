"""SQLiteSink: records and offsets in one SQLite transaction, with zombie fencing.

Invariants:

- A batch's rows and its partition's next offset are written in one transaction, so
  the stored offset says exactly which records the table holds.
- Fencing is a compare-and-set on the stored offset: a batch that starts below the
  stored offset was already written by another owner, so it is refused (FencedError)
  and rolled back. Offsets may have holes (transaction markers, compaction), so a
  batch may start above the stored offset, never below it.
- A forked child never uses, closes or frees what it inherited from the parent (its
  connections, which SQLite forbids using across ``fork()``, and its locks, which a thread
  of the parent may have held at the fork): the sink starts afresh there, as a pickled
  copy does, and opens connections of its own.
- A write transaction runs inside the fork gate (`logsdk._sqlite.GATE`) from its
  BEGIN to its COMMIT or ROLLBACK, so no fork falls inside one: SQLite keeps the locks of
  a process's connections in that process's memory, and a child that inherited a write
  lock held by the parent's connection would find the database locked for good.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import sqlite_utils

from logsdk import _fork
from logsdk._owner import Owner
from logsdk._sqlite import GATE
from logsdk._sqlite import connect as gated_connect
from logsdk._sqlparams import blob_params
from logsdk.consumer._records import Record, RecordBatch, TopicPartition, columns_of
from logsdk.errors import ConfigError, FencedError, SinkError

PRODUCER_HEADER = "logsdk.producer"
SEQ_HEADER = "logsdk.seq"
_INT64 = 1 << 63
OFFSETS_TABLE = "logsdk_offsets"
SEEN_TABLE = "logsdk_seen"
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
#: Rows per multi-row INSERT (x 8 columns stays below SQLite's oldest 999-variable limit).
_ROWS_PER_INSERT = 64
#: (producer, seq) pairs per dedupe statement (2 variables each, below 999).
_DEDUPE_ROWS = 256
_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)


class _ThreadState(threading.local):
    """One thread's connection (owned by that thread: `Owner`) and
    the batches it staged for its next commit."""

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.owner: Owner | None = None
        self.staged: list[Sequence[Record]] = []


_T = TypeVar("_T")


def _wait_for_lock(exc: sqlite3.Error, deadline: float) -> bool:
    """True (after a short sleep) when ``exc`` is SQLite's "database is locked" and
    ``deadline`` has not passed: try again. Opening a new file in WAL mode and making its
    tables, from several processes at once, can get it at once, before ``busy_timeout``:
    SQLite skips the busy handler where waiting could deadlock (a reader upgrading to a
    writer, a journal mode changing). Seen with six processes making a sink on one new
    file: 35 of 180 failed in 30 rounds."""
    if not isinstance(exc, sqlite3.OperationalError) or "locked" not in str(exc):
        return False
    if time.monotonic() >= deadline:
        return False
    time.sleep(0.01)
    return True


class SQLiteSink:
    """A [`TransactionalHandler`][logsdk.TransactionalHandler] that stores records in an SQLite
    table.

    ``process`` only stages the records; ``commit(offsets)`` turns them into rows and
    writes the rows and the offsets in one ``BEGIN IMMEDIATE`` transaction; ``rollback``
    drops the staged records. It is called from several worker threads at once (one
    partition each): every thread has its own connection and its own staged batch, which
    that thread owns (checked at each use while ownership is checked, see
    `logsdk._owner`). Rows are built while this process's write lock is held: Python
    work done by other threads meanwhile would take the GIL from the writer after each row
    it inserts. The same lock guards the dedupe count and the producer-name cache.
    [`close()`][logsdk.sinks.SQLiteSink.close] closes every thread's connection: call it once no
    other thread is inside a call of the sink (after ``LogConsumer.stop()`` returned, or the
    streaming query stopped).

    With ``dedupe=True`` a record whose (``logsdk.producer``, ``logsdk.seq``) headers
    were already stored is skipped, which removes duplicates a producer sent
    (at-least-once on the wire).

    The constructor creates the database file and tables if missing. Picklable (for
    ``executor="process"``): a copy reconnects in the process that uses it.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        table: str = "records",
        dedupe: bool = False,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
    ) -> None:
        if not str(path) or str(path) == ":memory:":
            raise ConfigError("path must be a database file (':memory:' is not shared by threads)")
        if not table.isidentifier():
            raise ConfigError(f"table must be a plain identifier, got {table!r}")
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ConfigError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        if not 0 < busy_timeout <= 3600:
            raise ConfigError(f"busy_timeout must be seconds in (0, 3600], got {busy_timeout!r}")
        self.path = Path(path)
        self.table = table
        self.dedupe = dedupe
        self.synchronous = synchronous.upper()
        self.busy_timeout = float(busy_timeout)
        self._init_local()
        self._create_schema()
        _fork.call_in_child(self._forked)

    def _init_local(self) -> None:
        self._local = _ThreadState()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        # SQLite has one writer at a time; queueing this process's writers on a lock
        # avoids the busy handler's sleeps (up to 100 ms each) when threads collide.
        self._write_lock = threading.Lock()
        columns = "(topic, partition, offset, key, value, timestamp, producer, seq)"
        # key and value are bound as blob_params: see logsdk._sqlparams.
        row = "(?, ?, ?, ?, ?, ?, ?, ?)"
        self._insert = f"INSERT INTO [{self.table}] {columns} VALUES {row}"
        # Many rows per statement: one sqlite3 step (one GIL release) per _ROWS_PER_INSERT.
        self._insert_many = f"INSERT INTO [{self.table}] {columns} VALUES " + ", ".join(
            [row] * _ROWS_PER_INSERT
        )
        #: Records skipped by dedupe in this process.
        self.deduplicated = 0
        self._producers: dict[bytes, str] = {}  # producer header -> decoded name

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "table": self.table,
            "dedupe": self.dedupe,
            "synchronous": self.synchronous,
            "busy_timeout": self.busy_timeout,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_local()
        _fork.call_in_child(self._forked)

    def _forked(self) -> None:
        """In a forked child (one thread runs): the parent's connections and locks are
        kept, never used, closed or freed here; the sink starts afresh."""
        _fork.bury((self._conns, self._local, self._conns_lock, self._write_lock))
        self._init_local()

    def _connect(self) -> sqlite3.Connection:
        """The calling thread's connection, opened on its first call."""
        state = self._local
        conn = state.conn
        if conn is not None:
            assert state.owner is not None
            state.owner.check("use its SQLite connection")
            return conn
        conn = self._until_unlocked(self._open_connection, "cannot open SQLite database")
        state.conn = conn
        state.owner = Owner(f"SQLiteSink {self.path} connection")
        with self._conns_lock:
            self._conns.append(conn)
        return conn

    def _create_schema(self) -> None:
        """The tables, made in one write transaction taken up front (``BEGIN IMMEDIATE``):
        sinks of several processes made at once on a new file wait for each other within
        ``busy_timeout`` (see `_wait_for_lock()`)."""
        conn = self._connect()

        def create() -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._create_tables(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        self._until_unlocked(create, "cannot create tables in")

    def _open_connection(self) -> sqlite3.Connection:
        """A new connection in WAL mode with the sink's ``synchronous`` (closed again if
        a pragma fails)."""
        # check_same_thread=False only for close(), which closes every thread's
        # connection once they are done; each is used by its own thread alone.
        conn = gated_connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _until_unlocked(self, attempt: Callable[[], _T], what: str) -> _T:
        """``attempt()``, tried again while SQLite says "database is locked" before
        ``busy_timeout`` has passed (see `_wait_for_lock()`); any other error, or that one
        past the deadline, as `SinkError` ("<what> <path>: <error>")."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                return attempt()
            except sqlite3.Error as exc:
                if not _wait_for_lock(exc, deadline):
                    raise SinkError(f"{what} {self.path}: {exc}") from exc

    def _create_tables(self, conn: sqlite3.Connection) -> None:
        db = sqlite_utils.Database(conn)
        db.table(self.table).create(
            {
                "topic": str,
                "partition": int,
                "offset": int,
                "key": bytes,
                "value": bytes,
                "timestamp": int,
                "producer": str,
                "seq": int,
            },
            if_not_exists=True,
        )
        # Not unique on purpose: exactly-once comes from the offsets, and a
        # duplicate would show up in a count instead of being hidden.
        db.table(self.table).create_index(
            ["topic", "partition", "offset"], if_not_exists=True, find_unique_name=True
        )
        db.table(OFFSETS_TABLE).create(
            {"topic": str, "partition": int, "next_offset": int},
            pk=("topic", "partition"),
            if_not_exists=True,
        )
        if self.dedupe:
            db.table(SEEN_TABLE).create(
                {"producer": str, "seq": int}, pk=("producer", "seq"), if_not_exists=True
            )

    # -- the TransactionalHandler protocol ----------------------------------------------

    def process(self, records: Sequence[Record]) -> None:
        """Stage ``records`` for the next [`commit()`][logsdk.sinks.SQLiteSink.commit] on this
        thread."""
        # A RecordBatch is immutable; a caller's own list is copied.
        self._local.staged.append(records if isinstance(records, RecordBatch) else list(records))

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Write the staged rows and ``offsets`` in one transaction (FencedError if stale)."""
        state = self._local
        staged, state.staged = state.staged, []
        conn = self._connect()
        with self._write_lock:
            rows, first = self._rows(staged)
            GATE.run(self._commit, conn, offsets, rows, first)  # see the module docstring

    def _rows(
        self, staged: list[Sequence[Record]]
    ) -> tuple[list[tuple[Any, ...]], dict[TopicPartition, int]]:
        """The table rows of the staged records, and each partition's first offset."""
        rows: list[tuple[Any, ...]] = []
        first: dict[TopicPartition, int] = {}
        for records in staged:
            if not records:
                continue
            cols = records.columns() if isinstance(records, RecordBatch) else columns_of(records)
            topics, partitions, offsets = cols.topics, cols.partitions, cols.offsets
            n = len(offsets)
            if topics.count(topics[0]) == n and partitions.count(partitions[0]) == n:
                first.setdefault((topics[0], partitions[0]), offsets[0])
            else:
                for tp, offset in zip(zip(topics, partitions, strict=True), offsets, strict=True):
                    first.setdefault(tp, offset)
            producers, seqs = self._header_columns(cols.headers)
            rows.extend(
                zip(
                    topics,
                    partitions,
                    offsets,
                    blob_params(cols.keys),
                    blob_params(cols.values),
                    cols.timestamps,
                    producers,
                    seqs,
                    strict=True,
                )
            )
        return rows, first

    def _header_columns(
        self, headers: Sequence[list[tuple[str, bytes]]]
    ) -> tuple[list[str | None], list[int | None]]:
        """The producer and seq header of each record (the last of a name wins)."""
        producers: list[str | None] = []
        seqs: list[int | None] = []
        add_producer, add_seq = producers.append, seqs.append
        names = self._producers
        if len(names) > 10_000:
            names.clear()
        for hs in headers:
            producer = seq = None
            if hs:
                p: bytes | None
                v: bytes | None
                if len(hs) > 1 and hs[-1][0] == SEQ_HEADER and hs[-2][0] == PRODUCER_HEADER:
                    # How LogProducer sends them: last, in this order (so each is the last
                    # of its name), without building a dict.
                    p, v = hs[-2][1], hs[-1][1]
                else:
                    h = dict(hs)
                    p, v = h.get(PRODUCER_HEADER), h.get(SEQ_HEADER)
                if p is not None:
                    producer = names.get(p)
                    if producer is None:
                        producer = names[p] = p.decode("utf-8", "replace")
                if v is not None:
                    try:
                        seq = int(v)
                    except (TypeError, ValueError):
                        seq = None
                    if seq is not None and not -_INT64 <= seq < _INT64:
                        seq = None  # no seq LogProducer writes, nor SQLite holds: no dedupe
            add_producer(producer)
            add_seq(seq)
        return producers, seqs

    def _commit(
        self,
        conn: sqlite3.Connection,
        offsets: dict[TopicPartition, int],
        rows: list[tuple[Any, ...]],
        first: dict[TopicPartition, int],
    ) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
            for (topic, partition), next_offset in offsets.items():
                got = conn.execute(
                    f"SELECT next_offset FROM {OFFSETS_TABLE} WHERE topic = ? AND partition = ?",
                    (topic, partition),
                ).fetchone()
                stored = None if got is None else int(got[0])
                start = first.get((topic, partition))
                if stored is not None and (
                    (start is not None and start < stored)
                    or (start is None and next_offset <= stored)
                ):
                    raise FencedError(
                        f"{topic}[{partition}] is stored up to {stored}, but this batch starts at "
                        f"{start if start is not None else next_offset}: another owner wrote it"
                    )
                conn.execute(
                    f"INSERT INTO {OFFSETS_TABLE} (topic, partition, next_offset) "
                    "VALUES (?, ?, ?) ON CONFLICT (topic, partition) "
                    "DO UPDATE SET next_offset = excluded.next_offset",
                    (topic, partition, next_offset),
                )
            dropped = 0
            if self.dedupe:
                kept = self._dedupe(conn, rows)
                dropped, rows = len(rows) - len(kept), kept
            self._insert_rows(conn, rows)
            conn.execute("COMMIT")
            self.deduplicated += dropped  # counted once committed, not when rolled back
        except FencedError:
            self._rollback(conn)
            raise
        except sqlite3.Error as exc:
            self._rollback(conn)
            raise SinkError(f"SQLite commit to {self.path} failed: {exc}") from exc

    def _insert_rows(self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
        k = _ROWS_PER_INSERT
        full = len(rows) - len(rows) % k
        if full:
            conn.executemany(
                self._insert_many,
                [tuple(chain.from_iterable(rows[i : i + k])) for i in range(0, full, k)],
            )
        if full < len(rows):
            conn.executemany(self._insert, rows[full:])

    def _dedupe(
        self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]]
    ) -> list[tuple[Any, ...]]:
        """The rows whose (producer, seq) was not stored yet (the first of a pair repeated
        within ``rows``), each pair stored now; rows without both headers are all kept.

        One multi-row ``INSERT OR IGNORE ... RETURNING`` per _DEDUPE_ROWS pairs: SQLite
        returns the pairs it inserted, never the ones it ignored (one statement per row
        released and re-took the GIL for each)."""
        if not _RETURNING:
            return self._dedupe_row_by_row(conn, rows)
        pairs = [(r[6], r[7]) for r in rows if r[6] is not None and r[7] is not None]
        new: set[tuple[str, int]] = set()
        for i in range(0, len(pairs), _DEDUPE_ROWS):
            chunk = pairs[i : i + _DEDUPE_ROWS]
            sql = (
                f"INSERT OR IGNORE INTO {SEEN_TABLE} (producer, seq) VALUES "
                + ", ".join(["(?, ?)"] * len(chunk))
                + " RETURNING producer, seq"
            )
            new.update(conn.execute(sql, list(chain.from_iterable(chunk))).fetchall())
        kept = []
        for row in rows:
            pair = (row[6], row[7])
            if pair[0] is not None and pair[1] is not None:
                if pair not in new:
                    continue
                new.discard(pair)  # a second copy within this batch is a duplicate too
            kept.append(row)
        return kept

    @staticmethod
    def _dedupe_row_by_row(
        conn: sqlite3.Connection, rows: list[tuple[Any, ...]]
    ) -> list[tuple[Any, ...]]:
        """`_dedupe()` for SQLite before 3.35 (no RETURNING): one statement a row."""
        kept = []
        for row in rows:
            producer, seq = row[6], row[7]
            if producer is not None and seq is not None:
                cur = conn.execute(
                    f"INSERT OR IGNORE INTO {SEEN_TABLE} (producer, seq) VALUES (?, ?)",
                    (producer, seq),
                )
                if cur.rowcount == 0:
                    continue
            kept.append(row)
        return kept

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    def rollback(self, error: BaseException) -> None:
        """Drop this thread's staged records (and any open transaction)."""
        state = self._local
        state.staged = []
        conn = state.conn
        if conn is not None:
            assert state.owner is not None
            state.owner.check("roll back on its SQLite connection")
            try:
                self._rollback(conn)
            except sqlite3.Error as exc:
                raise SinkError(f"SQLite rollback failed: {exc}") from exc

    def stored_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The stored next offset of each partition that has one."""
        conn = self._connect()
        out = {}
        try:
            for topic, partition in partitions:
                got = conn.execute(
                    f"SELECT next_offset FROM {OFFSETS_TABLE} WHERE topic = ? AND partition = ?",
                    (topic, partition),
                ).fetchone()
                if got is not None:
                    out[(topic, partition)] = int(got[0])
        except sqlite3.Error as exc:
            raise SinkError(f"cannot read stored offsets from {self.path}: {exc}") from exc
        return out

    # -- helpers -------------------------------------------------------------------------

    def count(self) -> int:
        """Rows in the table."""
        row = self._connect().execute(f"SELECT count(*) FROM [{self.table}]").fetchone()
        return int(row[0])

    def close(self) -> None:
        """Close every connection this sink opened (in this process)."""
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._local = _ThreadState()

    def __enter__(self) -> SQLiteSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
