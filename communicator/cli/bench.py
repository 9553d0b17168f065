"""``communicator bench``: object and tensor collectives against torch.distributed and mmengine.dist."""

from __future__ import annotations

import argparse
import json
import sys

from communicator.bench.cases import CASE_NAMES
from communicator.bench.payloads import FULL, QUICK
from communicator.bench.report import all_correct, format_errors, format_table, format_targets, to_json
from communicator.bench.run import Plan, run_benchmark
from communicator.bench.targets import evaluate
from communicator.errors import CommError

__all__ = ["add_arguments", "run"]

DEFAULT_REPEAT = 5
QUICK_REPEAT = 2


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=_positive, default=4, help="local gloo ranks to start (default 4)")
    parser.add_argument(
        "--repeat", type=_positive, default=None,
        help=f"timed repetitions per call (default {DEFAULT_REPEAT}, {QUICK_REPEAT} with --quick)",
    )
    parser.add_argument(
        "--cases", nargs="+", choices=CASE_NAMES, default=list(CASE_NAMES), metavar="CASE",
        help=f"cases to run (default all: {' '.join(CASE_NAMES)})",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every median, raw time, check and target here")
    parser.add_argument("--quick", action="store_true", help="small payloads and 2 repetitions: a smoke test")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the ranks are stopped")


def run(args: argparse.Namespace) -> int:
    if args.world_size < 2:
        print("communicator bench: --world-size must be at least 2 (a collective needs peers)", file=sys.stderr)
        return 2
    repeat = args.repeat or (QUICK_REPEAT if args.quick else DEFAULT_REPEAT)
    cases = tuple(name for name in CASE_NAMES if name in args.cases)
    plan = Plan(args.world_size, repeat, cases, QUICK if args.quick else FULL)
    try:
        runs = run_benchmark(plan, args.timeout)
    except CommError as error:
        print(f"communicator bench: the ranks failed: {error}", file=sys.stderr)
        return 1
    print(f"world size {plan.world_size}, median of {plan.repeat} repetitions, slowest rank per repetition")
    print(format_table(runs))
    errors = format_errors(runs)
    if errors:
        print(f"\n{errors}")
    outcomes = evaluate(runs)
    if outcomes:
        print(f"\ntargets\n{format_targets(outcomes)}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(to_json(plan, runs, args.quick), out, indent=1)
    return 0 if all_correct(runs) else 1
