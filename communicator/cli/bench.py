"""``communicator bench``: object and tensor collectives against torch.distributed and mmengine.dist,
and the cost of one small call (the ``overhead`` case)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence

from communicator.bench import control_plane, recovery
from communicator.bench.cases import CASE_NAMES
from communicator.bench.measured import CaseRun, all_correct
from communicator.bench.overhead import format_overhead, run_overhead
from communicator.bench.payloads import FULL, QUICK
from communicator.bench.record import to_json
from communicator.bench.run import Plan, run_benchmark
from communicator.bench.table import format_errors, format_table, format_targets
from communicator.bench.targets import evaluate
from communicator.errors import CommError, RemoteError

__all__ = ["add_arguments", "run"]

OVERHEAD = "overhead"
# The peers' 64 MiB calls take seconds each: three rounds keep a default run near five minutes on 2 cores.
DEFAULT_REPEAT = 3
QUICK_REPEAT = 2
# Where a target's interval straddles it, its calls run more rounds, up to this many times --repeat
# (and the overhead rows up to this many times --rounds): never a verdict from a few noisy rounds.
MAX_FACTOR = 3
QUICK_ROUNDS = 5  # the overhead case in a smoke test: the fewest rounds with a 90 % interval
# A sample of a short call lasts at least this long (a smoke test takes single calls).
MIN_SAMPLE_SECONDS = 0.2


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {minimum}, got {text}")
        return value

    return parse


CONTROL_PLANE = "control-plane"
RECOVERY = "recovery"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=_at_least(2), default=4, help="local gloo ranks to start (default 4)")
    parser.add_argument(
        "--repeat",
        type=_at_least(1),
        default=None,
        help=f"timed rounds of every call (default {DEFAULT_REPEAT}, {QUICK_REPEAT} with --quick)",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=(*CASE_NAMES, OVERHEAD, CONTROL_PLANE, RECOVERY),
        default=[*CASE_NAMES, OVERHEAD],
        metavar="CASE",
        help=f"cases to run (default all: {' '.join(CASE_NAMES)} {OVERHEAD}; also {CONTROL_PLANE}: the control"
        f" plane's store requests for virtual ranks; {RECOVERY}: a rank killed, the survivors shrink)",
    )
    parser.add_argument(
        "--ranks",
        nargs="+",
        type=_at_least(2),
        default=list(control_plane.SIZES),
        help="virtual ranks of the control-plane case (default 64 1024 10000)",
    )
    parser.add_argument("--plot", metavar="PATH", help="control-plane case: also draw the requests against ranks here")
    parser.add_argument(
        "--real-store",
        action="store_true",
        help="control-plane case: also time the requests against a real TCPStore server",
    )
    parser.add_argument(
        "--max-repeat",
        type=_at_least(1),
        default=None,
        help=f"rounds, at most, of the calls of a target whose interval straddles it (default {MAX_FACTOR}"
        " times --repeat; none with --quick)",
    )
    parser.add_argument("--rounds", type=_at_least(1), default=101, help="rounds of the overhead case (default 101)")
    parser.add_argument(
        "--max-rounds",
        type=_at_least(1),
        default=None,
        help=f"overhead case: rounds, at most, of a row whose interval straddles its target (default {MAX_FACTOR}"
        f" times --rounds; {QUICK_ROUNDS} with --quick)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every median, raw time, check and target here")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small payloads, 2 rounds, single calls, 5 overhead rounds: a smoke test (about 15 s on 2 cores)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the ranks are stopped")
    parser.add_argument(
        "--stats",
        action="store_true",
        help="print rank 0's statistics of this library's calls in the cases (comm.stats(); not the overhead case)",
    )


def _print_report(runs: Sequence[CaseRun], quick: bool) -> None:
    print(format_table(runs))
    errors = format_errors(runs)
    if errors:
        print(f"\n{errors}")
    if quick:  # the targets are set for the full payloads: small ones would only produce noise
        print("\ntargets: not judged in a --quick run (they are set for the full payloads)")
        return
    outcomes = evaluate(runs)
    if outcomes:
        print(
            "\ntargets: the median of the rounds' ratios [90 % confidence interval]; met or missed only where the"
            f" interval lies on one side of the target, else within noise\n{format_targets(outcomes)}"
        )


def _first_failure(error: CommError) -> str:
    """The first failed rank's report: the others usually only echo it."""
    if isinstance(error, RemoteError):
        others = len(error.failures) - 1
        return f"{error.failures[0]}" + (f" (and {others} more reports from the ranks)" if others else "")
    return str(error)


def run(args: argparse.Namespace) -> int:
    repeat = args.repeat or (QUICK_REPEAT if args.quick else DEFAULT_REPEAT)
    cases = tuple(name for name in CASE_NAMES if name in args.cases)
    overhead = OVERHEAD in args.cases
    plan = Plan(
        args.world_size,
        repeat,
        cases,
        QUICK if args.quick else FULL,
        0.0 if args.quick else MIN_SAMPLE_SECONDS,
        args.stats,
        0 if args.quick else (args.max_repeat or MAX_FACTOR * repeat),
    )
    record: dict[str, object] = {}
    runs: list[CaseRun] = []
    if CONTROL_PLANE in args.cases:
        results = control_plane.run(args.ranks)
        if args.real_store:
            results += control_plane.run(args.ranks, real=True)
        print("the control plane, virtual ranks (requests counted; times against a TCPStore with --real-store)")
        print(control_plane.format_table(results))
        if args.plot:
            control_plane.plot(results, args.plot)
        record[CONTROL_PLANE] = [{**dataclasses.asdict(r), "knows_within": r.knows_within} for r in results]
    try:
        if RECOVERY in args.cases:
            rounds = 2 if args.quick else (args.repeat or 5)
            recovered = recovery.run(args.world_size, rounds, args.timeout)
            print(f"a rank killed, the survivors shrink: seconds from the death, median of {rounds} rounds")
            print(recovery.format_table([recovered]))
            record[RECOVERY] = dataclasses.asdict(recovered)
        if cases:
            runs, statistics = run_benchmark(plan, args.timeout)
            more = f" ({plan.max_repeat} for targets within noise)" if plan.max_repeat > plan.repeat else ""
            print(f"world size {plan.world_size}, median of {plan.repeat} rounds{more}, slowest rank per round")
            _print_report(runs, args.quick)
            if statistics is not None:
                print(f"\nrank 0's operations in the cases, every call (comm.stats())\n{statistics}")
            record = {**record, **to_json(plan, runs, args.quick)}
        if overhead:
            rounds = QUICK_ROUNDS if args.quick else args.rounds
            cap = rounds if args.quick else (args.max_rounds or MAX_FACTOR * rounds)
            rows, recording = run_overhead(args.world_size, rounds, cap, args.timeout)
            print(("\n" if cases else "") + format_overhead(rows, recording, args.world_size))
            record[OVERHEAD] = {
                "world_size": args.world_size,
                "rounds": rounds,
                "max_rounds": cap,
                "recording_us": recording.spread.median,
                "recording": {**dataclasses.asdict(recording.spread), "verdict": recording.verdict},
                "rows": [{**dataclasses.asdict(row), "ratio": row.ratio, "verdict": row.verdict} for row in rows],
            }
    except CommError as error:
        print(f"communicator bench: the ranks failed: {_first_failure(error)}", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as out:
            json.dump(record, out, indent=1)
    return 0 if all_correct(runs) else 1
