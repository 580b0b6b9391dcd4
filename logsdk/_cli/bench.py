"""``logsdk bench``: run ``benchmarks/run_all.py`` of a source checkout."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from logsdk._cli._common import Subparsers, add_command
from logsdk.errors import LogSDKError

#: Where the benchmarks live when logsdk runs from a source checkout (``pip install -e``).
CHECKOUT_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def register(sub: Subparsers) -> None:
    """Add ``logsdk bench``."""
    p = add_command(
        sub,
        "bench",
        help="run the benchmarks (source checkout) and print the table",
        description=(
            "Run benchmarks/run_all.py of the source checkout logsdk is installed from "
            "(the benchmarks are not part of the wheel): every benchmark runs against an "
            "embedded broker, figures go to benchmarks/results.json and a table is "
            "printed. Arguments after -- go to every benchmark script."
        ),
        examples="""
            logsdk bench
            logsdk bench --list
            logsdk bench -- --records 20000 --rounds 1
        """,
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=CHECKOUT_BENCHMARKS,
        help="the benchmarks directory (default: the checkout's benchmarks/)",
    )
    p.add_argument("--list", action="store_true", help="list the benchmark scripts and exit")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the scripts")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run (or list) the benchmarks; the exit status is run_all.py's."""
    runner = args.dir / "run_all.py"
    if not runner.is_file():
        raise LogSDKError(
            f"no benchmarks found ({runner} does not exist): `logsdk bench` needs a source "
            "checkout of logsdk installed with `pip install -e .`, or --dir pointing at its "
            "benchmarks/ directory"
        )
    if args.list:
        for script in sorted(args.dir.glob("*.py")):
            if script.stem not in ("run_all", "_common") and not script.stem.startswith("_"):
                print(script.stem)
        return 0
    extra = list(args.script_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    proc = subprocess.run([sys.executable, str(runner), *extra], cwd=args.dir.parent, check=False)
    return 0 if proc.returncode == 0 else 1
