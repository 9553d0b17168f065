"""``communicator trace DIR``: merge the ranks' flight-recorder dumps and say where they diverged.

Exit status: 0 when every dump was read, 1 when one was left out (each named on stderr, with why)
or there was none to read, 2 when ``DIR`` is not a directory.
"""

from __future__ import annotations

import argparse
import os
import sys

from communicator.observe.traces import clean, report

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="where the ranks wrote their dumps (the configuration's trace_dir)")


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.directory):
        print(f"communicator trace: {clean(args.directory)} is not a directory", file=sys.stderr)
        return 2
    findings, unreadable, found = report(args.directory)
    print(findings)
    for line in unreadable:
        print(f"communicator trace: left out {line}", file=sys.stderr)
    return 1 if unreadable or not found else 0
