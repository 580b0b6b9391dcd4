"""Kafka's reassignment JSON and a human-readable diff of two assignments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from logsdk.placement._metrics import AssignmentLike, moved_replicas


def changed_partitions(
    current: AssignmentLike | None, proposed: AssignmentLike
) -> list[tuple[str, int, list[int]]]:
    """``(topic, partition, replicas)`` of ``proposed`` unlike ``current`` (all if None)."""
    out = []
    for topic in sorted(proposed):
        for p in sorted(proposed[topic]):
            reps = list(proposed[topic][p])
            if current is None or list(current.get(topic, {}).get(p, [])) != reps:
                out.append((topic, p, reps))
    return out


def reassignment_json(
    proposed: AssignmentLike, current: AssignmentLike | None = None
) -> dict[str, Any]:
    """The file ``kafka-reassign-partitions.sh --execute --reassignment-json-file`` reads.

    With ``current``, only the partitions that change are listed.
    """
    return {
        "version": 1,
        "partitions": [
            {"topic": t, "partition": p, "replicas": reps}
            for t, p, reps in changed_partitions(current, proposed)
        ],
    }


def _fmt(reps: Sequence[int]) -> str:
    return "[" + ", ".join(str(b) for b in reps) + "]"


def format_diff(current: AssignmentLike, proposed: AssignmentLike) -> str:
    """One line per changed partition, then a summary line.

    ``logs-3: [1, 2, 3] -> [1, 2, 13]  +13 -3``; a reorder shows ``leader 1 -> 2``.
    """
    lines = []
    total = 0
    for topic in sorted(proposed):
        for p in sorted(proposed[topic]):
            new = list(proposed[topic][p])
            total += len(new)
            old = list(current.get(topic, {}).get(p, []))
            if old == new:
                continue
            if not old:
                lines.append(f"{topic}-{p}: new {_fmt(new)}")
                continue
            notes = [f"+{b}" for b in new if b not in old] + [f"-{b}" for b in old if b not in new]
            if new and old[0] != new[0]:
                notes.append(f"leader {old[0]} -> {new[0]}")
            lines.append(f"{topic}-{p}: {_fmt(old)} -> {_fmt(new)}  {' '.join(notes)}")
    moved, leaders = moved_replicas(current, proposed)
    share = f" ({100.0 * moved / total:.1f}%)" if total else ""
    lines.append(
        f"{len(lines)} partitions change; {moved} of {total} replicas move{share}; "
        f"{leaders} preferred leaders change"
    )
    return "\n".join(lines)


def assignment_to_json(assignment: Mapping[str, Mapping[int, Sequence[int]]]) -> dict[str, Any]:
    """``{topic: {"partition": [ids]}}`` with string keys, for JSON."""
    return {
        t: {str(p): list(r) for p, r in sorted(parts.items())}
        for t, parts in sorted(assignment.items())
    }
