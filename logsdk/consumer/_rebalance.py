"""The three rebalance protocols LogConsumer runs under, as data: what each sets in the
librdkafka configuration, what it refuses, and whether its assignments are incremental.

- ``eager``: the classic protocol with an eager assignor (``range``, ``roundrobin``).
  Every rebalance revokes every partition of every member, then hands them all out again.
- ``cooperative``: the classic protocol with the ``cooperative-sticky`` assignor (KIP-429).
  A rebalance revokes only the partitions that move (a second round then assigns them);
  the rest stay assigned and keep being fetched.
- ``consumer``: Kafka's consumer group protocol (KIP-848, ``group.protocol=consumer``,
  Kafka 4.0+ enables it on the broker by default). The broker assigns
  (``group.remote.assignor``) and sends each member its changes through heartbeats; the
  session and heartbeat timings are the broker's (``group.consumer.*``).

Under the last two the rebalance callbacks get the partitions added or taken (deltas),
answered with ``incremental_assign`` / ``incremental_unassign``; under ``eager`` they get
whole assignments, answered with ``assign`` / ``unassign``.

Pure functions of a configuration dict: no I/O, no state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from logsdk._types import ClientConfig
from logsdk.errors import ConfigError

#: The values of ``LogConsumer(rebalance=...)``.
REBALANCES = ("eager", "cooperative", "consumer")

#: The default: every broker speaks the classic protocol (Kafka before 4.0, the embedded
#: test broker, librdkafka's mock cluster), and its cooperative assignor moves only the
#: partitions balance needs (docs/engineering/benchmarks.md, "Rebalancing").
DEFAULT_REBALANCE = "cooperative"

_EAGER_ASSIGNORS = frozenset({"range", "roundrobin"})
_COOPERATIVE_ASSIGNORS = frozenset({"cooperative-sticky"})


@dataclass(frozen=True)
class Protocol:
    """One rebalance protocol: what LogConsumer sets, allows and refuses for it."""

    name: str
    #: Rebalance callbacks get deltas (incremental_assign / incremental_unassign).
    incremental: bool
    #: librdkafka properties LogConsumer sets (a user's equal value is accepted).
    sets: dict[str, str]
    #: Accepted ``partition.assignment.strategy`` assignors (empty: the property is refused).
    assignors: frozenset[str]
    #: Properties the protocol refuses, each with what to do instead.
    refuses: dict[str, str] = field(default_factory=dict)


_CLASSIC_ONLY = "the broker assigns only under rebalance='consumer'"

PROTOCOLS: dict[str, Protocol] = {
    "eager": Protocol(
        "eager",
        incremental=False,
        sets={"group.protocol": "classic"},
        assignors=_EAGER_ASSIGNORS,
        refuses={"group.remote.assignor": _CLASSIC_ONLY},
    ),
    "cooperative": Protocol(
        "cooperative",
        incremental=True,
        sets={"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky"},
        assignors=_COOPERATIVE_ASSIGNORS,
        refuses={"group.remote.assignor": _CLASSIC_ONLY},
    ),
    "consumer": Protocol(
        "consumer",
        incremental=True,
        sets={"group.protocol": "consumer"},
        assignors=frozenset(),
        # What librdkafka 2.16 refuses with group.protocol=consumer (checked one by one).
        refuses={
            "partition.assignment.strategy": (
                "the broker assigns: choose its assignor with group.remote.assignor "
                "('uniform' or 'range')"
            ),
            "session.timeout.ms": "the broker sets it (group.consumer.session.timeout.ms)",
            "heartbeat.interval.ms": "the broker sets it (group.consumer.heartbeat.interval.ms)",
            "group.protocol.type": "it applies to the classic protocol only",
        },
    ),
}


def apply_rebalance(config: ClientConfig, rebalance: object) -> Protocol:
    """Check ``config`` (a copy the caller owns) against ``rebalance`` and set what the
    protocol needs in it; returns the protocol. Raises `ConfigError` naming the
    first property the protocol refuses or contradicts."""
    if rebalance not in REBALANCES:
        raise ConfigError(f"rebalance must be one of {REBALANCES}, got {rebalance!r}")
    protocol = PROTOCOLS[str(rebalance)]
    for key, why in protocol.refuses.items():
        if key in config:
            raise ConfigError(
                f"kafka_config[{key!r}] is refused with rebalance={protocol.name!r}: {why}; "
                "remove it"
            )
    given = str(config.get("group.protocol", protocol.sets["group.protocol"])).lower()
    if given != protocol.sets["group.protocol"]:
        other = "consumer" if given == "consumer" else "eager' or 'cooperative"
        raise ConfigError(
            f"kafka_config['group.protocol']={config['group.protocol']!r} contradicts "
            f"rebalance={protocol.name!r}: remove it (rebalance sets it; pass "
            f"rebalance='{other}' for that protocol)"
        )
    if "partition.assignment.strategy" in config:
        raw = str(config["partition.assignment.strategy"])
        assignors = {a.strip().lower() for a in raw.split(",") if a.strip()}
        if not assignors or not assignors <= protocol.assignors:
            hint = (
                "rebalance='cooperative' for cooperative-sticky"
                if protocol.name == "eager"
                else "rebalance='eager' for range or roundrobin"
            )
            raise ConfigError(
                f"kafka_config['partition.assignment.strategy']={raw!r} is refused with "
                f"rebalance={protocol.name!r} (it takes {', '.join(sorted(protocol.assignors))}): "
                f"pass {hint}"
            )
    config.update(protocol.sets)
    return protocol
