"""``logsdk shm list`` / ``logsdk shm remove NAME``: show and clean shared-memory rings."""

from __future__ import annotations

import argparse
import json

from logsdk.errors import ShmError
from logsdk.shm._inspect import inspect, list_segments, remove
from logsdk.shm._segment import segment_name


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``shm`` command group to the ``logsdk`` parser."""
    p = sub.add_parser(
        "shm",
        help="list and remove the shared-memory rings of buffer='shm' producers",
        description="Show and clean the POSIX shared-memory segments of LogProducer(buffer='shm').",
        epilog="example: logsdk shm list; logsdk shm remove /logsdk-0123456789abcdef",
    )
    ssub = p.add_subparsers(dest="shm_command", required=True)
    pl = ssub.add_parser(
        "list",
        help="list segments: name, size, records pending, owner pid and whether it is alive",
        description="List this user's logsdk segments (Linux: found in /dev/shm).",
    )
    pl.add_argument("--json", action="store_true", help="one JSON object per line")
    pl.set_defaults(func=_cmd_list)
    pr = ssub.add_parser(
        "remove",
        help="unlink a stale segment (refused while its owner is alive)",
        description="Unlink a segment whose owner is dead. Pending records are resent by "
        "the next producer on the same spool dir; --force discards them.",
    )
    pr.add_argument("name", help="segment name, as `logsdk shm list` shows it")
    pr.add_argument(
        "--force", action="store_true", help="remove even with records pending (they are lost)"
    )
    pr.set_defaults(func=_cmd_remove)


def _cmd_list(args: argparse.Namespace) -> int:
    infos = []
    for name in list_segments():
        try:
            infos.append(inspect(name))
        except ShmError:
            continue  # unlinked meanwhile, or not readable: not ours to show
    if args.json:
        for i in infos:
            print(json.dumps(i.__dict__))
        return 0
    if not infos:
        print("no logsdk shared-memory segments")
        return 0
    print(f"{'NAME':26} {'SIZE':>10} {'PENDING':>8} {'CORRUPT':>8} {'OWNER':>8} ALIVE  SPOOL DIR")
    for i in infos:
        print(
            f"{i.name:26} {i.size / 2**20:>6.1f} MiB {i.pending:>8} {i.corrupt:>8} "
            f"{i.owner_pid:>8} {'yes' if i.owner_alive else 'no ':5}  {i.spool_dir}"
        )
    return 0


def _cmd_remove(args: argparse.Namespace) -> int:
    name = segment_name(args.name.lstrip("/"), ".")
    info = inspect(name)
    if info.pending and not args.force and not info.owner_alive:
        raise ShmError(
            f"{name} holds {info.pending} unacknowledged record(s); start a producer on spool "
            f"dir {info.spool_dir!r} to resend them, or pass --force to discard them"
        )
    remove(name)
    print(f"removed {name}" + (f" ({info.pending} record(s) discarded)" if info.pending else ""))
    return 0
