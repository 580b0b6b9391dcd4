"""Starting an agent nobody started: ``LogProducer(..., delivery="agent", start_agent=True)``.

A producer that finds no agent holding its spool root starts one: ``python -m logsdk.cli
agent`` with the producer's bootstrap servers and librdkafka properties, in a session of
its own and through an intermediate process that leaves at once (so it outlives the
worker that started it, is nobody's child, and a signal to the worker's process group
does not reach it), its output appended to ``<root>/agent/agent.log``.

Invariants:
- at most one agent runs per spool root whatever the race: several workers starting at
  once may each start one; the lock (`logsdk.agent._lock`) lets one run and the
  others exit at once (status 1, one line in the log);
- the librdkafka properties (secrets included) go to the agent through its environment
  (``LOGSDK_AGENT_KAFKA_CONFIG``, JSON), readable by the same user only, never through
  its command line, which any local user can read.

Owner: none (a function); the producer's constructor calls it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping

from logsdk.agent._lock import agent_dir
from logsdk.errors import ShmError

log = logging.getLogger("logsdk.producer")

#: The environment variable the agent reads its librdkafka properties from (JSON).
ENV_KAFKA_CONFIG = "LOGSDK_AGENT_KAFKA_CONFIG"
LOG_NAME = "agent.log"


#: Run by an intermediate process: start the agent (argv[2:]) with its output appended to
#: argv[1], print its pid, and leave at once, so that the agent is nobody's child (init
#: reaps it; the producer's process never holds a handle on it).
_DETACH = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
out = os.dup(1)
os.dup2(fd, 1)
os.dup2(fd, 2)
pid = os.spawnv(os.P_NOWAIT, sys.argv[2], sys.argv[2:])
os.write(out, str(pid).encode())
"""


def start_agent(
    root: str | os.PathLike[str],
    bootstrap_servers: str,
    kafka_config: Mapping[str, str | int | float | bool],
) -> int:
    """Start ``logsdk agent`` for ``root`` in the background; its pid."""
    d = agent_dir(root)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = dict(os.environ)
    env[ENV_KAFKA_CONFIG] = json.dumps(dict(kafka_config))
    cmd = [sys.executable, "-m", "logsdk.cli", "agent", "--spool-root", os.fspath(root),
           "--bootstrap-servers", bootstrap_servers]  # fmt: skip
    try:
        done = subprocess.run(
            [sys.executable, "-S", "-c", _DETACH, os.fspath(d / LOG_NAME), *cmd],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=env,
            start_new_session=True,  # the agent's session: no signal to this group reaches it
            timeout=30,
            check=True,
        )
        pid = int(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise ShmError(f"could not start logsdk agent for {root}: {exc}") from exc
    log.warning(
        "delivery='agent': no logsdk agent held spool root %s; started one (pid %d, log %s)",
        root,
        pid,
        d / LOG_NAME,
    )
    return pid
