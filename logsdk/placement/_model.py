"""The cluster model: brokers (id, rack, weight, pool) and topics; loading and validation."""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from logsdk.errors import PlacementError

#: ``{topic: {partition: [broker ids]}}``; the first broker of a list is the preferred leader.
Assignment: TypeAlias = dict[str, dict[int, list[int]]]


@dataclass(frozen=True)
class Broker:
    """One broker: its id, rack (failure domain), relative weight and resource pool."""

    id: int
    rack: str | None = None
    weight: float = 1.0
    pool: str | None = None
    host: str | None = None

    @property
    def name(self) -> str:
        """The name hashed onto the ring (``broker-<id>``; hosts may carry several brokers)."""
        return f"broker-{self.id}"

    @property
    def domain(self) -> str:
        """The failure domain: the rack, or the broker itself when it has no rack."""
        return self.rack if self.rack is not None else f"broker-{self.id}"


@dataclass(frozen=True)
class Topic:
    """One topic: its partition count, replication factor and, optionally, pool."""

    name: str
    partitions: int
    replication_factor: int
    pool: str | None = None


@dataclass(frozen=True)
class Cluster:
    """Brokers and topics; ``validate()`` checks ids, weights and sizes."""

    brokers: tuple[Broker, ...]
    topics: tuple[Topic, ...] = ()
    #: the current assignment, when known (read from a file or a live cluster)
    current: Assignment = field(default_factory=dict, compare=False)

    def validate(self) -> Cluster:
        """Raise `PlacementError` naming the first bad broker or topic; return self."""
        if not self.brokers:
            raise PlacementError("the cluster has no brokers")
        seen: set[int] = set()
        for b in self.brokers:
            if b.id in seen:
                raise PlacementError(f"duplicate broker id {b.id}")
            seen.add(b.id)
            if b.id < 0:
                raise PlacementError(f"broker {b.id}: id must be >= 0")
            if not (math.isfinite(b.weight) and b.weight > 0):
                raise PlacementError(f"broker {b.id}: weight must be > 0, got {b.weight}")
        names: set[str] = set()
        for t in self.topics:
            if not t.name:
                raise PlacementError("a topic has an empty name")
            if t.name in names:
                raise PlacementError(f"duplicate topic {t.name!r}")
            names.add(t.name)
            if t.partitions < 1:
                raise PlacementError(f"topic {t.name!r}: partitions must be >= 1")
            if t.replication_factor < 1:
                raise PlacementError(f"topic {t.name!r}: replication factor must be >= 1")
        return self

    @property
    def broker_ids(self) -> list[int]:
        """Broker ids, sorted."""
        return sorted(b.id for b in self.brokers)

    def broker(self, broker_id: int) -> Broker:
        """The broker with this id."""
        for b in self.brokers:
            if b.id == broker_id:
                return b
        raise PlacementError(f"unknown broker {broker_id}")

    @property
    def pools(self) -> list[str]:
        """The pools named by brokers, sorted."""
        return sorted({b.pool for b in self.brokers if b.pool is not None})

    def pool_brokers(self, pool: str | None) -> list[Broker]:
        """Brokers a topic of ``pool`` may use (all brokers for ``None``), sorted by id."""
        if pool is None:
            return sorted(self.brokers, key=lambda b: b.id)
        members = sorted((b for b in self.brokers if b.pool == pool), key=lambda b: b.id)
        if not members:
            known = ", ".join(self.pools) or "none"
            raise PlacementError(f"unknown pool {pool!r} (pools with brokers: {known})")
        return members

    def with_brokers(self, brokers: Iterable[Broker]) -> Cluster:
        """The same topics and current assignment on another broker set."""
        return Cluster(tuple(brokers), self.topics, self.current)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form read by `cluster_from_dict()`."""
        out: dict[str, Any] = {
            "brokers": [_broker_dict(b) for b in sorted(self.brokers, key=lambda b: b.id)],
            "topics": [_topic_dict(t) for t in self.topics],
        }
        if self.current:
            out["assignment"] = {
                t: {str(p): r for p, r in sorted(parts.items())}
                for t, parts in sorted(self.current.items())
            }
        return out


def _broker_dict(b: Broker) -> dict[str, Any]:
    d: dict[str, Any] = {"id": b.id}
    if b.rack is not None:
        d["rack"] = b.rack
    if b.weight != 1.0:
        d["weight"] = b.weight
    if b.pool is not None:
        d["pool"] = b.pool
    if b.host is not None:
        d["host"] = b.host
    return d


def _topic_dict(t: Topic) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": t.name,
        "partitions": t.partitions,
        "replication_factor": t.replication_factor,
    }
    if t.pool is not None:
        d["pool"] = t.pool
    return d


def _field(obj: Mapping[str, Any], key: str, kind: type, where: str, default: Any = ...) -> Any:
    if key not in obj or obj[key] is None:
        if default is ...:
            raise PlacementError(f"{where}: missing {key!r}")
        return default
    value = obj[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise PlacementError(f"{where}: {key!r} must be {kind.__name__}, got {value!r}")
    return value


def broker_from_dict(obj: Mapping[str, Any]) -> Broker:
    """One broker from ``{"id": 0, "rack": "a", "weight": 1, "pool": "p", "host": "h"}``."""
    if not isinstance(obj, Mapping):
        raise PlacementError(f"a broker must be an object, got {obj!r}")
    bid = _field(obj, "id", int, "broker")
    where = f"broker {bid}"
    rack = _field(obj, "rack", str, where, None)
    return Broker(
        id=bid,
        rack=rack,
        weight=_field(obj, "weight", float, where, 1.0),
        pool=_field(obj, "pool", str, where, None),
        host=_field(obj, "host", str, where, None),
    )


def topic_from_dict(obj: Mapping[str, Any]) -> Topic:
    """One topic from ``{"name": "t", "partitions": 6, "replication_factor": 3, "pool": "p"}``."""
    if not isinstance(obj, Mapping):
        raise PlacementError(f"a topic must be an object, got {obj!r}")
    name = _field(obj, "name", str, "topic")
    where = f"topic {name!r}"
    return Topic(
        name=name,
        partitions=_field(obj, "partitions", int, where),
        replication_factor=_field(obj, "replication_factor", int, where),
        pool=_field(obj, "pool", str, where, None),
    )


def _partition_id(topic: str, value: Any) -> int:
    """A partition number: an int, or digits (JSON object keys are strings)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise PlacementError(f"topic {topic!r}: partition {value!r} is not a partition number")


