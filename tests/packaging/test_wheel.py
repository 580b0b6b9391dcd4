"""The package as a user installs it: an sdist and a wheel built from the checkout,
`twine check`, then the wheel (not the checkout) in a fresh venv, with no test file near,
doing what the README's quickstart does: embedded broker, send, consume, the CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from logsdk import __version__

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: uv (a dev dependency) builds and installs the same wheel in seconds where pip takes a
#: minute; pip is used when uv is not there.
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")

SMOKE = textwrap.dedent(
    """
    import logsdk, sys, tempfile
    from logsdk import LogProducer
    from logsdk.testing import EmbeddedBroker, create_topic, read_topic
    assert "site-packages" in logsdk.__file__, logsdk.__file__
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as d:
        create_topic(broker.bootstrap_servers, "smoke", 1)
        with LogProducer(broker.bootstrap_servers, "smoke", d + "/spool") as p:
            for i in range(100):
                p.send({"n": i})
            assert p.flush(30) == 0
        got = read_topic(broker.bootstrap_servers, "smoke")
        assert len(got) == 100, len(got)
    print("smoke ok", logsdk.__version__)
    """
)


def _run(*cmd: str | Path, cwd: Path | None = None) -> str:
    out = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, f"{cmd}: {out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out.stdout


def test_built_wheel_installs_and_runs_in_a_fresh_venv(tmp_path: Path) -> None:
    """sdist and wheel build, twine check passes, and the wheel installed with the
    `testing` extra into a new venv runs the quickstart and `logsdk --help/--version`."""
    dist = tmp_path / "dist"
    installer = ["--installer", "uv"] if UV else []
    _run(sys.executable, "-m", "build", *installer, "--sdist", "--wheel", "--outdir", dist, ROOT)
    wheels = sorted(dist.glob("logsdk-*.whl"))
    sdists = sorted(dist.glob("logsdk-*.tar.gz"))
    assert len(wheels) == 1, list(dist.iterdir())
    assert len(sdists) == 1, list(dist.iterdir())
    assert __version__ in wheels[0].name
    # The poms Maven fetches the JVM parts of logsdk.testing with (Apache Kafka, Spark's
    # connectors) ship in the wheel: the fixtures need them where there is no checkout.
    shipped = set(zipfile.ZipFile(wheels[0]).namelist())
    for pom in ("apache_kafka", "spark_kafka", "hadoop_aws"):
        assert f"logsdk/testing/{pom}/pom.xml" in shipped, pom
    _run(sys.executable, "-m", "twine", "check", "--strict", *wheels, *sdists)
    venv = tmp_path / "venv"
    py = venv / "bin" / "python"
    if UV:
        _run(UV, "venv", "--quiet", "--python", sys.executable, venv)
        _run(UV, "pip", "install", "--quiet", "--python", py, f"{wheels[0]}[testing]")
    else:
        _run(sys.executable, "-m", "venv", venv)
        _run(py, "-m", "pip", "install", "--quiet", f"{wheels[0]}[testing]")
    work = tmp_path / "elsewhere"  # no checkout, no tests/ on the path
    work.mkdir()
    assert "smoke ok" in _run(py, "-c", SMOKE, cwd=work)
    assert "usage: logsdk" in _run(venv / "bin" / "logsdk", "--help", cwd=work)
    assert _run(venv / "bin" / "logsdk", "--version", cwd=work).strip() == f"logsdk {__version__}"
