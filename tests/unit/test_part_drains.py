"""``Drains`` alone: the free slots of a real ``spool_dir`` (each a spool other processes
left with records), drains that stand in for engines (each holds its slot's lock as a
real drain does, and says what it delivered), and Kafka's answer given by the test. No
thread, no broker: when drains start, stop and are counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from logsdk.errors import SpoolError, SpoolLockedError
from logsdk.producer._config import ProducerConfig
from logsdk.producer._counters import Counters
from logsdk.producer._drains import Drain, Drains
from logsdk.spool import Spool
from logsdk.spool._slots import open_slot


class StandInDrain:
    """A drain of one free slot: it holds the slot (its spool open, so locked) until
    closed, and delivers what the test says."""

    def __init__(self, index: int, path: Path) -> None:
        self.index = index
        self.spool = Spool(path).open()
        self.left = self.spool.count
        self.acked = self.rejected = 0
        self.hurried = 0
        self.closed_with: float | None = None

    def undelivered(self) -> int:
        return self.left

    def delivered(self) -> tuple[int, int]:
        return self.acked, self.rejected

    def hurry(self, delta: int) -> None:
        self.hurried += delta

    def close(self, timeout: float | None = 30.0) -> None:
        self.closed_with = timeout
        self.spool.close()

    def deliver(self, n: int, rejected: int = 0) -> None:
        """``n`` records acknowledged and ``rejected`` set aside: out of the slot."""
        rows = self.spool.read_after(0, n + rejected)
        self.spool.delete([r[0] for r in rows])
        self.left -= n + rejected
        self.acked += n
        self.rejected += rejected


class World:
    """A ``spool_dir`` whose slot 0 is this producer's (open), slots left by other
    processes, and what Kafka answers."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = ProducerConfig(
            bootstrap_servers="127.0.0.1:1", topic="t", spool_dir=str(root), probe_timeout_s=2.0
        )
        self.own = open_slot(root, synchronous="NORMAL", max_bytes=None)
        assert self.own[0] == 0
        self.made: list[StandInDrain] = []
        self.refuse: Exception | None = None
        self.degraded = False
        self.answered = False
        self.probe_answers = False
        self.probes: list[float] = []
        self.counters = Counters()

    def leave_slots(self, *records: int) -> None:
        """Other processes left slots 1, 2, ... holding these many records (all held at
        once while written, so each gets a slot of its own)."""
        held = [open_slot(self.root, synchronous="NORMAL", max_bytes=None) for _ in records]
        for (_, spool), n in zip(held, records, strict=True):
            if n:
                spool.reserve_seq(n)
                spool.append([("t", None, b"v", None, 1, i) for i in range(n)])
        for _, spool in held:
            spool.close()

    def open_drain(self, index: int, path: Path) -> Drain:
        if self.refuse is not None:
            raise self.refuse
        d = StandInDrain(index, path)
        self.made.append(d)
        return d

    def probe(self, timeout: float) -> bool:
        self.probes.append(timeout)
        return self.probe_answers

    def drains(self, enabled: bool = True) -> Drains:
        return Drains(
            self.config,
            0,
            open_drain=self.open_drain,
            degraded=lambda: self.degraded,
            answered=lambda: self.answered,
            probe=self.probe,
            counters=self.counters,
            enabled=enabled,
        )

    def close(self) -> None:
        for d in self.made:
            if d.closed_with is None:
                d.spool.close()
        self.own[1].close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.close()


def test_the_first_look_counts_what_free_slots_hold_and_starts_nothing(world: World) -> None:
    """At the producer's start: the records of the free slots are counted (``waiting``),
    its own slot and empty ones not; no drain, no probe (that is the health thread's)."""
    world.leave_slots(3, 0, 5)
    drains = world.drains()
    drains.look()
    assert drains.waiting == 8
    assert drains.undelivered() == 8
    assert world.made == []
    assert world.probes == []


def test_where_kafka_answers_each_free_slot_with_records_gets_a_drain(world: World) -> None:
    """Kafka answered this producer: one drain per free slot holding records (empty ones
    get none), none waiting; what the drains have not delivered is undelivered; a second
    scan starts no second drain of a slot (the first holds it)."""
    world.leave_slots(3, 0, 5)
    world.answered = True
    drains = world.drains()
    drains.scan()
    assert sorted(d.index for d in world.made) == [1, 3]
    assert drains.waiting == 0
    assert drains.undelivered() == 8
    drains.scan()
    assert len(world.made) == 2
    assert world.probes == []


