"""The `logsdk` command in-process: help texts, usage errors, and tail's rendering."""

from __future__ import annotations

import json

import pytest

from logsdk._cli.tail import render
from logsdk.cli import main

COMMANDS = [
    ["broker"],
    ["produce"],
    ["tail"],
    ["spool"],
    ["spool", "status"],
    ["spool", "export"],
    ["spool", "replay"],
    ["bench"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_examples(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`logsdk CMD --help` exits 0 and shows examples."""
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out
    assert f"logsdk {' '.join(command)}" in out


@pytest.mark.parametrize(
    "args",
    [
        ["tail", "-b", "127.0.0.1:1"],  # no --topic
        ["tail", "-t", "x", "-b", "127.0.0.1:1", "--count", "0"],
        ["tail", "-t", "x", "-b", "127.0.0.1:1", "--grep", "("],
        ["produce", "-t", "x", "-b", "127.0.0.1:1", "-X", "novalue"],
        ["broker", "--topic", "name:zero"],
        ["frobnicate"],
    ],
    ids=["missing-option", "bad-count", "bad-regex", "bad-X", "bad-topic-spec", "unknown"],
)
def test_usage_errors_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Bad usage exits 2 with a message on stderr and no traceback."""
    try:
        code = main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert err.strip()
    assert "Traceback" not in err


def test_render_json_log_record() -> None:
    """A KafkaHandler-style record: time, level, logger, message, fields, traceback below."""
    doc = {
        "timestamp": "2024-01-01T00:00:00Z",
        "level": "ERROR",
        "logger": "web",
        "message": "boom",
        "extra": {"path": "/x"},
        "exception": "Traceback...\nValueError: x",
    }
    line = render(json.dumps(doc).encode(), 0, colour=False)
    first, *rest = line.splitlines()
    assert first == "2024-01-01T00:00:00Z ERROR   web: boom path=/x"
    assert rest == ["    Traceback...", "    ValueError: x"]
    assert "\033[31m" in render(json.dumps(doc).encode(), 0, colour=True)


def test_render_structlog_and_loguru_shapes_and_plain_text() -> None:
    """structlog's "event", loguru's level object, and non-JSON values all print."""
    assert "INFO    hello user=1" in render(
        b'{"event": "hello", "level": "info", "user": 1}', 0, False
    )
    loguru = {"level": {"name": "WARNING", "no": 30}, "message": "careful"}
    assert "WARNING careful" in render(json.dumps(loguru).encode(), 0, False)
    assert render(b"just text", 1_700_000_000_000, False) == "2023-11-14T22:13:20.000Z just text"
