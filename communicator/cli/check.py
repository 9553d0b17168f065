"""``communicator check``: the command line of :mod:`communicator.check` (options, local ranks, exit status).

srun -n 8 communicator check
mpirun -np 4 python -m communicator check
torchrun --nproc-per-node 4 -m communicator check
python -m communicator check --local 4        # starts 4 local gloo ranks itself
python -m communicator check                  # no launcher: one process (NonDistComm)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from communicator.base import Communicator
from communicator.check import CHECKS, DEFAULT_SIZES, SIZES, TIMED_RUNS, Aborted, Check, check_job
from communicator.config import CommConfig
from communicator.errors import CommError, ConfigError, RemoteError

__all__ = ["add_arguments", "run", "run_local"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes",
        default=",".join(DEFAULT_SIZES),
        help=f"comma-separated sizes to check, of {', '.join(f'{k}={v}' for k, v in SIZES.items())} "
        "elements (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds any one op may take: the communicator's timeout (default: %(default)s)",
    )
    parser.add_argument(
        "--local",
        type=int,
        default=None,
        metavar="N",
        help="start N local gloo ranks instead of joining a launcher's job",
    )
    parser.add_argument(
        "--ops", default=None, help="comma-separated parts of op names: check only the ops whose name contains one"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=TIMED_RUNS,
        metavar="N",
        help="timed runs of each op after the checked one; the time shown is their median (default: %(default)s;"
        " 0: the time of the checked run)",
    )


def _select(ops: str | None) -> list[Check]:
    if ops is None:
        return list(CHECKS)
    wanted = [part.strip() for part in ops.split(",") if part.strip()]
    chosen = [check for check in CHECKS if any(part in check.name for part in wanted)]
    if not chosen:
        raise ConfigError(f"--ops {ops!r} matches no op; the ops are: {', '.join(c.name for c in CHECKS)}")
    return chosen


class _Stopped(Exception):
    """A local rank's report after the run stopped; it reaches the parent as the error message."""


def _local_rank_job(
    comm: Communicator, checks: Sequence[Check], sizes: Sequence[str], repeat: int
) -> tuple[int, list[str]]:
    lines: list[str] = []
    try:
        status = check_job(comm, checks, sizes, emit=lines.append, repeat=repeat)
    except Aborted as aborted:
        raise _Stopped("\n".join(lines)) from aborted  # leaving the block with it releases the other ranks
    return status, lines


def run_local(
    nproc: int,
    checks: Sequence[Check] = CHECKS,
    sizes: Sequence[str] = DEFAULT_SIZES,
    timeout: float = 60.0,
    repeat: int = TIMED_RUNS,
) -> int:
    """``check --local N``: start ``nproc`` local gloo ranks, run ``checks`` on them (each once, then
    ``repeat`` timed runs), print rank 0's report; the exit status. ``timeout`` bounds each op; the
    ranks are stopped after ``60 + 3 * timeout`` s."""
    from communicator.testing.spawn import launch

    config = {"backend": "gloo", "timeout": timeout}
    try:
        results = launch(_local_rank_job, nproc, config, (checks, sizes, repeat), timeout=60 + 3 * timeout)
    except RemoteError as error:
        reports = [failure.message for failure in error.failures if failure.error_type == _Stopped.__name__]
        if reports:  # the ranks' reports so far are the command's output
            print("\n".join(reports), flush=True)
        else:
            print(f"communicator check: the local ranks failed: {error}", file=sys.stderr, flush=True)
        return 1
    except CommError as error:
        print(f"communicator check: the local ranks failed: {error}", file=sys.stderr, flush=True)
        return 1
    status, lines = results[0]
    print("\n".join(lines), flush=True)
    return int(status)


def run(args: argparse.Namespace) -> int:
    try:
        sizes = [size.strip() for size in args.sizes.split(",") if size.strip()]
        if not sizes or any(size not in SIZES for size in sizes):
            raise ConfigError(f"--sizes {args.sizes!r} is invalid: expected names among {', '.join(SIZES)}")
        if args.timeout <= 0:
            raise ConfigError(f"--timeout {args.timeout} is invalid: expected a positive number of seconds")
        if args.local is not None and args.local < 1:
            raise ConfigError(f"--local {args.local} is invalid: expected a positive number of ranks")
        if args.repeat < 0:
            raise ConfigError(f"--repeat {args.repeat} is invalid: expected a number of runs, 0 or more")
        checks = _select(args.ops)
        config = CommConfig.from_env().replace(timeout=args.timeout)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.local is not None:
        return run_local(args.local, checks, sizes, args.timeout, args.repeat)
    try:
        with Communicator.create(config) as comm:
            return check_job(comm, checks, sizes, repeat=args.repeat)
    except Aborted:
        return 1  # already reported
    except Exception as error:  # noqa: BLE001 - a broken job is reported, not a traceback
        print(f"communicator check: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return 1
