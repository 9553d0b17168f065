"""``communicator bench``: run the benchmarks of a source checkout (``benchmarks/`` beside the package).

The studies behind the performance page (object and tensor collectives against torch.distributed,
mmengine.dist and the physical floor, the cost of one small call, DDP step times, the control plane
at scale) live in the repository's ``benchmarks/`` package, outside the wheel; this command finds it
and hands it its arguments. An installed wheel without a checkout says where to get it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["add_arguments", "run"]

#: Where the benchmarks are, relative to the package's folder: its repository's root.
CHECKOUT = Path(__file__).resolve().parents[2]


def _studies() -> ModuleType | None:
    """``benchmarks.cli`` of this package's checkout, or ``None`` for an installed wheel."""
    if not (CHECKOUT / "benchmarks" / "cli.py").is_file():
        return None
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))  # the ranks the benchmarks start inherit the path
    return importlib.import_module("benchmarks.cli")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    studies = _studies()
    if studies is not None:
        studies.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    studies = _studies()
    if studies is None:
        print(
            "communicator bench runs the benchmarks of a source checkout (its benchmarks/ folder, not part of "
            f"the installed package at {CHECKOUT}): clone the repository, install it with pip install -e "
            "'.[bench]' and run communicator bench there",
            file=sys.stderr,
        )
        return 2
    code: int = studies.run(args)
    return code