def _replica_list(where: str, value: Any) -> list[int]:
    """A non-empty list of distinct broker ids (ints >= 0, not bools)."""
    if not isinstance(value, list):
        raise PlacementError(f"{where}: replicas must be a list of broker ids, got {value!r}")
    if not value:
        raise PlacementError(f"{where}: no replicas")
    for r in value:
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise PlacementError(f"{where}: replica {r!r} is not a broker id")
    if len(set(value)) != len(value):
        dup = next(r for r in value if value.count(r) > 1)
        raise PlacementError(f"{where}: broker {dup} holds two replicas: {value}")
    return list(value)


def _add_partition(out: Assignment, topic: Any, part: Any, replicas: Any) -> None:
    if not isinstance(topic, str) or not topic:
        raise PlacementError(f"a topic name must be a non-empty string, got {topic!r}")
    p = _partition_id(topic, part)
    parts = out.setdefault(topic, {})
    if p in parts:
        raise PlacementError(f"{topic}-{p} is listed twice")
    parts[p] = _replica_list(f"{topic}-{p}", replicas)


def assignment_from_obj(obj: Any) -> Assignment:
    """An assignment from ``{topic: {partition: [ids]}}`` or Kafka's reassignment JSON.

    Partitions are ints (or digit strings), replicas non-empty lists of distinct broker
    ids; a partition listed twice, or anything else, raises `PlacementError`.
    """
    out: Assignment = {}
    if isinstance(obj, Mapping) and "partitions" in obj and isinstance(obj["partitions"], list):
        for entry in obj["partitions"]:
            if not isinstance(entry, Mapping) or not {"topic", "partition", "replicas"} <= set(
                entry
            ):
                raise PlacementError(
                    f"bad reassignment entry {entry!r}: needs topic, partition and replicas"
                )
            _add_partition(out, entry["topic"], entry["partition"], entry["replicas"])
        return out
    if not isinstance(obj, Mapping):
        raise PlacementError(
            "an assignment must be an object: {topic: {partition: [broker ids]}} or "
            'Kafka\'s {"version": 1, "partitions": [...]}'
        )
    for topic, parts in obj.items():
        if not isinstance(parts, Mapping):
            raise PlacementError(
                f"topic {topic!r}: expected {{partition: [broker ids]}}, got {parts!r}"
            )
        for part, replicas in parts.items():
            _add_partition(out, topic, part, replicas)
    return out


def cluster_from_dict(obj: Mapping[str, Any]) -> Cluster:
    """A validated cluster from ``{"brokers": [...], "topics": [...], "assignment": {...}}``."""
    if not isinstance(obj, Mapping) or "brokers" not in obj:
        raise PlacementError('a cluster file needs a "brokers" list')
    brokers = tuple(broker_from_dict(b) for b in _list_field(obj, "brokers", "broker"))
    topics: tuple[Topic, ...] = ()
    if obj.get("topics") is not None:
        topics = tuple(topic_from_dict(t) for t in _list_field(obj, "topics", "topic"))
    current = assignment_from_obj(obj["assignment"]) if obj.get("assignment") is not None else {}
    return Cluster(brokers, topics, current).validate()


def _list_field(obj: Mapping[str, Any], key: str, item: str) -> list[Any]:
    value = obj[key]
    if not isinstance(value, list):
        raise PlacementError(f'"{key}" must be a list of {item} objects, got {value!r}')
    return value


def load_document(path: str | Path) -> Any:
    """Parse a JSON file, or YAML (``.yaml``/``.yml``) when PyYAML is installed."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlacementError(f"cannot read {p}: {exc.strerror or exc}") from exc
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            yaml = importlib.import_module("yaml")
        except ImportError as exc:
            raise PlacementError(
                f"{p}: YAML needs PyYAML (pip install pyyaml); or use JSON"
            ) from exc
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PlacementError(f"{p}: bad YAML: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlacementError(f"{p}: bad JSON: {exc}") from exc


def load_cluster(path: str | Path) -> Cluster:
    """Load and validate a cluster model from a JSON (or YAML) file."""
    return cluster_from_dict(load_document(path))


def load_assignment(path: str | Path) -> Assignment:
    """Load an assignment: Kafka's reassignment JSON or ``{topic: {partition: [ids]}}``."""
    return assignment_from_obj(load_document(path))


def make_brokers(
    ids: Sequence[int],
    racks: Sequence[str] | None = None,
    weights: Mapping[int, float] | None = None,
) -> tuple[Broker, ...]:
    """Brokers with racks dealt round-robin from ``racks`` and optional weights by id."""
    weights = weights or {}
    return tuple(
        Broker(i, rack=racks[n % len(racks)] if racks else None, weight=weights.get(i, 1.0))
        for n, i in enumerate(ids)
    )
