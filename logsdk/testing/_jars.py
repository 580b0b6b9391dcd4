"""Jars from Maven Central, fetched once by Maven into logsdk's jar cache.

A pom shipped in the package names what a JVM part of the tests needs (Apache Kafka's
broker, Spark's connectors); `maven_jars()` runs Maven on it once and keeps the jars
in a directory of the cache named after the pom's content, so that a changed pom (a new
version) gets a directory of its own and an unchanged one is reused by every run and
every xdist worker.

Invariants:
- a cache directory is complete or absent: Maven copies into a temporary directory
  beside it, renamed into place only after Maven succeeded (``rename`` is atomic);
- one fetch at a time per pom across processes (an ``flock`` on a file of the cache), so
  that workers started together wait for the first one's fetch instead of racing it;
- nothing is downloaded at run time by anything but Maven, and only when the cache
  directory is missing (``make jars`` fills it before the tests run).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from logsdk.errors import BrokerBinaryNotFound

log = logging.getLogger("logsdk.testing.jars")

#: Where the jars go: ``$LOGSDK_JAR_CACHE``, else ``$XDG_CACHE_HOME/logsdk/jars``, else
#: ``~/.cache/logsdk/jars``.
ENV_CACHE = "LOGSDK_JAR_CACHE"
#: How long Maven may take to resolve and download (a cold cache on a slow mirror).
FETCH_TIMEOUT_S = 900.0


def cache_root() -> Path:
    """The jar cache's root directory (not created here)."""
    explicit = os.environ.get(ENV_CACHE, "").strip()
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "logsdk" / "jars"


def java_binary() -> str:
    """The ``java`` to run: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME", "").strip()
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerBinaryNotFound(
            "Apache Kafka needs a Java 17+ runtime and none was found (no java on PATH, "
            "JAVA_HOME unset): install one, e.g. apt-get install openjdk-17-jre-headless"
        )
    return found


def _maven() -> str:
    found = shutil.which("mvn")
    if found is None:
        raise BrokerBinaryNotFound(
            "fetching the jars needs Maven and none was found on PATH: install it, e.g. "
            "apt-get install maven (or fill the jar cache on a machine that has it: "
            f"${ENV_CACHE})"
        )
    return found


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def jar_dir(pom: Path, name: str) -> Path:
    """The cache directory of ``pom``'s jars (named after its content; may not exist)."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    return cache_root() / f"{name}-{digest}"


def maven_jars(pom: Path, name: str, *, timeout: float = FETCH_TIMEOUT_S) -> list[Path]:
    """The jars ``pom`` depends on (transitively), fetched by Maven on first use.

    [`BrokerBinaryNotFound`][logsdk.errors.BrokerBinaryNotFound] when Maven is needed and missing,
    or fails (its output's tail in the message).
    """
    target = jar_dir(pom, name)
    if not target.is_dir():
        with _locked(cache_root() / f".{name}.lock"):
            if not target.is_dir():  # another process may have filled it while we waited
                _fetch(pom, target, timeout)
    jars = sorted(target.glob("*.jar"))
    if not jars:
        raise BrokerBinaryNotFound(f"the jar cache {target} holds no jars: delete it and retry")
    return jars


def _fetch(pom: Path, target: Path, timeout: float) -> None:
    mvn = _maven()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    log.info("fetching the jars of %s with Maven into %s", pom, target)
    cmd = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={tmp}",
        "-DincludeScope=runtime",
    ]
    try:
        done = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BrokerBinaryNotFound(
            f"Maven did not fetch {pom}'s jars within {timeout:.0f}s"
        ) from exc
    if done.returncode != 0 or not any(tmp.glob("*.jar")):
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise BrokerBinaryNotFound(
            f"Maven could not fetch the jars of {pom} (exit status {done.returncode}):\n{tail}"
        )
    tmp.rename(target)
