"""``python -m communicator`` / ``communicator``: demo, info, check, bench, trace and store.

Exit status: 0 for success, 1 when the command ran and found a failure, 2 for a usage error
(argparse's convention); error messages go to stderr.

This module imports no torch: ``--help``, ``--version`` and usage errors answer at once. Once the
arguments name a command, the package loads (torch, the ``"communicator"`` backend) and the
command's module adds its options.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import communicator
from communicator.version import __version__

__all__ = ["main"]

# Each command is a module of this package with ``add_arguments(parser)`` and ``run(args) -> int``.
COMMANDS = {
    "demo": "run a distributed evaluation on local gloo ranks and check it against one process",
    "info": "show what Communicator.create() would build here, and why",
    "check": "run every collective across the ranks of a real job and report pass/fail and each op's time",
    "bench": "time object and tensor collectives against torch.distributed and mmengine.dist",
    "trace": "merge the ranks' flight-recorder dumps and show where they diverged",
    "store": "serve a rendezvous store outside the ranks, so that survivors of any lost rank can go on",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="communicator", description="One object for distributed PyTorch.")
    parser.add_argument("--version", action="version", version=f"communicator {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    module = None
    for name, help_text in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the command that runs is imported (bench pulls in more than info)
            communicator._load()  # what `import communicator` does, before the command's own imports
            module = importlib.import_module(f"communicator.cli.{name}")
            module.add_arguments(sub)
    args = parser.parse_args(argv)
    if module is None:  # no command is a usage error, as argparse reports one: the help, on stderr
        parser.print_help(sys.stderr)
        return 2
    code: int = module.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
