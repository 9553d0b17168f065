"""The benchmarks' command line (``communicator bench`` in a checkout): object and tensor collectives
against torch.distributed and mmengine.dist, and the cost of one small call (the ``overhead`` case),
at one or several world sizes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import control_plane, control_report, ddp, recovery, tensor_path, verify
from benchmarks.cases import CASE_NAMES
from benchmarks.measured import CaseRun, all_correct
from benchmarks.overhead import CALLS, format_overhead, run_overhead
from benchmarks.payloads import FULL, QUICK
from benchmarks.phases import format_phases
from benchmarks.record import cases_record, environment, world_record
from benchmarks.run import Plan, run_benchmark
from benchmarks.scaling import format_scaling, oversubscribed
from benchmarks.table import format_errors, format_floors, format_table, format_targets, format_unjudged
from benchmarks.targets import evaluate
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
QUICK_CALLS = 20  # and short blocks
# Rounds of 1,000 calls: about 2 minutes for the overhead case at world size 2 on 2 cores.
DEFAULT_ROUNDS = 15
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
TENSOR_PATH = tensor_path.TENSOR_PATH


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--world-size",
        nargs="+",
        type=_at_least(2),
        default=[4],
        metavar="N",
        help="local gloo ranks to start (default 4); with several, each runs in turn on ranks started afresh",
    )
    parser.add_argument(
        "--repeat",
        type=_at_least(1),
        default=None,
        help=f"timed rounds of every call (default {DEFAULT_REPEAT}, {QUICK_REPEAT} with --quick)",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=(*CASE_NAMES, TENSOR_PATH, OVERHEAD, CONTROL_PLANE, RECOVERY, *ddp.CASES),
        default=[*CASE_NAMES, OVERHEAD],
        metavar="CASE",
        help=f"cases to run (default all: {' '.join(CASE_NAMES)} {OVERHEAD}; also {TENSOR_PATH}: a tensor inside an"
        " object against the tensor ops, and gathers of unknown shapes against equal ones; {CONTROL_PLANE}: the control"
        f" plane's store requests for virtual ranks; {RECOVERY}: a rank killed, the survivors shrink;"
        f" {' '.join(ddp.CASES)}: DDP and FSDP2 steps and a blocking call through comm.as_process_group()"
        " against a native gloo group)",
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
    parser.add_argument(
        "--rounds",
        type=_at_least(1),
        default=DEFAULT_ROUNDS,
        help=f"rounds of the overhead case, each a block of {CALLS} calls of either side (default {DEFAULT_ROUNDS})",
    )
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
        help=f"small payloads, 2 rounds, single calls, {QUICK_ROUNDS} overhead rounds of {QUICK_CALLS} calls: a smoke"
        " test that judges no target (31 s measured on 2 cores at load average 2 to 4, 36 to 61 s at 4 to 11)",
    )
    parser.add_argument(
        "--array-mib",
        type=_at_least(1),
        default=None,
        help="MiB of arrays per rank in the arrays, tensors and unequal cases (default 64; the unequal case's"
        " small ranks get 1/16 of it): smaller payloads for many ranks on one machine",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the ranks are stopped")
    parser.add_argument(
        "--stats",
        action="store_true",
        help="print rank 0's statistics of this library's calls in the cases (comm.stats(); not the overhead case)",
    )
    parser.add_argument(
        "--verify-docs",
        nargs="?",
        const=str(verify.CLAIMS),
        metavar="CLAIMS",
        help="rerun the commands of the performance page's claims (default docs/performance-claims.json) and say"
        " whether each reproduces (the rerun's interval overlaps the claimed one); exit 1 if one does not;"
        " --timeout applies to the reruns",
    )


def _print_report(runs: Sequence[CaseRun], quick: bool) -> None:
    print(format_table(runs))
    errors = format_errors(runs)
    if errors:
        print(f"\n{errors}")
    floors = format_floors(runs)
    if floors:
        print(f"\nthe same rounds against the floors and the safe serializer\n{floors}")
    if quick:  # the targets are set for the full payloads: small ones would only produce noise
        print(f"\n{format_unjudged()}")
    else:
        outcomes = evaluate(runs)
        if outcomes:
            print(
                "\ntargets: the median of the rounds' ratios [90 % confidence interval]; met or missed only where the"
                f" interval lies on one side of the target, else within noise\n{format_targets(outcomes)}"
            )
    for run in runs:
        if run.phases:
            print(f"\n{format_phases(run.case, run.phases, len(run.bytes_per_rank))}")


def _world(world_size: int) -> str:
    """``world size N``, and whether its ranks outnumber the cores."""
    crowded = oversubscribed(world_size)
    return f"world size {world_size}" + (f", {crowded}" if crowded else "")


def _cases(plan: Plan, args: argparse.Namespace) -> list[CaseRun]:
    runs, statistics = run_benchmark(plan, args.timeout)
    more = f" ({plan.max_repeat} for targets within noise)" if plan.max_repeat > plan.repeat else ""
    print(f"{_world(plan.world_size)}, median of {plan.repeat} rounds{more}, slowest rank per round")
    _print_report(runs, args.quick)
    if statistics is not None:
        print(f"\nrank 0's operations in the cases, every call (comm.stats())\n{statistics}")
    return runs


def _overhead(world_size: int, args: argparse.Namespace) -> dict[str, object]:
    rounds = QUICK_ROUNDS if args.quick else args.rounds
    cap = rounds if args.quick else (args.max_rounds or MAX_FACTOR * rounds)
    calls = QUICK_CALLS if args.quick else CALLS
    rows, recording = run_overhead(world_size, rounds, cap, args.timeout, calls)
    if args.quick:  # a smoke test: no verdict, as for the cases' targets
        rows = [dataclasses.replace(row, judged=False) for row in rows]
        recording = dataclasses.replace(recording, judged=False)
    print(format_overhead(rows, recording, world_size, calls))
    return {
        "rounds": rounds,
        "max_rounds": cap,
        "calls": calls,
        "recording_us": recording.spread.median,
        "recording": {**dataclasses.asdict(recording.spread), "verdict": recording.verdict},
        "rows": [{**dataclasses.asdict(row), "ratio": row.ratio, "verdict": row.verdict} for row in rows],
    }


def _through_the_group(sizes: Sequence[int], args: argparse.Namespace, worlds: dict[int, dict[str, object]]) -> str:
    """The ddp, fsdp and pg-overhead cases at every size, recorded in ``worlds``: their table, or ""."""
    cases = [case for case in ddp.CASES if case in args.cases]
    if not cases:
        return ""
    if args.quick:
        settings = ddp.Settings.quick_run()
    else:
        settings = ddp.Settings(rounds=args.rounds, cap=args.max_rounds or MAX_FACTOR * args.rounds)
    rows: list[ddp.Row] = []
    for size in sizes:
        found = ddp.run(size, cases, settings, args.timeout)
        worlds[size]["process_group"] = [{**dataclasses.asdict(r), "verdict": r.verdict} for r in found]
        rows += found
    return ddp.format_rows(rows, settings)


def _tensor_path(size: int, plan: Plan, args: argparse.Namespace, world: dict[str, Any]) -> bool:
    """The tensor-path case at one size, printed and recorded in ``world``: whether this library was right."""
    sizes = tensor_path.QUICK if args.quick else tensor_path.FULL
    result = tensor_path.run(size, sizes, plan.repeat, plan.max_repeat, plan.min_sample_seconds, args.timeout)
    text, record, correct = tensor_path.report(result, args.quick)
    more = f" ({plan.max_repeat} for targets within noise)" if plan.max_repeat > plan.repeat else ""
    print(f"{_world(size)}, {TENSOR_PATH}: median of {plan.repeat} rounds{more}, slowest rank per round\n{text}")
    world.setdefault("cases", {})[TENSOR_PATH] = record
    world.setdefault("targets", []).extend(record["targets"])
    world["all_correct"] = world.get("all_correct", True) and correct
    return correct


def _first_failure(error: CommError) -> str:
    """The first failed rank's report: the others usually only echo it."""
    if isinstance(error, RemoteError):
        others = len(error.failures) - 1
        return f"{error.failures[0]}" + (f" (and {others} more reports from the ranks)" if others else "")
    return str(error)


