"""A LogConsumer inherited through fork(): the child's copy is the parent's, stopped there."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import pytest

from logsdk import LogConsumer, Record
from logsdk.testing.pytest_plugin import KafkaTarget
from tests.conftest import exit_codes
from tests.consumer_helpers import produce, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

#: Children forked while the consumer's threads work, and how long they all have to stop
#: their copy, read its stats and leave (a healthy child needs a few milliseconds).
FORKS = 20
CHILDREN_TIMEOUT_S = 20.0


def test_a_child_forked_from_a_running_consumer_stops_its_copy_at_once(
    kafka_broker: KafkaTarget, fresh_topic: Callable[..., str]
) -> None:
    """Forks while the consumer's workers process records (their counters' lock, the
    dispatcher's, the fetcher's busy): each child's stats() and stop() of its copy return
    at once, without touching the parent's threads or clients; the parent's consumer goes
    on and stops as usual."""
    topic = fresh_topic(3)
    n = 10_000
    produce(kafka_broker.client_config("producer"), topic, n, partitions=3, value_bytes=10)

    def process(records: Sequence[Record]) -> None:
        time.sleep(0.0005 * len(records))

    handler = type("H", (), {"process": staticmethod(process)})()
    c = LogConsumer(
        group_id=f"fork-{topic}",
        topics=[topic],
        handler=handler,
        workers=4,
        max_batch=1,
        kafka_config=kafka_broker.client_config("consumer"),
    )

    def more_processed() -> int:
        done: int = c.stats()["processed"]
        wait_until(lambda: c.stats()["processed"] > done, 30, "more processed", 0.001)
        return done

    pids: list[int] = []
    codes: list[int | None] = []
    with c:
        try:
            for _ in range(FORKS):
                done = more_processed()  # each fork falls while the workers process
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        seen = c.stats()
                        c.stop(5)
                        after = c.stats()
                        ok = seen["processed"] >= done and after["state"] == "stopped"
                        code = 0 if ok else 3
                    finally:
                        os._exit(code)
                pids.append(pid)
        finally:
            codes = exit_codes(pids, CHILDREN_TIMEOUT_S)
        wait_until(lambda: c.stats()["processed"] == n, 60, f"all {n} records processed")
    assert c.stats()["state"] == "stopped"
    assert codes == [0] * FORKS, f"{codes.count(None)} of {FORKS} children hung: {codes}"
