"""The README's quickstart runs as written (a free port and a temporary spool dir swapped in)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from logsdk.testing import free_port, tansu_binary

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def quickstart_lines() -> list[str]:
    """The shell lines of the README's quickstart block, joined where a quote spans lines."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quickstart\n\n```bash\n(.*?)\n```", text, re.S)
    assert block is not None, "README has no quickstart block"
    lines: list[str] = []
    for line in block.group(1).splitlines():
        if lines and lines[-1].count("'") % 2 == 1:
            lines[-1] += "\n" + line
        else:
            lines.append(line)
    return lines


def test_quickstart_runs(tmp_path: Path) -> None:
    """The block pasted as it is into bash (after its install line): the broker starts in
    the background, the record arrives, the spool is empty, the broker is stopped."""
    try:
        tansu_binary()
    except Exception as exc:
        pytest.skip(f"no embedded broker here: {exc}")
    bindir = Path(sys.executable).parent
    if shutil.which("logsdk", path=str(bindir)) is None:
        pytest.skip("the logsdk console script is not installed next to this Python")
    port = str(free_port())
    spool = str(tmp_path / "spool")
    # The path goes into shell lines: as a shell word (quoted), and in the `python -c '...'`
    # block as a Python string literal that holds no single quote.
    as_python = json.dumps(spool).replace("'", "\\u0027")
    lines = [
        ln.replace("9092", port)
        .replace('"/tmp/logsdk-spool"', as_python)
        .replace("/tmp/logsdk-spool", shlex.quote(spool))
        .replace("/tmp/logsdk-broker.txt", shlex.quote(str(tmp_path / "broker.txt")))
        for ln in quickstart_lines()
    ]
    assert lines[0].startswith("pip install")
    assert lines[1].startswith("logsdk broker")
    assert lines[1].split("#")[0].rstrip().endswith("&")
    # The README's kill stops the broker: else its stderr (this pipe) stays open and
    # communicate() times out.
    assert lines[-1].startswith("kill $!")
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    # A session of its own: a failed line leaves no broker behind (its group is killed).
    with subprocess.Popen(
        ["bash", "-e", "-c", "\n".join(lines[1:])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=180)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out + err
    assert "INFO    hello" in out
    assert "records    0" in out
    assert (tmp_path / "broker.txt").read_text().strip() == f"127.0.0.1:{port}"