def rerun(argv: list[str]) -> int:
    """The bench with other arguments, as from the command line: what ``--verify-docs`` reruns."""
    parser = argparse.ArgumentParser(prog="communicator bench")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.verify_docs:
        return verify.verify_docs(args.verify_docs, rerun, args.timeout)
    sizes = list(dict.fromkeys(args.world_size))
    repeat = args.repeat or (QUICK_REPEAT if args.quick else DEFAULT_REPEAT)
    cases = tuple(name for name in CASE_NAMES if name in args.cases)
    max_repeat = 0 if args.quick else (args.max_repeat or MAX_FACTOR * repeat)
    payloads = QUICK if args.quick else FULL
    if args.array_mib is not None:
        array_bytes = args.array_mib * 2**20
        payloads = dataclasses.replace(payloads, array_bytes=array_bytes, unequal_small_bytes=array_bytes // 16)
    sample = 0.0 if args.quick else MIN_SAMPLE_SECONDS
    record: dict[str, object] = {
        "world_sizes": sizes,
        "repeat": repeat,
        "max_repeat": max_repeat,
        "quick": args.quick,
        "array_bytes": payloads.array_bytes,
        "environment": environment(),
    }
    worlds = {size: world_record(size) for size in sizes}
    runs: dict[int, list[CaseRun]] = {}
    tensors_right = True
    if CONTROL_PLANE in args.cases:  # virtual ranks in this process: no world size
        results = control_plane.run(args.ranks)
        if args.real_store:
            results += control_plane.run(args.ranks, real=True)
        print("the control plane, virtual ranks (requests counted; times against a TCPStore with --real-store)")
        print(control_plane.format_table(results))
        if args.plot:
            control_report.plot(results, args.plot)
        record[CONTROL_PLANE] = [{**dataclasses.asdict(r), "knows_within": r.knows_within} for r in results]
    try:
        if RECOVERY in args.cases:
            rounds = 2 if args.quick else (args.repeat or 5)
            recovered = [recovery.run(size, rounds, args.timeout) for size in sizes]
            print(f"a rank killed, the survivors shrink: seconds from the death, median of {rounds} rounds")
            print(recovery.format_table(recovered))
            for result in recovered:
                worlds[result.world_size][RECOVERY] = dataclasses.asdict(result)
        for index, size in enumerate(sizes):
            plan = Plan(size, repeat, cases, payloads, sample, args.stats, max_repeat)
            if cases:
                if index:
                    print()
                runs[size] = _cases(plan, args)
                worlds[size].update(cases_record(runs[size], args.quick))
            if TENSOR_PATH in args.cases:
                if cases or index:
                    print()
                tensors_right = _tensor_path(size, plan, args, worlds[size]) and tensors_right
            if OVERHEAD in args.cases:
                if cases or index or TENSOR_PATH in args.cases:
                    print()
                worlds[size][OVERHEAD] = _overhead(size, args)
        trained = _through_the_group(sizes, args, worlds)
        if trained:
            print(
                f"\n{trained}"
                if cases or OVERHEAD in args.cases or TENSOR_PATH in args.cases or RECOVERY in args.cases
                else trained
            )
        scaling = format_scaling(runs) if len(runs) > 1 else ""
        if scaling:
            print(f"\n{scaling}")
    except CommError as error:
        print(f"communicator bench: the ranks failed: {_first_failure(error)}", file=sys.stderr)
        return 1
    correct = tensors_right and all(all_correct(case_runs) for case_runs in runs.values())
    record = {**record, "all_correct": correct, "worlds": list(worlds.values())}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(record, out, indent=1)
    return 0 if correct else 1
