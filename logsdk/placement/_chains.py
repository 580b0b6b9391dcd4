"""Chains of moves among brokers: the shortest one to a broker with room, and the leader
balancing built on it (replicas reordered within partitions, no data moved)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

L = TypeVar("L")  # the label of an edge of shortest_chain
S = TypeVar("S")  # the state shortest_chain carries along a path


def balance_leaders(assignment: dict[int, list[int]], lcap: Mapping[int, int]) -> int:
    """Reorder replicas so no broker is preferred leader of more than ``lcap`` partitions.

    Only the order within a partition changes (no data moves): a partition whose leader
    leads too many swaps its first replica with one on a broker below its bound, along
    the shortest chain of such swaps (broker -> a partition it leads -> a follower of
    it) when no single swap does. Stops where no chain exists. Returns the swaps made.
    """
    led: dict[int, set[int]] = {}
    for p, reps in assignment.items():
        if reps:
            led.setdefault(reps[0], set()).add(p)
    swaps = 0

    def followers(u: int, _: None) -> Iterator[tuple[int, int, None]]:
        # An edge u -> y is a partition u leads that y follows.
        for p in sorted(led.get(u, ())):
            for y in assignment[p][1:]:
                yield y, p, None

    for x in sorted(led):
        while len(led[x]) > lcap.get(x, 0):
            chain = shortest_chain(
                x, None, followers, lambda y: len(led.get(y, ())) < lcap.get(y, 0)
            )
            if chain is None:
                break
            for u, p, y in chain:
                reps = assignment[p]
                i = reps.index(y)
                reps[0], reps[i] = y, u
                led[u].discard(p)
                led.setdefault(y, set()).add(p)
                swaps += 1
    return swaps


def shortest_chain(
    start: int,
    state: S,
    edges: Callable[[int, S], Iterable[tuple[int, L, S]]],
    is_sink: Callable[[int], bool],
) -> list[tuple[int, L, int]] | None:
    """Breadth-first from broker ``start`` to the first broker ``is_sink`` accepts.

    ``edges(u, state of u)`` yields ``(y, label, state of y)`` in the order to try them; a
    broker is entered once, by the first edge that reaches it, and the search stops at the
    first sink it enters. Returns the chain's edges ``(u, label, y)`` from the sink back
    to ``start`` (the order to apply them in, so each target has room when it is used),
    or None when no sink is reachable.
    """
    parent: dict[int, tuple[int, L]] = {}
    states = {start: state}
    frontier = [start]
    while frontier:
        nxt: list[int] = []
        for u in frontier:
            for y, label, after in edges(u, states[u]):
                if y in states:
                    continue
                parent[y] = (u, label)
                states[y] = after
                if is_sink(y):
                    chain = []
                    while y != start:
                        u, label = parent[y]
                        chain.append((u, label, y))
                        y = u
                    return chain
                nxt.append(y)
        frontier = nxt
    return None
