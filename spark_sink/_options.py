"""Options of the ``logsdk-kafka`` source and offset planning: pure Python, no Spark, no I/O.

Offsets travel through Spark's checkpoint as JSON ``{"topic": {"partition": offset}}``
(the shape of Spark's own Kafka source). Spark compares a new end offset with the last
one *as a string*, so every offset dict handed to Spark is built by `to_json_dict()`:
topics sorted, partitions sorted numerically, keys strings. Two equal offset maps
therefore always serialise to the same text; otherwise Spark sees a "new" offset and
runs empty batches forever.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from logsdk._types import ClientConfig
from logsdk.errors import SparkSourceError

#: (topic, partition)
TP = tuple[str, int]

#: Offsets in ``startingOffsets``/``endingOffsets`` JSON with Spark's meaning.
EARLIEST = -2
LATEST = -1

# librdkafka settings the source owns: it reads by assign + explicit offsets and never
# commits, so these would change nothing or break the exactly-once bookkeeping.
_FORBIDDEN_KAFKA = {
    "kafka.auto.offset.reset": "use the startingOffsets option",
    "kafka.enable.auto.commit": "the source never commits; offsets live in Spark's checkpoint",
    "kafka.enable.auto.offset.store": "the source never commits",
    "kafka.group.instance.id": "the source joins no group",
    "kafka.enable.partition.eof": "the source needs end-of-partition events to finish a range",
}

_KNOWN = (
    "subscribe",
    "subscribepattern",
    "startingoffsets",
    "endingoffsets",
    "maxoffsetspertrigger",
    "failondataloss",
    "minpartitions",
    "includeheaders",
    "kafkaconsumer.polltimeoutms",
    "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
)

# Options Spark itself may put into a source's options (``load(path)``).
_SPARK_OWN = ("path",)


@dataclass(frozen=True)
class SourceOptions:
    """The validated options of one ``logsdk-kafka`` source."""

    kafka: ClientConfig
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    #: None: not given ("latest" for a stream, "earliest" for a batch read, as in Spark).
    starting: str | dict[TP, int] | None = None
    ending: str | dict[TP, int] = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    include_headers: bool = True
    poll_timeout_s: float = 120.0
    #: Retries of the driver's metadata / offsets requests after a transient error.
    fetch_retries: int = 3
    retry_interval_s: float = 1.0

    @property
    def bootstrap_servers(self) -> str:
        return str(self.kafka["bootstrap.servers"])

    def __repr__(self) -> str:
        # Never the raw kafka settings: they may hold a SASL password.
        from logsdk.producer._config import redacted

        return (
            f"SourceOptions(kafka={redacted(self.kafka)!r}, topics={self.topics!r}, "
            f"pattern={self.pattern!r}, starting={self.starting!r}, ending={self.ending!r})"
        )

    def matches(self, topic: str) -> bool:
        """True when ``topic`` is in the subscription."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics

    def describe(self) -> str:
        """How the subscription was given, for error messages."""
        if self.pattern is not None:
            return f"subscribePattern {self.pattern!r}"
        return f"subscribe {','.join(self.topics)!r}"


def _bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    raise SparkSourceError(f"option {name} must be 'true' or 'false', got {text!r}")


def _int_option(name: str, text: str, *, lowest: int = 1) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = lowest - 1
    if value < lowest:
        kind = "a positive integer" if lowest == 1 else f"an integer >= {lowest}"
        raise SparkSourceError(f"option {name} must be {kind}, got {text!r}")
    return value


