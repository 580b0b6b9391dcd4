"""The `logsdk` command in-process: help texts, usage errors, and tail's rendering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from logsdk._cli.tail import render
from logsdk.cli import main
from logsdk.spool import Spool, encode_headers

COMMANDS = [
    ["broker"],
    ["produce"],
    ["tail"],
    ["spool"],
    ["spool", "status"],
    ["spool", "check"],
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


def test_spool_status_and_export_read_a_closed_spool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """status counts records by topic and lists corrupt files moved aside; export --rejected
    writes the records Kafka refused, with their error."""
    spool = Spool(tmp_path).open()
    try:
        spool.append(
            [
                ("a", b"k", b'{"m": 1}', encode_headers([("h", b"v")]), 1_000, 0),
                ("b", None, b"\xff\xfe", None, 2_000, 1),
                ("a", None, b"x", None, 3_000, 2),
            ]
        )
        spool.reject([(("a", None, b"too big", None, 4_000, 3), "MSG_SIZE_TOO_LARGE")])
    finally:
        spool.close()
    (tmp_path / "spool.db.corrupt-20240101-000000-abcdef").write_bytes(b"junk")

    assert main(["spool", "status", str(tmp_path), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["records"], status["rejected"]) == (3, 1)
    assert {t: v["records"] for t, v in status["topics"].items()} == {"a": 2, "b": 1}
    assert (status["oldest"], status["newest"]) == (
        "1970-01-01T00:00:01.000Z",
        "1970-01-01T00:00:03.000Z",
    )
    assert status["corrupt_files"] == ["spool.db.corrupt-20240101-000000-abcdef"]
    assert main(["spool", "status", str(tmp_path)]) == 0
    assert "corrupt    spool.db.corrupt-20240101-000000-abcdef" in capsys.readouterr().out

    assert main(["spool", "export", str(tmp_path)]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["topic"], d["key"], d["value"]) for d in docs] == [
        ("a", "k", '{"m": 1}'),
        ("b", None, {"base64": "//4="}),
        ("a", None, "x"),
    ]
    assert docs[0]["headers"] == [["h", "v"]]
    assert main(["spool", "export", str(tmp_path), "--rejected"]) == 0
    (rejected,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (rejected["value"], rejected["error"]) == ("too big", "MSG_SIZE_TOO_LARGE")


def test_tail_render_escapes_control_characters_and_survives_any_timestamp() -> None:
    """A record's text cannot move the terminal or forge a line; a timestamp beyond what
    datetime shows (send() accepts up to 2**63 - 1 ms) is printed raw, not raised."""
    from logsdk._cli.tail import render

    line = render(b"ok\x1b[2J\nFORGED INFO line\x9b", (1 << 63) - 1, colour=False)
    assert "\n" not in line
    assert "\x1b" not in line
    assert "\x9b" not in line
    assert line.startswith(f"{(1 << 63) - 1}ms ok\\x1b[2J\\nFORGED")
    doc = render(b'{"message": "a\\u001bb", "logger": "x\\ny", "k": "v\\u0007"}', 1, colour=True)
    assert "\x07" not in doc
    assert "a\\x1bb" in doc
    assert "x\\ny" in doc


def _slot_with(path: Path, n: int, rejected: int = 0, seq0: int = 0) -> None:
    """A closed slot at ``path`` holding ``n`` records (seqs from ``seq0``) and ``rejected``
    rows set aside."""
    spool = Spool(path).open()
    try:
        spool.append([("t", None, b"v%d" % i, None, 1_000 + i, seq0 + i) for i in range(n)])
        spool.reject(
            [(("t", None, b"bad", None, 1, seq0 + n + i), "REFUSED") for i in range(rejected)]
        )
    finally:
        spool.close()


@pytest.mark.parametrize(
    "fills",
    [(a, b, c) for a in (0, 2) for b in (0, 3) for c in (0, 4)],
    ids=lambda f: "-".join(map(str, f)),
)
def test_spool_status_adds_up_whatever_each_slot_holds(
    fills: tuple[int, int, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three slots, each empty or holding records (an empty slot 0 beside a full one
    crashed it): exit 0; each slot's own records, rejected and seq range; totals that are
    their sums; the text shows each slot's seqs."""
    for index, n in enumerate(fills):
        path = tmp_path if index == 0 else tmp_path / "slots" / str(index)
        _slot_with(path, n, rejected=1 if n else 0, seq0=100 * index)

    assert main(["spool", "status", str(tmp_path), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    slots = status["slots"]
    assert [(sl["slot"], sl["records"], sl["rejected"]) for sl in slots] == [
        (i, n, 1 if n else 0) for i, n in enumerate(fills)
    ]
    assert [sl["seq_range"] for sl in slots] == [
        [100 * i, 100 * i + n - 1] if n else None for i, n in enumerate(fills)
    ]
    for key in ("records", "bytes", "file_bytes", "rejected"):
        assert status[key] == sum(sl[key] for sl in slots), key
    assert status["seq_range"] == slots[0]["seq_range"]  # seqs are a slot's own: slot 0's
    assert sum(t["records"] for t in status["topics"].values()) == status["records"]

    assert main(["spool", "status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"records    {sum(fills)}  " in out
    assert f"rejected   {sum(1 for n in fills if n)}  " in out
    table = {
        line.split()[0]: line.split() for line in out.splitlines() if line[:4].strip().isdigit()
    }
    for i, n in enumerate(fills):
        row = table[str(i)]
        assert row[1:3] == [str(n), str(1 if n else 0)]
        assert (f"{100 * i}..{100 * i + n - 1}" if n else "-") in row


def test_spool_status_names_the_corrupt_files_of_every_slot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged database moved aside in slot 2 is named (relative to DIR), not only
    slot 0's."""
    _slot_with(tmp_path, 1)
    _slot_with(tmp_path / "slots" / "2", 0)
    (tmp_path / "spool.db.corrupt-20240101-000000-aaaaaa").write_bytes(b"junk")
    (tmp_path / "slots" / "2" / "spool.db.corrupt-20240102-000000-bbbbbb").write_bytes(b"junk")
    assert main(["spool", "status", str(tmp_path), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["corrupt_files"] == [
        "spool.db.corrupt-20240101-000000-aaaaaa",
        "slots/2/spool.db.corrupt-20240102-000000-bbbbbb",
    ]
    assert status["slots"][1]["corrupt_files"] == ["spool.db.corrupt-20240102-000000-bbbbbb"]
    assert main(["spool", "status", str(tmp_path)]) == 0
    assert "corrupt    slots/2/spool.db.corrupt-20240102-000000-bbbbbb" in capsys.readouterr().out
