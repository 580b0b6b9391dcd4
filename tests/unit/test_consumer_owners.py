"""The consumer's librdkafka client is owned by one thread: checked while tests run."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from logsdk import _owner
from logsdk.consumer._kafka import KafkaConsumerClient
from logsdk.errors import OwnershipError


@pytest.fixture
def client() -> Iterator[KafkaConsumerClient]:
    """A client that never connects (nothing is subscribed), closed by its owner."""
    c = KafkaConsumerClient(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "owners"},
        lambda tps: {},
        lambda tps: None,
        lambda tps: None,
        lambda: False,
    )
    yield c
    if c.owner.thread is not threading.current_thread():
        c.owner.take()
    c.close()
    # The violations below were provoked on purpose: not this test's failure.
    _owner.violations(clear=True)


def _on_thread(fn: Callable[[], object], name: str = "other") -> BaseException | None:
    """Run ``fn`` on a new thread; what it raised, if anything."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=run, name=name)
    t.start()
    t.join(10)
    return raised[0] if raised else None


def test_a_thread_that_does_not_own_the_client_is_refused(client: KafkaConsumerClient) -> None:
    """Any call into librdkafka from a thread other than the owner raises, naming both."""
    assert _owner.checking()
    for call in (
        lambda: client.poll(10, 0.0),
        client.assignment,
        lambda: client.pause([("t", 0)]),
        lambda: client.seek(("t", 0), 5),
        lambda: client.commit({("t", 0): (5, None)}, asynchronous=False),
        lambda: client.committed([("t", 0)], 1.0),
        lambda: client.high_watermark(("t", 0)),
        client.close,
    ):
        exc = _on_thread(call, name="intruder")
        assert isinstance(exc, OwnershipError)
        assert "'intruder'" in str(exc)
        assert repr(threading.current_thread().name) in str(exc)
    assert not client.closed


def test_handed_to_the_fetch_thread_and_taken_back_once_it_ended(
    client: KafkaConsumerClient,
) -> None:
    """The builder hands the client to the thread that runs it, and may use it again only
    once that thread has ended (take())."""
    ran = threading.Event()

    def run() -> None:
        client.assignment()
        ran.set()

    fetch = threading.Thread(target=run, name="fetch")
    client.owner.hand_to(fetch)
    with pytest.raises(OwnershipError, match="'fetch'"):
        client.assignment()
    fetch.start()
    fetch.join(10)
    assert ran.is_set()
    client.owner.take()
    assert client.assignment() == []
