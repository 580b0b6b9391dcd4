"""The Python matrix: the unit and integration suites on every supported Python.

    nox                      # every session, with the interpreters pyenv provides
    nox -s tests-3.12        # one Python

``make test`` runs the full suite (fault and Spark tests included) on the project's own
``.venv``, then these sessions. Interpreters are looked up among pyenv's versions (the
newest patch release of each minor) and on PATH; a missing one fails its session.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

#: Pythons other than the main one (.venv) that every change is tested on.
PYTHONS = ["3.10", "3.12", "3.13"]

#: uv (a dev dependency) when it is there, else the standard library's venv and pip.
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True


def _pyenv_bins() -> list[str]:
    """The bin dirs of pyenv's Python 3 versions, newest patch release of each first."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        parts = d.name.split(".")
        if len(parts) == 3 and all(p.isdigit() for p in parts) and (d / "bin").is_dir():
            found.append((tuple(int(p) for p in parts), d / "bin"))
    return [str(b) for _, b in sorted(found, reverse=True)]


# nox finds ``python3.X`` on PATH: put pyenv's interpreters there (pyenv's shims only
# answer for the versions selected in the shell).
os.environ["PATH"] = os.pathsep.join([*_pyenv_bins(), os.environ.get("PATH", "")])


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Unit and integration suites, warnings as errors (pyproject's pytest settings),
    without the Spark tests, the mock-cluster and Apache Kafka runs and the benchmark
    scripts (those run on the main Python: they show another broker or a script, not
    another Python)."""
    session.install("-e", ".[dev]")
    session.run(
        "pytest",
        "-n",
        "4",  # as make test's non-fault stage: the tests wait on brokers more than they compute
        "-m",
        "not fault and not spark and not mock_cluster and not apache_kafka",
        "-p",
        "no:cacheprovider",
        "--durations=15",  # as make test's stages: what a slow session spent its time on
        # The benchmark scripts' smoke runs show the scripts, not the Python: they run on
        # the main Python in make test (about half a minute of the two cores per session).
        "--ignore=tests/integration/test_benchmarks.py",
        "tests/unit",
        "tests/integration",
        *session.posargs,
    )