def test_a_finished_drain_is_closed_and_its_counts_are_kept(world: World) -> None:
    """A drain that delivered everything is closed at the next scan; what it got
    acknowledged and set aside stays in ``counts()``, with the running drains'."""
    world.leave_slots(3, 5)
    world.answered = True
    drains = world.drains()
    drains.scan()
    first, second = sorted(world.made, key=lambda d: d.index)
    first.deliver(2, rejected=1)
    second.deliver(1)
    assert drains.counts() == (3, 1)
    drains.scan()
    assert first.closed_with == 0
    assert second.closed_with is None
    assert drains.drains == [second]
    assert drains.counts() == (3, 1)
    assert drains.undelivered() == 4


def test_while_kafka_does_not_answer_no_drain_starts(world: World) -> None:
    """DEGRADED (Kafka is known to be down): no drain, no probe; the free slots' records
    wait (``waiting``), and are part of what is undelivered."""
    world.leave_slots(4)
    world.degraded = True
    drains = world.drains()
    drains.scan()
    assert world.made == []
    assert world.probes == []
    assert drains.waiting == 4
    assert drains.undelivered() == 4


def test_a_probe_decides_when_kafka_has_not_answered_yet(world: World) -> None:
    """Not degraded but no answer since the last degrade: a probe, within the deadline and
    the probe timeout, decides; with less than 0.2 s left none is made."""
    world.leave_slots(4)
    drains = world.drains()
    drains.scan(deadline=float("inf"))
    assert world.probes == [2.0]
    assert world.made == []
    world.probe_answers = True
    drains.scan()
    assert world.probes[-1] == pytest.approx(2.0, abs=0.1)
    assert [d.index for d in world.made] == [1]
    world.made[0].deliver(4)
    world.leave_slots(0, 2)
    drains.scan(deadline=0.0)  # no time left to probe: Kafka counts as not answering
    assert len(world.probes) == 2
    assert drains.waiting == 2


def test_the_health_threads_look_lets_drains_go_when_kafka_stops_answering(
    world: World,
) -> None:
    """Kafka stops answering: the health thread's scan (no deadline, not closing) closes
    the drains under way at once, their records left in their slots (counted waiting), and
    what they delivered kept; flush()'s and close()'s scans leave them running."""
    world.leave_slots(3, 5)
    world.answered = True
    drains = world.drains()
    drains.scan()
    one = world.made[0]
    one.deliver(1)
    world.answered, world.degraded = False, True
    drains.scan(deadline=float("inf"))  # flush()
    drains.scan(deadline=float("inf"), closing=True)  # close()
    assert len(drains.drains) == 2
    drains.scan()  # the health thread
    assert drains.drains == []
    assert all(d.closed_with == 0 for d in world.made)
    assert drains.waiting == 7  # what is left in the slots (one record was delivered)
    assert drains.counts() == (1, 0)


def test_a_slot_taken_meanwhile_is_skipped_and_a_failing_drain_is_counted(
    world: World,
) -> None:
    """A slot another process took between the look and the drain's open is skipped
    silently; a drain that cannot start for another reason is counted (``slot_drain``)."""
    world.leave_slots(3)
    world.answered = True
    drains = world.drains()
    world.refuse = SpoolLockedError("taken")
    drains.scan()
    assert drains.drains == []
    assert "slot_drain" not in world.counters.errors
    world.refuse = SpoolError("disk gone")
    drains.scan()
    assert drains.drains == []
    assert world.counters.errors["slot_drain"] == 1


def test_flush_and_close_hurry_the_drains_under_way_and_close_them(world: World) -> None:
    """flush() and close() hurry the drains under way then (told twice: +1, then -1 on the
    same list); close() closes each within what is left of its deadline."""
    world.leave_slots(3, 5)
    world.answered = True
    drains = world.drains()
    drains.scan()
    hurried = drains.hurry()
    assert [d.hurried for d in world.made] == [1, 1]
    drains.calm(hurried)
    assert [d.hurried for d in world.made] == [0, 0]
    drains.close_all(deadline=0.0)
    assert [d.closed_with for d in world.made] == [0.0, 0.0]


def test_a_drain_drains_no_other_slot_and_a_forked_child_forgets_the_drains(
    world: World,
) -> None:
    """A drain's own Drains are off: no look, no scan. A forked child's Drains forget the
    parent's drains (returned, to be kept alive but never used)."""
    world.leave_slots(3)
    world.answered = True
    off = world.drains(enabled=False)
    off.look()
    off.scan()
    assert (off.waiting, world.made) == (0, [])
    drains = world.drains()
    drains.scan()
    parents = drains.forget()
    assert [d.index for d in parents] == [1]  # type: ignore[attr-defined]
    assert drains.drains == []
    assert drains.undelivered() == 0
