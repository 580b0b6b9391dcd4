"""``state.json``: a slot's identity, and the summary of its last clean close.

What it holds: ``producer_id`` (text), ``seq_reserved`` (an integer: seqs below it may
have been used), and, from a clean close until the next open, ``closed``: the gauges and
the identity of the database file (`SUMMARY_KEYS`, every one an integer), which let
that open skip the checks that read the whole file (see `logsdk.spool._spool`).

Invariants:
- written whole, atomically (`write_state()`): ``state.tmp`` (mode 0600, never through
  a link) written and fsynced, renamed over ``state.json``, then the directory fsynced: a
  reader finds the old content or the new one, never a mix, and a crash loses neither;
- one reader, `read_state()`, for the spool's open, ``logsdk spool check`` and
  ``logsdk spool status|export``: it never follows a symbolic link, and takes the file
  only when it is a JSON object with a text ``producer_id`` and, if it has one, an integer
  ``seq_reserved``; otherwise it says why (`StateRead`);
- a summary counts only whole: every key of `SUMMARY_KEYS` an integer
  (`summary_of()`); anything else stands for no summary.

Owner: none (functions of a directory). A slot's file is written only by the spool that
holds the slot's lock, on that spool's owning thread; any process may read it.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path
from typing import Any, Literal

STATE_NAME = "state.json"
#: Where the next content is written before it is renamed over ``state.json``.
TMP_NAME = "state.tmp"
#: What a clean close leaves in ``state.json["closed"]``: the gauges (``count``,
#: ``bytes``, ``garbage``: bytes below the watermark, ``mark``: the watermark) and the
#: database file's ``size``, ``mtime_ns`` and inode (``ino``).
SUMMARY_KEYS = ("count", "bytes", "garbage", "mark", "size", "mtime_ns", "ino")

#: What `read_state()` found: a usable file (``ok``), none (``missing``), a symbolic
#: link or a directory in its place (``link``, ``directory``: never read, never
#: replaced), a file that cannot be read (``unreadable``), or one whose content is not a
#: state (``malformed``).
Found = Literal["ok", "missing", "link", "directory", "unreadable", "malformed"]


@dataclasses.dataclass(frozen=True)
class StateRead:
    """What `read_state()` found in a slot."""

    found: Found
    #: The file's content when ``found`` is ``ok``, else None.
    state: dict[str, Any] | None = None
    #: Why it cannot be used (None when it can), as ``logsdk spool check`` says it.
    problem: str | None = None

    @property
    def producer_id(self) -> str | None:
        """The producer id the file names, None when it cannot be used."""
        return None if self.state is None else str(self.state["producer_id"])


def read_state(directory: Path) -> StateRead:
    """The ``state.json`` of the slot at ``directory`` (see the module docstring)."""
    file = directory / STATE_NAME
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return StateRead(
            "missing",
            problem=f"no {STATE_NAME}: the next open takes the identity from the database",
        )
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            return StateRead("link", problem=f"{STATE_NAME} is a symbolic link")
        return StateRead("unreadable", problem=f"{STATE_NAME} cannot be read: {exc.strerror}")
    try:
        with os.fdopen(fd, "rb") as f:
            state = json.loads(f.read())
    except IsADirectoryError as exc:
        return StateRead("directory", problem=f"{STATE_NAME} is not valid JSON ({exc})")
    except OSError as exc:
        return StateRead("unreadable", problem=f"{STATE_NAME} is not valid JSON ({exc})")
    except (ValueError, UnicodeDecodeError) as exc:
        return StateRead("malformed", problem=f"{STATE_NAME} is not valid JSON ({exc})")
    if not isinstance(state, dict) or not isinstance(state.get("producer_id"), str):
        return StateRead("malformed", problem=f"{STATE_NAME} holds no producer_id")
    if type(state.get("seq_reserved", 0)) is not int:
        return StateRead("malformed", problem=f"seq_reserved in {STATE_NAME} is not an integer")
    return StateRead("ok", state=state)


def write_state(directory: Path, state: dict[str, Any]) -> None:
    """Replace the ``state.json`` of ``directory`` with ``state``, atomically and durably
    (see the module docstring). Raises `OSError` when it cannot."""
    path = directory / STATE_NAME
    tmp = directory / TMP_NAME
    data = json.dumps(state).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def summary_of(closed: object) -> dict[str, int] | None:
    """``closed`` as the summary of a clean close, or None when it is not a whole one."""
    if isinstance(closed, dict) and all(type(closed.get(k)) is int for k in SUMMARY_KEYS):
        return closed
    return None
