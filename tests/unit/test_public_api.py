"""The public surface is pinned: a change to it must be deliberate."""

from __future__ import annotations

import logsdk
import logsdk.testing


def test_top_level_exports() -> None:
    """logsdk exports exactly these names."""
    assert sorted(logsdk.__all__) == sorted(
        [
            "HEADER_PRODUCER",
            "HEADER_SEQ",
            "Handler",
            "LogConsumer",
            "LogProducer",
            "LogSDKError",
            "Record",
            "State",
            "TransactionalHandler",
            "__version__",
        ]
    )
    for name in logsdk.__all__:
        assert hasattr(logsdk, name)


def test_testing_exports() -> None:
    """logsdk.testing exports exactly these names."""
    assert sorted(logsdk.testing.__all__) == sorted(
        [
            "KAFKA_VERSION",
            "ApacheKafka",
            "DeliveryReport",
            "EmbeddedBroker",
            "MockCluster",
            "check_delivery",
            "create_topic",
            "delete_topic",
            "free_port",
            "identity",
            "port_is_free",
            "producer_hooks",
            "read_topic",
            "tansu_binary",
        ]
    )


def test_every_error_derives_from_the_root() -> None:
    """Every class in logsdk.errors is a LogSDKError."""
    import inspect

    from logsdk import errors

    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__
    ]
    assert classes
    assert all(issubclass(c, errors.LogSDKError) for c in classes)


def test_shm_exports() -> None:
    """logsdk.shm exports exactly these names."""
    import logsdk.shm

    assert sorted(logsdk.shm.__all__) == sorted(
        ["SegmentInfo", "ShmRing", "inspect", "list_segments", "remove", "segment_name"]
    )
