"""Every Python block of README.md and docs/ that a user would copy runs as written, with
a live embedded broker's address and a temporary spool dir swapped in. A block preceded by
``<!-- no-test: why -->`` is skipped, and the reason names what runs it instead."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from logsdk.testing.pytest_plugin import KafkaTarget

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"(<!-- no-test: [^>]+ -->\n)?```python\n(.*?)```", re.S)
_BROKERS = re.compile(r"\b(127\.0\.0\.1|localhost|kafka):9092\b")
_SPOOLS = ("/var/lib/myapp/logsdk", "/var/lib/myapp/spool", "/tmp/logsdk-spool")


def _blocks() -> list[tuple[str, str, str | None]]:
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        for n, m in enumerate(_BLOCK.finditer(text)):
            out.append((f"{path.relative_to(ROOT)}#{n}", m.group(2), m.group(1)))
    return out


BLOCKS = _blocks()


def test_there_are_blocks_and_most_run() -> None:
    """The collector finds the docs' Python blocks, and skips only a minority."""
    assert len(BLOCKS) >= 10
    assert sum(skip is None for _, _, skip in BLOCKS) > len(BLOCKS) // 2


@pytest.mark.parametrize(("where", "code", "skip"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_docs_block_runs(
    kafka_broker: KafkaTarget, tmp_path: Path, where: str, code: str, skip: str | None
) -> None:
    """The block exits 0 against a live broker."""
    if skip is not None:
        pytest.skip(skip.strip())
    code = _BROKERS.sub(kafka_broker.bootstrap_servers, code)
    for path in _SPOOLS:
        code = code.replace(path, str(tmp_path / "spool"))
    env = {**os.environ, "LOGSDK_BOOTSTRAP": kafka_broker.bootstrap_servers}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, f"{where}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
