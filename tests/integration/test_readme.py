"""The README's quickstart runs as written (a free port and a temporary spool dir swapped in)."""

from __future__ import annotations

import json
import os
import re
import selectors
import shlex
import shutil
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
    """Broker in one terminal, then send, tail and spool status in another: the record
    arrives and the spool is empty."""
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
        for ln in quickstart_lines()
    ]
    assert lines[0].startswith("pip install")
    assert lines[1].startswith("logsdk broker")
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = (tmp_path / "broker.err").open("w")
    try:
        with subprocess.Popen(
            ["bash", "-c", f"exec {lines[1]}"],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
        ) as broker:
            try:
                assert broker.stdout is not None
                with selectors.DefaultSelector() as sel:
                    sel.register(broker.stdout, selectors.EVENT_READ)
                    assert sel.select(timeout=60), "the broker printed no address in 60 s"
                assert broker.stdout.readline().strip() == f"127.0.0.1:{port}"
                out = subprocess.run(
                    ["bash", "-e", "-c", "\n".join(lines[2:])],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    env=env,
                )
                assert out.returncode == 0, out.stdout + out.stderr
                assert "INFO    hello" in out.stdout
                assert "records    0" in out.stdout
            finally:
                broker.terminate()
                broker.wait(30)
    finally:
        log.close()
