"""``communicator trace DIR``: merge the ranks' flight-recorder dumps and say where they diverged."""

from __future__ import annotations

import argparse
import os

from communicator.traces import report

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="where the ranks wrote their dumps (the configuration's trace_dir)")


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.directory):
        print(f"communicator trace: {args.directory} is not a directory")
        return 2
    print(report(args.directory))
    return 0
