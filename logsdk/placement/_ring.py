"""A consistent-hash ring with MD5 virtual nodes, weights and rack awareness (seed 004).

Each broker owns ``round(vnodes_per_weight * weight)`` virtual nodes, the MD5 of
``<name>-v<i>``; a replica's key is the MD5 of ``<topic>-<partition>-<replica>``. A
replica goes to the owner of the first virtual node at or after its key (binary search
on the sorted keys); the walk moves on to the next virtual node while that broker
already holds a replica of the partition, or its rack does and some rack has none.

A plain ring balances replicas only as well as the hashes fall: with 150 replicas per
broker the spread is about +-10% whatever the number of virtual nodes. So, as in
"consistent hashing with bounded loads" (Mirrokni, Thorup, Zadimoghaddam 2018), the
walk also skips a broker that already holds ``ceil(load_factor * fair share)`` of the
topic's replicas (leaders: of its leaders). The fair share is weight-proportional,
water-filled so no rack takes more than one replica per partition while RF <= racks
(racks of unequal size). When every broker the constraints allow is full, the walk takes
the first one the hard constraints (distinct brokers, distinct racks) allow, and a repair
pass then moves replicas from brokers above their bound to brokers below theirs. Leaders are
then evened out by reordering replicas within partitions (`balance_leaders()`, no
data moves), so no broker leads more than its bound where the replicas allow it.
``load_factor=None`` is the plain ring of the seed.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import TypeVar

from logsdk.errors import PlacementError
from logsdk.placement._chains import balance_leaders, shortest_chain
from logsdk.placement._model import Broker

#: Virtual nodes per unit of weight. With 12 equal brokers in 3 racks of 4 (the
#: benchmark's layout), 600 partitions x RF 3, the plain ring's max/mean of replicas per
#: broker is 1.16 with 256 vnodes and 1.11-1.23 over 64-1024 (racks dealt round-robin:
#: 1.10 with 256, 1.11-1.25): not monotonic in the vnodes, the replica keys' own hash
#: spread dominates. Bounded loads give 1.053 for each.
DEFAULT_VNODES = 256
#: Bound on a broker's replicas (and leaders) per topic, as a multiple of its fair share.
DEFAULT_LOAD_FACTOR = 1.05
#: Most virtual nodes one ring may have (about 0.3 GB and a few seconds of hashing).
MAX_RING_NODES = 1_000_000

K = TypeVar("K", bound=Hashable)


def water_fill(
    weights: Mapping[K, float],
    caps: Mapping[K, float],
    total: float,
    floors: Mapping[K, float] | None = None,
) -> dict[K, float]:
    """Split ``total`` in proportion to ``weights``, each item within [floor, cap].

    The split is ``clamp(level * weight, floor, cap)`` for the one level that sums to
    ``total`` (which must lie between the floors' and the caps' sums). Items are pinned
    to a bound round by round: when clamping the proportional split takes more off the
    capped items than it adds to the floored ones, the level can only rise, so the
    capped items stay capped; otherwise the level can only fall and the floored ones
    stay floored.
    """
    lo = floors or {}
    share: dict[K, float] = {}
    free = dict(weights)
    remaining = total
    while free:
        w_sum = sum(free.values())
        prop = {k: remaining * w / w_sum for k, w in free.items()}
        over = [k for k, v in prop.items() if v > caps[k]]
        under = [k for k, v in prop.items() if v < lo.get(k, 0.0)]
        if not over and not under:
            share.update(prop)
            break
        excess = sum(prop[k] - caps[k] for k in over)
        deficit = sum(lo.get(k, 0.0) - prop[k] for k in under)
        pinned = {k: caps[k] for k in over} if excess >= deficit else {}
        if excess <= deficit:
            pinned.update({k: lo.get(k, 0.0) for k in under})
        for k, v in pinned.items():
            share[k] = v
            remaining -= v
            del free[k]
    return share


def fair_shares(
    brokers: Sequence[Broker], partitions: int, replication_factor: int
) -> dict[int, float]:
    """Each broker's fair number of a topic's replicas, given weights and racks.

    Weight-proportional within what the placement rules allow: a broker holds at most
    one replica of each partition; while RF <= racks a rack holds at most one, and
    beyond that every rack holds at least one and at most ``RF - (racks - 1)`` (and
    its brokers') replicas of each partition. The shares sum to ``partitions * RF``
    whenever RF <= brokers.
    """
    by_domain: dict[str, list[Broker]] = {}
    for b in brokers:
        by_domain.setdefault(b.domain, []).append(b)
    n_domains = len(by_domain)
    if replication_factor <= n_domains:
        lo = {d: 0.0 for d in by_domain}
        hi = {d: float(partitions) for d in by_domain}
    else:
        spare = replication_factor - (n_domains - 1)
        lo = {d: float(partitions) for d in by_domain}
        hi = {d: float(partitions * min(len(bs), spare)) for d, bs in by_domain.items()}
    domain_share = water_fill(
        {d: sum(b.weight for b in bs) for d, bs in by_domain.items()},
        hi,
        partitions * replication_factor,
        lo,
    )
    out: dict[int, float] = {}
    for d, bs in by_domain.items():
        out.update(
            water_fill(
                {b.id: b.weight for b in bs}, {b.id: partitions for b in bs}, domain_share[d]
            )
        )
    return out


def check_racks(brokers: Sequence[Broker], who: str) -> None:
    """Raise `PlacementError` if some brokers have a rack and others none.

    A rackless broker would otherwise count as a rack of its own and, with RF >= the
    racks, hold a replica of every partition; Kafka refuses such a cluster too.
    """
    missing = sorted(b.id for b in brokers if b.rack is None)
    if missing and len(missing) < len(brokers):
        raise PlacementError(
            f"brokers {missing} have no rack; {who} needs a rack on every broker or on none"
        )


def md5_key(text: str) -> int:
    """The ring position of ``text``: its MD5 digest as a 128-bit integer."""
    return int.from_bytes(hashlib.md5(text.encode("utf-8"), usedforsecurity=False).digest(), "big")


class HashRing:
    """A consistent-hash ring over ``brokers``; immutable once built.

    At most `MAX_RING_NODES` virtual nodes (``vnodes_per_weight`` x weights).
    """

    def __init__(self, brokers: Sequence[Broker], vnodes_per_weight: int = DEFAULT_VNODES) -> None:
        if vnodes_per_weight < 1:
            raise PlacementError(f"vnodes per weight must be >= 1, got {vnodes_per_weight}")
        if not brokers:
            raise PlacementError("a ring needs at least one broker")
        for b in brokers:
            if not (math.isfinite(b.weight) and b.weight > 0):
                raise PlacementError(f"broker {b.id}: weight must be > 0, got {b.weight}")
        check_racks(brokers, "the ring")
        counts = {b.id: max(1, round(vnodes_per_weight * b.weight)) for b in brokers}
        total = sum(counts.values())
        if total > MAX_RING_NODES:
            raise PlacementError(
                f"a ring of {total} virtual nodes is too large (at most {MAX_RING_NODES}): "
                f"lower the vnodes per weight unit (--vnodes, now {vnodes_per_weight}; "
                f"default {DEFAULT_VNODES}) or the brokers' weights"
            )
        owners: dict[int, Broker] = {}
        for b in brokers:
            for i in range(counts[b.id]):
                owners[md5_key(f"{b.name}-v{i}")] = b
        self._keys = sorted(owners)
        self._owners = [owners[k] for k in self._keys]
        self._owner_of = {k: b.id for k, b in owners.items()}
        self._domain = {b.id: b.domain for b in brokers}
        self._brokers = {b.id: b for b in brokers}
        self._n_brokers = len(self._domain)
        self._n_domains = len({b.domain for b in brokers})
        self.vnodes_per_weight = vnodes_per_weight

    def __len__(self) -> int:
        return len(self._keys)

    def walk(self, key: str) -> list[Broker]:
        """Distinct brokers in ring order from ``key``'s position (for inspection)."""
        start = bisect.bisect_left(self._keys, md5_key(key))
        out: list[Broker] = []
        seen: set[int] = set()
        for i in range(len(self._keys)):
            b = self._owners[(start + i) % len(self._keys)]
            if b.id not in seen:
                seen.add(b.id)
                out.append(b)
        return out

    def _check_rf(self, topic: str, replication_factor: int, partitions: int = 1) -> None:
        if partitions < 1:
            raise PlacementError(f"topic {topic!r}: partitions must be >= 1, got {partitions}")
        if replication_factor < 1:
            raise PlacementError(
                f"topic {topic!r}: replication factor must be >= 1, got {replication_factor}"
            )
        if replication_factor > self._n_brokers:
            raise PlacementError(
                f"topic {topic!r}: replication factor {replication_factor} is larger than "
                f"the {self._n_brokers} available brokers"
            )

    def _pick(
        self,
        key: str,
        chosen: list[int],
        domains: set[str],
        full: Callable[[int], int] | None = None,
    ) -> Broker:
        """The first broker from ``key`` that fits.

        ``full(id)`` grades how full a broker is (0: room); when every broker the hard
        constraints allow is full, the first of the least full grade is taken.
        """
        n = len(self._keys)
        start = bisect.bisect_left(self._keys, md5_key(key))
        fallback: Broker | None = None
        grade = 0
        for i in range(start, start + n):
            b = self._owners[i % n]
            if b.id in chosen or (b.domain in domains and len(domains) < self._n_domains):
                continue
            g = 0 if full is None else full(b.id)
            if g == 0:
                return b
            if fallback is None or g < grade:
                fallback, grade = b, g
        if fallback is None:  # unreachable while RF <= brokers; kept as a guard
            raise PlacementError(f"no broker fits replica {key!r}")
        return fallback

    def place(self, topic: str, partition: int, replication_factor: int) -> list[int]:
        """Broker ids for one partition's replicas on the plain ring, leader first."""
        self._check_rf(topic, replication_factor)
        chosen: list[int] = []
        domains: set[str] = set()
        for r in range(replication_factor):
            b = self._pick(f"{topic}-{partition}-{r}", chosen, domains)
            chosen.append(b.id)
            domains.add(b.domain)
        return chosen

    def bounds(
        self, partitions: int, replication_factor: int, load_factor: float = DEFAULT_LOAD_FACTOR
    ) -> tuple[dict[int, int], dict[int, int]]:
        """Per broker: the most replicas, and the most leaders, of one topic it may take.

        ``ceil(load_factor * share)``, the share being `fair_shares()` for replicas
        and the broker's weight's share of the partitions for leaders.
        """
        if not (math.isfinite(load_factor) and load_factor >= 1):
            raise PlacementError(f"load factor must be a finite number >= 1, got {load_factor}")
        brokers = list({b.id: b for b in self._owners}.values())
        shares = fair_shares(brokers, partitions, replication_factor)
        w_sum = sum(b.weight for b in brokers)
        # The epsilon keeps an exact share (150.0 * 1.0) from rounding up to 151.
        cap = {bid: math.ceil(load_factor * s - 1e-9) for bid, s in shares.items()}
        lcap = {
            b.id: math.ceil(load_factor * partitions * b.weight / w_sum - 1e-9) for b in brokers
        }
        return cap, lcap

    def assign(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        load_factor: float | None = DEFAULT_LOAD_FACTOR,
    ) -> dict[int, list[int]]:
        """``{partition: [broker ids]}`` for one topic; a plain ring if ``load_factor`` is None."""
        self._check_rf(topic, replication_factor, partitions)
        if load_factor is None:
            return {p: self.place(topic, p, replication_factor) for p in range(partitions)}
        empty: dict[int, list[int | None]] = {
            p: [None] * replication_factor for p in range(partitions)
        }
        cap, lcap = self.bounds(partitions, replication_factor, load_factor)
        out = self._fill(topic, empty, cap, lcap)
        self._repair(topic, out, cap)
        balance_leaders(out, lcap)
        return out

    def _fill(
        self,
        topic: str,
        slots: dict[int, list[int | None]],
        cap: Mapping[int, int],
        lcap: Mapping[int, int],
    ) -> dict[int, list[int]]:
        """Fill the empty (None) slots by bounded-load walks; filled slots count as load."""
        load: Counter[int] = Counter(b for reps in slots.values() for b in reps if b is not None)
        leaders: Counter[int] = Counter(reps[0] for reps in slots.values() if reps[0] is not None)
        rf = max((len(reps) for reps in slots.values()), default=0)
        # Replica rank by rank: every leader first, so leaders move least when loads shift.
        for r in range(rf):
            for p, reps in slots.items():
                if r >= len(reps) or reps[r] is not None:
                    continue
                others = [b for b in reps if b is not None]
                domains = {self._domain[b] for b in others}
                if r == 0:
                    # A leader-full broker is a better fallback than a replica-full one:
                    # balance_leaders can reorder replicas afterwards; moving data costs.
                    b = self._pick(
                        f"{topic}-{p}-0",
                        others,
                        domains,
                        lambda bid: 2 * (load[bid] >= cap[bid]) + (leaders[bid] >= lcap[bid]),
                    )
                    leaders[b.id] += 1
                else:
                    b = self._pick(
                        f"{topic}-{p}-{r}", others, domains, lambda bid: int(load[bid] >= cap[bid])
                    )
                load[b.id] += 1
                reps[r] = b.id
        return {p: [b for b in reps if b is not None] for p, reps in slots.items()}

    def rebalance(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        current: Mapping[int, Sequence[int]],
        previous: HashRing | None = None,
        load_factor: float = DEFAULT_LOAD_FACTOR,
    ) -> dict[int, list[int]]:
        """Move only what the ring says must move, starting from ``current``.

        A replica stays unless its broker left the ring, it repeats a broker, its
        partition could not otherwise span min(RF, racks) racks, or the walk from its
        key meets a virtual node that ``previous`` (the ring ``current`` was planned on)
        lacks before it meets its broker, and that new node's broker may take it. A
        broker that gained nodes then takes replicas nearest its nodes up to its fair
        share (`_top_up()`). Empty slots (departed brokers, new partitions, a
        larger RF) are then filled by bounded-load walks. ``previous=None`` counts
        every node as new.
        """
        self._check_rf(topic, replication_factor, partitions)
        cap, lcap = self.bounds(partitions, replication_factor, load_factor)
        gained = set(self._keys) - (set(previous._keys) if previous is not None else set())
        slots: dict[int, list[int | None]] = {}
        need = min(replication_factor, self._n_domains)
        for p in range(partitions):
            reps: list[int | None] = []
            for b in list(current.get(p, ()))[:replication_factor]:
                reps.append(b if b in self._domain and b not in reps else None)
            reps += [None] * (replication_factor - len(reps))
            slots[p] = reps
        held: Counter[int] = Counter(b for reps in slots.values() for b in reps if b is not None)
        for reps in slots.values():
            # Evict a same-rack replica only when filling the empty slots with fresh
            # racks could not reach the rack spread the partition can have; evict the one
            # on the broker furthest above its bound (then the later one), so that the
            # bound does not make a second replica of the partition move later.
            while True:
                kept = [b for b in reps if b is not None]
                if len({self._domain[b] for b in kept}) + reps.count(None) >= need:
                    break
                per_domain = Counter(self._domain[b] for b in kept)
                _, victim, x = max(
                    (held[x] - cap[x], i, x)
                    for i, x in enumerate(reps)
                    if x is not None and per_domain[self._domain[x]] > 1
                )
                held[x] -= 1
                reps[victim] = None
        load: Counter[int] = Counter(b for reps in slots.values() for b in reps if b is not None)
        leaders: Counter[int] = Counter(reps[0] for reps in slots.values() if reps[0] is not None)
        if gained:
            gainers = {self._owner_of[k] for k in gained}
            # Brokers above their (new) bound give first, so the gainers' room goes to
            # the replicas that must move anyway; then the ring's own moves, then the
            # gainers' fair share.
            for over_only in (True, False):
                self._take_arcs(topic, slots, load, leaders, gained, cap, lcap, over_only)
                self._top_up(topic, slots, load, leaders, gainers, cap, lcap, over_only)
        out = self._fill(topic, slots, cap, lcap)
        self._repair(topic, out, cap, current)
        balance_leaders(out, lcap)
        return out

    def _spread_ok(self, reps: Sequence[int], i: int, y: int) -> bool:
        """Whether replica ``i`` of ``reps`` may move to broker ``y`` under the rack rules.

        ``y`` must not hold a replica already, and the partition must keep spanning
        min(RF, racks) racks (or, if it spans fewer, no fewer than it does).
        """
        if y in reps:
            return False
        before = {self._domain[b] for b in reps}
        after = {self._domain[b] for j, b in enumerate(reps) if j != i}
        after.add(self._domain[y])
        return len(after) >= min(len(before), min(len(reps), self._n_domains))

    def _repair(
        self,
        topic: str,
        slots: dict[int, list[int]],
        cap: Mapping[int, int],
        current: Mapping[int, Sequence[int]] | None = None,
    ) -> int:
        """Move replicas off brokers above ``cap`` onto brokers below it; return the moves.

        The greedy walks can leave a broker above its bound (every broker the rack rules
        allowed was full), and a changed weight lowers a broker's bound under what it
        holds. Each broker above its bound gives, nearest first in ring distance from the
        replica's key to the receiver's next virtual node, to brokers below their fair
        share, then to brokers below their bound; when no single move is allowed, along
        the shortest chain of moves (x -> y on one partition, y -> z on another...).
        Replicas not on their broker in ``current`` go first: they move anyway, so
        placing them elsewhere costs nothing. Stops where no move is allowed, so the
        bound holds whenever the rules allow it.
        """
        load: Counter[int] = Counter({b: 0 for b in self._domain})
        holds: dict[int, set[int]] = {b: set() for b in self._domain}
        for p, reps in slots.items():
            load.update(reps)
            for b in reps:
                holds[b].add(p)
        if all(load[b] <= cap[b] for b in load):
            return 0
        rf = max((len(r) for r in slots.values()), default=0)
        share = fair_shares(list(self._brokers.values()), len(slots), rf)
        ring_keys: dict[int, list[int]] = {b: [] for b in self._domain}
        for k, o in zip(self._keys, self._owners, strict=True):
            ring_keys[o.id].append(k)
        space = 1 << 128
        moves = 0

        def move(p: int, i: int, y: int) -> None:
            x = slots[p][i]
            slots[p][i] = y
            load[x] -= 1
            load[y] += 1
            holds[x].discard(p)
            holds[y].add(p)

        def replica_moves(
            u: int, used: frozenset[int]
        ) -> Iterator[tuple[int, tuple[int, int], frozenset[int]]]:
            # Moves of u's replicas to other brokers, on partitions not used earlier in the
            # chain (so each move stays allowed).
            for p in sorted(holds[u] - used):
                reps = slots[p]
                i = reps.index(u)
                after = used | {p}
                for y in sorted(load):
                    if self._spread_ok(reps, i, y):
                        yield y, (p, i), after

        none_used: frozenset[int] = frozenset()
        for x in sorted(load):
            for floor_ok in (True, False):
                if load[x] <= cap[x]:
                    break

                def room(y: int, floor_ok: bool = floor_ok) -> bool:
                    limit = min(math.floor(share[y]), cap[y]) if floor_ok else cap[y]
                    return load[y] < limit

                candidates: list[tuple[bool, int, int, int, int]] = []
                for p in sorted(holds[x]):
                    reps = slots[p]
                    i = reps.index(x)
                    h = md5_key(f"{topic}-{p}-{i}")
                    stays = current is not None and x in current.get(p, ())
                    for y in sorted(load):
                        if room(y) and self._spread_ok(reps, i, y):
                            ks = ring_keys[y]
                            d = (ks[bisect.bisect_left(ks, h) % len(ks)] - h) % space
                            candidates.append((stays, d, p, i, y))
                for _, _, p, i, y in sorted(candidates):
                    if load[x] <= cap[x]:
                        break
                    reps = slots[p]
                    if reps[i] == x and room(y) and self._spread_ok(reps, i, y):
                        move(p, i, y)
                        moves += 1

            while load[x] > cap[x]:
                # Shortest chain of moves from x to a broker below its bound.
                chain = shortest_chain(x, none_used, replica_moves, lambda y: load[y] < cap[y])
                if chain is None:
                    break
                for _, (p, i), y in chain:
                    move(p, i, y)
                    moves += 1
        return moves

    def _take_arcs(
        self,
        topic: str,
        slots: dict[int, list[int | None]],
        load: Counter[int],
        leaders: Counter[int],
        gained: set[int],
        cap: Mapping[int, int],
        lcap: Mapping[int, int],
        over_only: bool,
    ) -> None:
        """Move each replica whose walk meets a gained node before its broker to that node.

        Only to a broker below its bound (and its leader bound, for a first replica);
        with ``over_only``, only replicas of brokers above their bound, else only while
        the gaining broker is below its fair share (no more moves than it is owed).
        """
        n = len(self._keys)
        brokers = list(self._brokers.values())
        share = fair_shares(brokers, len(slots), max((len(r) for r in slots.values()), default=0))
        room = {b: cap[b] if over_only else min(cap[b], math.floor(share[b])) for b in cap}
        for r in range(max((len(reps) for reps in slots.values()), default=0)):
            for p, reps in slots.items():
                here = reps[r] if r < len(reps) else None
                if here is None or (over_only and load[here] <= cap[here]):
                    continue
                if None in reps:
                    # The fill will place the empty slot, on a gainer if the walk says
                    # so; moving another replica too would move two (a replica evicted
                    # for a missing rack, and the one the gainer took from another rack).
                    continue
                others = [b for i, b in enumerate(reps) if b is not None and i != r]
                domains = {self._domain[b] for b in others}
                start = bisect.bisect_left(self._keys, md5_key(f"{topic}-{p}-{r}"))
                for i in range(start, start + n):
                    node = self._owners[i % n]
                    if node.id == here:
                        break
                    if (
                        self._keys[i % n] in gained
                        and node.id not in others
                        and (node.domain not in domains or len(domains) >= self._n_domains)
                        and load[node.id] < room[node.id]
                        and (r > 0 or leaders[node.id] < lcap[node.id])
                    ):
                        load[here] -= 1
                        load[node.id] += 1
                        if r == 0:
                            leaders[here] -= 1
                            leaders[node.id] += 1
                        reps[r] = node.id
                        break

    def _top_up(
        self,
        topic: str,
        slots: dict[int, list[int | None]],
        load: Counter[int],
        leaders: Counter[int],
        gainers: set[int],
        cap: Mapping[int, int],
        lcap: Mapping[int, int],
        over_only: bool = False,
    ) -> None:
        """Give each gaining broker its fair share, taking the replicas nearest its nodes.

        Rack rules let a new broker take fewer keys than its arcs cover (a key whose
        partition already has a replica in its rack walks on), so it then takes, in
        order of ring distance from their keys to its nearest virtual node, replicas
        from brokers holding more than their fair share, where the rules allow. Brokers
        above their bound (their share fell as the ring grew) give first, and go on
        giving past the gainer's share up to its bound, so that no other broker has to
        take their excess later.
        """
        partitions = len(slots)
        rf = max((len(r) for r in slots.values()), default=0)
        brokers = list({b.id: b for b in self._owners}.values())
        share = fair_shares(brokers, partitions, rf)
        space = 1 << 128
        for g in sorted(gainers):
            want = min(math.floor(share[g]), cap[g])
            if load[g] >= cap[g]:
                continue
            g_keys = [k for k, o in zip(self._keys, self._owners, strict=True) if o.id == g]
            g_domain = self._domain[g]
            candidates: list[tuple[bool, int, int, int]] = []
            for p, reps in slots.items():
                if g in reps or None in reps:
                    continue
                for r, x in enumerate(reps):
                    if x is None or load[x] <= (cap[x] if over_only else share[x]):
                        continue
                    h = md5_key(f"{topic}-{p}-{r}")
                    i = bisect.bisect_left(g_keys, h)
                    dist = (g_keys[i % len(g_keys)] - h) % space
                    candidates.append((load[x] <= cap[x], dist, p, r))
            for _, _, p, r in sorted(candidates):
                if load[g] >= cap[g]:
                    break
                reps = slots[p]
                x = reps[r]
                if x is None or g in reps or load[x] <= (cap[x] if over_only else share[x]):
                    continue
                if load[g] >= want and load[x] <= cap[x]:
                    continue
                if r == 0 and leaders[g] >= lcap[g]:
                    continue
                others = {self._domain[b] for i, b in enumerate(reps) if b is not None and i != r}
                if g_domain in others and len(others) < self._n_domains:
                    continue
                reps[r] = g
                load[x] -= 1
                load[g] += 1
                if r == 0:
                    leaders[x] -= 1
                    leaders[g] += 1


def ring_assignment(
    brokers: Sequence[Broker],
    topic: str,
    partitions: int,
    replication_factor: int,
    vnodes_per_weight: int = DEFAULT_VNODES,
    load_factor: float | None = DEFAULT_LOAD_FACTOR,
) -> dict[int, list[int]]:
    """``{partition: [broker ids]}`` for one topic on a ring over ``brokers``."""
    return HashRing(brokers, vnodes_per_weight).assign(
        topic, partitions, replication_factor, load_factor
    )
