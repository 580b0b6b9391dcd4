"""spark_sink offset planning and option checks, without Spark or a broker."""

from __future__ import annotations

import itertools
import json

import pytest

from logsdk.errors import ConfigError, SparkSourceError
from spark_sink._options import (
    OffsetRange,
    from_json_dict,
    limit_end,
    parse_source_options,
    split_ranges,
    to_json_dict,
)

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "logs"}


def test_offsets_json_is_canonical_whatever_the_key_order() -> None:
    """Equal offset maps serialise to the same text (Spark compares offsets as strings)."""
    a = {("b", 10): 5, ("a", 2): 1, ("b", 2): 7}
    b = dict(reversed(list(a.items())))
    assert json.dumps(to_json_dict(a)) == json.dumps(to_json_dict(b))
    assert list(to_json_dict(a)) == ["a", "b"]
    assert list(to_json_dict(a)["b"]) == ["2", "10"]  # partitions in numeric order
    assert from_json_dict(json.loads(json.dumps(to_json_dict(a)))) == a


def test_limit_end_shares_the_budget_by_backlog() -> None:
    """maxOffsetsPerTrigger is split in proportion to each partition's backlog."""
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 900, ("t", 1): 200, ("t", 2): 50}
    end = limit_end(start, latest, 500)
    assert sum(end[tp] - start[tp] for tp in start) == 500
    assert end == {("t", 0): 450, ("t", 1): 150, ("t", 2): 50}
    assert limit_end(start, latest, None) == latest


def test_limit_end_makes_progress_with_a_tiny_budget() -> None:
    """A budget smaller than the number of partitions still advances, never backwards."""
    start = {("t", p): 10 for p in range(4)}
    latest = {("t", 0): 11, ("t", 1): 13, ("t", 2): 10, ("t", 3): 12}
    end = limit_end(start, latest, 1)
    assert sum(end[tp] - start[tp] for tp in start) == 1
    assert end[("t", 1)] == 11  # the largest backlog goes first
    assert all(end[tp] >= start[tp] for tp in start)


def test_split_ranges_honours_min_partitions() -> None:
    """minPartitions splits big ranges in proportion to size; the pieces tile each range."""
    ranges = [OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 0, 100), OffsetRange("t", 2, 5, 5)]
    out = split_ranges(ranges, 10)
    assert len(out) >= 10
    for p, (lo, hi) in {0: (0, 900), 1: (0, 100)}.items():
        parts = sorted((r.start, r.end) for r in out if r.partition == p)
        assert parts[0][0] == lo
        assert parts[-1][1] == hi
        assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))
    assert not [r for r in out if r.partition == 2]  # empty ranges are dropped
    assert split_ranges(ranges, None) == ranges[:2]


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"foo": "1"}, "unknown option 'foo'"),
        ({"startingOffsets": "{not json"}, "startingOffsets"),
        ({"startingOffsets": '{"logs": {"x": 1}}'}, "startingOffsets: partition 'x'"),
        ({"startingOffsets": '{"logs": {"0": -3}}'}, "startingOffsets: offset -3"),
        ({"startingOffsets": '{"other": {"0": 1}}'}, "startingOffsets names topics ['other']"),
        ({"endingOffsets": "earliest"}, "endingOffsets"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"minPartitions": "lots"}, "minPartitions"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"fetchOffset.numRetries": "-1"}, "fetchOffset.numRetries must be an integer >= 0"),
        ({"fetchOffset.retryIntervalMs": "0"}, "fetchOffset.retryIntervalMs"),
        ({"kafka.auto.offset.reset": "earliest"}, "kafka.auto.offset.reset"),
        ({"kafka.enable.partition.eof": "false"}, "kafka.enable.partition.eof"),
        ({"subscribePattern": "x"}, "exactly one of the options subscribe or subscribePattern"),
        ({"subscribe": " , "}, "option subscribe names no topic"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], names: str) -> None:
    """Each bad option raises SparkSourceError (a ConfigError) whose message names it."""
    with pytest.raises(SparkSourceError) as info:
        parse_source_options({**BASE, **options})
    assert names in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_options_repr_hides_the_sasl_password() -> None:
    """The parsed options never show a secret in their repr (a log line, a Spark plan)."""
    opts = parse_source_options(
        {**BASE, "kafka.sasl.username": "app", "kafka.sasl.password": "hunter2-secret"}
    )
    assert "hunter2-secret" not in repr(opts)
    assert "app" in repr(opts)


def test_pattern_bad_regex_and_missing_bootstrap() -> None:
    """A bad subscribePattern regex and a missing kafka.bootstrap.servers are named."""
    with pytest.raises(SparkSourceError, match="subscribePattern is not a valid regex"):
        parse_source_options({"kafka.bootstrap.servers": "x:1", "subscribePattern": "("})
    with pytest.raises(SparkSourceError, match=r"kafka\.bootstrap\.servers is required"):
        parse_source_options({"subscribe": "logs"})


def test_good_options_are_parsed_case_insensitively() -> None:
    """Options as Spark passes them (lower-cased) give the same result; kafka.* pass through."""
    opts = parse_source_options(
        {
            **BASE,
            "STARTINGOFFSETS": '{"logs": {"1": -2, "0": 42}}',
            "maxoffsetspertrigger": "1000",
            "kafka.fetch.max.bytes": "1048576",
            "failOnDataLoss": "False",
        }
    )
    assert opts.starting == {("logs", 0): 42, ("logs", 1): -2}
    assert opts.max_offsets_per_trigger == 1000
    assert opts.kafka == {"bootstrap.servers": "127.0.0.1:9092", "fetch.max.bytes": "1048576"}
    assert opts.fail_on_data_loss is False
    assert opts.matches("logs")
    assert not opts.matches("logs2")


def test_kafka_rows_with_a_finer_timestamp_are_truncated_to_milliseconds() -> None:
    """Kafka-shaped rows whose timestamp has microseconds (current_timestamp(), a parsed
    log time) become records with the millisecond, not a cast error on every retry."""
    pa = pytest.importorskip("pyarrow")
    from spark_sink._sink import records_from_arrow

    table = pa.table(
        {
            "topic": ["logs"],
            "partition": [0],
            "offset": [7],
            "value": [b"v"],
            "timestamp": pa.array([1_700_000_000_001_999], pa.timestamp("us", tz="UTC")),
        }
    )
    [record] = records_from_arrow(table, "s", batch_id=0, task=0)
    assert (record.topic, record.partition, record.offset) == ("logs", 0, 7)
    assert record.timestamp == 1_700_000_000_001