def parse_offsets_json(name: str, text: str, *, batch_end: bool = False) -> dict[TP, int]:
    """``{"topic": {"0": 23, "1": -2}}`` -> ``{("topic", 0): 23, ("topic", 1): -2}``.

    -2 means earliest, -1 latest (as in Spark); ``batch_end`` rejects -2 (an
    ``endingOffsets`` of earliest reads nothing).
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SparkSourceError(
            f"option {name} is neither 'earliest', 'latest' nor valid JSON "
            f'({exc}); expected e.g. {{"topic": {{"0": 23, "1": -2}}}}'
        ) from exc
    if not isinstance(doc, dict) or not doc:
        raise SparkSourceError(
            f'option {name} JSON must be a non-empty object {{"topic": {{"partition": offset}}}}, '
            f"got {text!r}"
        )
    out: dict[TP, int] = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict) or not parts:
            raise SparkSourceError(
                f"option {name}: topic {topic!r} must map to a non-empty object "
                f"{{partition: offset}}, got {parts!r}"
            )
        for p, off in parts.items():
            try:
                partition = int(p)
            except (TypeError, ValueError):
                partition = -1
            if partition < 0:
                raise SparkSourceError(
                    f"option {name}: partition {p!r} of topic {topic!r} is not a partition number"
                )
            lowest = LATEST if batch_end else EARLIEST
            if isinstance(off, bool) or not isinstance(off, int) or off < lowest:
                raise SparkSourceError(
                    f"option {name}: offset {off!r} of {topic}[{partition}] must be an integer "
                    f">= 0, or {EARLIEST} (earliest) / {LATEST} (latest)"
                    + (" (earliest is not an ending offset)" if batch_end else "")
                )
            out[(topic, partition)] = off
    return out


def _offsets_option(name: str, text: str, *, batch_end: bool = False) -> str | dict[TP, int]:
    low = text.strip().lower()
    if low == "latest" or (low == "earliest" and not batch_end):
        return low
    if low == "earliest":
        raise SparkSourceError(f"option {name} cannot be 'earliest'; use 'latest' or JSON")
    return parse_offsets_json(name, text, batch_end=batch_end)


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the options given to ``spark.readStream.format("logsdk-kafka")``.

    Option names are case-insensitive (Spark lower-cases them). Raises
    [`SparkSourceError`][logsdk.errors.SparkSourceError] naming the option at fault.
    """
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    kafka: ClientConfig = {}
    for key, value in opts.items():
        if key.startswith("kafka."):
            if key in _FORBIDDEN_KAFKA:
                raise SparkSourceError(f"option {key} is not supported: {_FORBIDDEN_KAFKA[key]}")
            kafka[key[len("kafka.") :]] = value
        elif key not in _KNOWN and key not in _SPARK_OWN:
            raise SparkSourceError(
                f"unknown option {key!r} for logsdk-kafka; known options: "
                f"kafka.bootstrap.servers (and any kafka.<librdkafka setting>), subscribe, "
                "subscribePattern, startingOffsets, endingOffsets, maxOffsetsPerTrigger, "
                "failOnDataLoss, minPartitions, includeHeaders, kafkaConsumer.pollTimeoutMs, "
                "fetchOffset.numRetries, fetchOffset.retryIntervalMs"
            )
    if not str(kafka.get("bootstrap.servers", "")).strip():
        raise SparkSourceError("option kafka.bootstrap.servers is required (host:port,...)")

    subscribe = opts.get("subscribe")
    pattern = opts.get("subscribepattern")
    if (subscribe is None) == (pattern is None):
        raise SparkSourceError("give exactly one of the options subscribe or subscribePattern")
    topics: tuple[str, ...] = ()
    if subscribe is not None:
        topics = tuple(sorted({t.strip() for t in subscribe.split(",") if t.strip()}))
        if not topics:
            raise SparkSourceError(f"option subscribe names no topic: {subscribe!r}")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SparkSourceError(
                f"option subscribePattern is not a valid regex: {pattern!r} ({exc})"
            ) from exc

    starting = (
        _offsets_option("startingOffsets", opts["startingoffsets"])
        if "startingoffsets" in opts
        else None
    )
    ending = _offsets_option("endingOffsets", opts.get("endingoffsets", "latest"), batch_end=True)
    result = SourceOptions(
        kafka=kafka,
        topics=topics,
        pattern=pattern,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=(
            _int_option("maxOffsetsPerTrigger", opts["maxoffsetspertrigger"])
            if "maxoffsetspertrigger" in opts
            else None
        ),
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        min_partitions=(
            _int_option("minPartitions", opts["minpartitions"]) if "minpartitions" in opts else None
        ),
        include_headers=_bool("includeHeaders", opts.get("includeheaders", "true")),
        poll_timeout_s=_int_option(
            "kafkaConsumer.pollTimeoutMs", opts.get("kafkaconsumer.polltimeoutms", "120000")
        )
        / 1000.0,
        fetch_retries=_int_option(
            "fetchOffset.numRetries", opts.get("fetchoffset.numretries", "3"), lowest=0
        ),
        retry_interval_s=_int_option(
            "fetchOffset.retryIntervalMs", opts.get("fetchoffset.retryintervalms", "1000")
        )
        / 1000.0,
    )
    for name, given in (("startingOffsets", starting), ("endingOffsets", ending)):
        if isinstance(given, dict):
            stray = sorted({t for t, _ in given if not result.matches(t)})
            if stray:
                raise SparkSourceError(
                    f"option {name} names topics {stray} that are not in {result.describe()}"
                )
    return result


# -- offsets as Spark sees them -----------------------------------------------------------


def to_json_dict(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """The canonical offset dict for Spark: topics sorted, partitions sorted numerically."""
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def from_json_dict(doc: Mapping[str, Any]) -> dict[TP, int]:
    """The inverse of `to_json_dict()` (accepts any key order)."""
    out: dict[TP, int] = {}
    for topic, parts in doc.items():
        for p, off in parts.items():
            out[(str(topic), int(p))] = int(off)
    return out


def limit_end(
    start: Mapping[TP, int], latest: Mapping[TP, int], max_rows: int | None
) -> dict[TP, int]:
    """End offsets of the next batch: ``latest``, capped at ``max_rows`` records in all.

    ``start`` must hold every partition of ``latest``. The budget is shared in
    proportion to each partition's backlog (as Spark's Kafka source does); the
    remainder goes to the largest backlogs first, so a budget smaller than the number
    of partitions still makes progress. A partition never goes back.
    """
    backlog = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        return {tp: start[tp] + backlog[tp] for tp in latest}
    share = {tp: backlog[tp] * max_rows // total for tp in latest}
    left = max_rows - sum(share.values())
    for tp in sorted(latest, key=lambda t: (-(backlog[t] - share[t]), t)):
        if left <= 0:
            break
        if share[tp] < backlog[tp]:
            share[tp] += 1
            left -= 1
    return {tp: start[tp] + share[tp] for tp in latest}


@dataclass(frozen=True)
class OffsetRange:
    """Records ``[start, end)`` of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split big ranges so there are at least ``min_partitions`` of them (Spark's rule).

    Each range gets a number of pieces in proportion to its size; small ranges stay
    whole. Without ``min_partitions``, or with enough ranges already, nothing changes.
    """
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        pieces = max(1, min(r.size, round(r.size * min_partitions / total)))
        step, extra = divmod(r.size, pieces)
        at = r.start
        for i in range(pieces):
            nxt = at + step + (1 if i < extra else 0)
            out.append(OffsetRange(r.topic, r.partition, at, nxt))
            at = nxt
    return out
