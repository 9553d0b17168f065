"""The performance page's headline claims: measured into one file, rendered into the page, rerun on demand.

``docs/performance-claims.json`` holds every claim of the page's "At a glance" table: the case,
the op, the peer, the world size, the ratio (the peer's time over ours, the median of the
per-round ratios, with its 90 % confidence interval and rounds), and the command, the machine and
the load average that gave it. The page's table is rendered from that file and from nothing else
(``python -m benchmarks.verify render``; a test checks the page against the file).

``communicator bench --verify-docs`` reruns each distinct command of the claims and says, claim by
claim, whether it reproduces: the rerun's interval must overlap the claimed one. It exits 1 when
a claim does not reproduce or could not be measured. ``python -m benchmarks.verify measure`` runs
the headline command and writes the claims file, the page's table and the plot (:mod:`.plot`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from benchmarks.floor import FLOOR_FRESH
from benchmarks.ops import MMENGINE, OURS, TORCH
from benchmarks.overhead import IGNITE
from benchmarks.spread import CONFIDENCE, Spread, spread_of
from benchmarks.tensor_path import OURS_TENSOR, TENSOR_PATH, MiB, size_text, sweep_op, tensor_op

__all__ = [
    "CLAIMS",
    "HEADLINE",
    "Claim",
    "Pick",
    "against",
    "load_claims",
    "main",
    "measured",
    "render",
    "reproduces",
    "verify_docs",
    "with_table",
]

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "docs" / "performance-claims.json"
PAGE = ROOT / "docs" / "performance.md"
PLOT = ROOT / "docs" / "images" / "performance-at-a-glance.png"
START = "<!-- claims: rendered from docs/performance-claims.json by python -m benchmarks.verify render -->"
END = "<!-- claims: end -->"
PREFIX = ("python", "-m", "communicator", "bench")
OVERHEAD = "overhead"
#: The run behind the headline: both world sizes, the cases of the headline, 5 rounds (the fewest
#: with a 90 % interval), more where a target's interval straddles it.
HEADLINE_ARGS = (
    *("--world-size", "2", "4"),
    *("--cases", "small", "records", "arrays", "dict100", TENSOR_PATH, OVERHEAD),
    *("--repeat", "5"),
)
VERSIONS = ("python", "torch", "mmengine", "ignite")
LOAD_EVERY = 5.0  # seconds between looks at the load average during a run

BenchRunner = Callable[[list[str]], int]  # bench arguments (after ``bench``) -> its exit status


@dataclasses.dataclass(frozen=True)
class Pick:
    """One headline comparison: an op of a case (for the ``overhead`` case, a row's name) against a peer."""

    case: str
    op: str
    peer: str
    what: str  # how the page names it


_SMALL, _ARRAYS, _TENSOR = "a dict of 10 floats", "64 MiB of NumPy arrays a rank", "one 64 MiB tensor a rank"
#: Chosen before measuring: each object op, result collection, dict reduction and tiny op against
#: the peers that run it (ignite only in the overhead case) and the floor for large payloads.
HEADLINE = (
    Pick("small", "all_gather_object", TORCH, f"all_gather_object, {_SMALL}"),
    Pick("small", "all_gather_object", MMENGINE, f"all_gather_object, {_SMALL}"),
    Pick("small", "gather_object", TORCH, f"gather_object, {_SMALL}"),
    Pick("small", "broadcast_object", TORCH, f"broadcast_object, {_SMALL}"),
    Pick("arrays", "all_gather_object", TORCH, f"all_gather_object, {_ARRAYS}"),
    Pick("arrays", "all_gather_object", MMENGINE, f"all_gather_object, {_ARRAYS}"),
    Pick("arrays", "all_gather_object", FLOOR_FRESH, f"all_gather_object, {_ARRAYS}"),
    Pick("arrays", "gather_object", TORCH, f"gather_object, {_ARRAYS}"),
    Pick("arrays", "broadcast_object", TORCH, f"broadcast_object, {_ARRAYS}"),
    Pick("records", "collect_results", MMENGINE, "collect_results, 1000 small dicts a rank"),
    Pick("arrays", "collect_results", MMENGINE, f"collect_results, {_ARRAYS}"),
    Pick("arrays", "collect_results", FLOOR_FRESH, f"collect_results, {_ARRAYS}"),
    *(
        Pick(TENSOR_PATH, op, peer, f"{op}, {_TENSOR}")
        for op in ("all_gather_object", "broadcast_object")
        for peer in (OURS_TENSOR, TORCH, IGNITE, MMENGINE)
    ),
    *(
        Pick(TENSOR_PATH, sweep_op(kind, size), peer, f"{kind}, shapes unknown, {size_text(size)} a rank")
        for kind, peer in (("all_gather", OURS_TENSOR), ("gather", TORCH))
        for size in (MiB, 16 * MiB)
    ),
    Pick("dict100", "all_reduce_dict", TORCH, "all_reduce_dict, 100 scalars"),
    Pick("dict100", "all_reduce_dict", MMENGINE, "all_reduce_dict, 100 scalars"),
    *(
        Pick(OVERHEAD, f"{op}, 1 element", peer, f"{op}, 1 element")
        for op, peers in (("all_reduce", (TORCH, MMENGINE, IGNITE)), ("broadcast", (TORCH, IGNITE)))
        for peer in peers
    ),
)
#: How the table names a peer (this library's tensor op: :func:`against`).
PEERS = {
    TORCH: "torch.distributed",
    MMENGINE: "mmengine.dist",
    IGNITE: "ignite.distributed",
    FLOOR_FRESH: "the floor (same bytes, new memory)",
}


def against(op: str, peer: str) -> str:
    """How the table names the side an op is compared with."""
    return f"ours: {tensor_op(op)}" if peer == OURS_TENSOR else PEERS.get(peer, peer)


@dataclasses.dataclass(frozen=True)
class Claim:
    """A measured ratio, the peer's time over ours (above 1: ours is faster), and where it came from."""

    what: str
    case: str
    op: str
    peer: str
    world_size: int
    median: float
    low: float
    high: float
    rounds: int
    confidence: float  # 0 where too few rounds gave no 90 % interval: low and high are then the range
    command: str
    machine: dict[str, Any]  # cores, load average during the run, versions, date

    @property
    def pick(self) -> Pick:
        return Pick(self.case, self.op, self.peer, self.what)

    @property
    def spread(self) -> Spread:
        return Spread(self.median, self.low, self.high, self.rounds, self.confidence)


def load_claims(path: Path | str = CLAIMS) -> list[Claim]:
    with open(path) as source:
        return [Claim(**claim) for claim in json.load(source)["claims"]]


def _world(record: dict[str, Any], world_size: int) -> dict[str, Any]:
    return next((w for w in record.get("worlds", []) if w["world_size"] == world_size), {})


def measured(record: dict[str, Any], pick: Pick, world_size: int) -> Spread | None:
    """The pick's ratio, the peer's time over ours, in a bench JSON record; ``None`` where it did not run."""
    world = _world(record, world_size)
    if pick.case == OVERHEAD:
        rows = world.get(OVERHEAD, {}).get("rows", [])
        row = next((r for r in rows if r["name"] == pick.op and r["baseline"] == pick.peer), None)
        if row is None or row["spread"] is None:
            return None
        # The overhead case reports ours over theirs; inverted (order statistics invert with it),
        # every claim reads the same way.
        ours = Spread(**row["spread"])
        return Spread(1 / ours.median, 1 / ours.high, 1 / ours.low, ours.rounds, ours.confidence)
    impls = world.get("cases", {}).get(pick.case, {}).get("ops", {}).get(pick.op, {}).get("impls", {})
    theirs, ours_ms = impls.get(pick.peer, {}).get("times_ms"), impls.get(OURS, {}).get("times_ms")
    if not theirs or not ours_ms:
        return None
    # Round k of both sides ran in the same interleaved round; a side with extra rounds (for a
    # target of its own) is paired over the rounds both ran.
    return spread_of([t / o for t, o in zip(theirs, ours_ms, strict=False) if o > 0])


def reproduces(claim: Claim, again: Spread | None) -> bool:
    """The rule: the rerun's interval overlaps the claimed one (a claim not measured again does not)."""
    return again is not None and again.low <= claim.high and claim.low <= again.high


class LoadWatch:
    """The lowest and highest 1-minute load average seen while the block runs."""

    def __init__(self) -> None:
        self.seen: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _look(self) -> None:
        with contextlib.suppress(OSError):  # not every platform has a load average
            self.seen.append(os.getloadavg()[0])

    def _watch(self) -> None:
        while not self._stop.wait(LOAD_EVERY):
            self._look()

    def __enter__(self) -> LoadWatch:
        self._look()
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._look()

    @property
    def range(self) -> list[float]:
        return [round(min(self.seen), 2), round(max(self.seen), 2)] if self.seen else []


def _machine(record: dict[str, Any], load: LoadWatch) -> dict[str, Any]:
    env = record.get("environment", {})
    return {
        "cores": env.get("cpus", os.cpu_count()),
        "machine": env.get("machine", platform.machine()),
        "load": load.range,
        **{key: env.get(key) for key in VERSIONS},
        "date": datetime.date.today().isoformat(),
    }


def _run_bench(bench: BenchRunner, argv: Sequence[str]) -> tuple[int, dict[str, Any], LoadWatch]:
    """Run the bench with ``argv`` and a JSON record: (exit status, the record or {}, the load seen)."""
    with tempfile.TemporaryDirectory(prefix="communicator-verify-") as scratch:
        out = Path(scratch) / "bench.json"
        with LoadWatch() as load:
            code = bench([*argv, "--json", str(out)])
        record = json.loads(out.read_text()) if out.exists() else {}
    return code, record, load


def _argv(command: str) -> list[str]:
    """The bench arguments of a claim's command, without its ``--json`` (the rerun writes its own)."""
    words = shlex.split(command)
    if tuple(words[: len(PREFIX)]) != PREFIX:
        raise ValueError(f"a claim's command must start with {' '.join(PREFIX)}: {command}")
    argv = words[len(PREFIX) :]
    if "--json" in argv:
        at = argv.index("--json")
        del argv[at : at + 2]
    return argv


def _load_text(machine: dict[str, Any]) -> str:
    load = machine.get("load") or []
    shown = "unknown" if not load else f"{load[0]:.1f}" if load[0] == load[-1] else f"{load[0]:.1f}-{load[-1]:.1f}"
    return f"{machine.get('cores')} cores, load average {shown}"


def _name(claim: Claim) -> str:
    return f"{claim.case} {claim.op} {claim.peer}/ours, world {claim.world_size}"


def verify_docs(path: Path | str, bench: BenchRunner, timeout: float | None = None) -> int:
    """Rerun every command of the claims in ``path`` and print, per claim, whether it reproduces:
    0 when every claim does, else 1. ``timeout``: the reruns' ``--timeout`` (a timeout changes no
    figure, and a loaded machine may need more than the command's)."""
    claims = load_claims(path)
    failed = 0
    for command in dict.fromkeys(claim.command for claim in claims):
        print(f"rerunning: {command}", file=sys.stderr, flush=True)
        more = [] if timeout is None else ["--timeout", f"{timeout:g}"]
        code, record, load = _run_bench(bench, _argv(command) + more)
        now = {"cores": record.get("environment", {}).get("cpus", os.cpu_count()), "load": load.range}
        ours = [claim for claim in claims if claim.command == command]
        print(f"\n{command}\n  claimed on {_load_text(ours[0].machine)}; rerun on {_load_text(now)}")
        if code != 0:
            print(f"  the bench exited {code}: every claim of this command counts as not reproduced")
        for claim in ours:
            again = measured(record, claim.pick, claim.world_size)
            ok = code == 0 and reproduces(claim, again)
            failed += not ok
            rerun = "not measured" if again is None else again.text()
            word = "reproduces" if ok else "DOES NOT REPRODUCE"
            print(f"  {word:<18}  {_name(claim)}: claimed {claim.spread.text()}, rerun {rerun}")
    print(
        f"\n{len(claims) - failed} of {len(claims)} claims reproduce (rule: the rerun's {CONFIDENCE * 100:.0f} %"
        " interval of the median per-round ratio overlaps the claimed one)"
    )
    return 1 if failed else 0


def claims_from(record: dict[str, Any], command: str, load: LoadWatch) -> list[Claim]:
    """The headline picks at every world size of a bench record (those that ran)."""
    machine = _machine(record, load)
    claims = []
    for pick in HEADLINE:
        for world_size in record["world_sizes"]:
            spread = measured(record, pick, world_size)
            if spread is not None:
                claims.append(
                    Claim(
                        **dataclasses.asdict(pick),
                        world_size=world_size,
                        median=round(spread.median, 3),
                        low=round(spread.low, 3),
                        high=round(spread.high, 3),
                        rounds=spread.rounds,
                        confidence=round(spread.confidence, 4),
                        command=command,
                        machine=machine,
                    )
                )
    return claims


def _cell(claim: Claim | None) -> str:
    if claim is None:
        return "-"
    return f"**{claim.median:.2f}** [{claim.low:.2f}-{claim.high:.2f}]"


def render(claims: Sequence[Claim]) -> str:
    """The page's "At a glance" table and its notes, in Markdown."""
    sizes = sorted({claim.world_size for claim in claims})
    by_key = {(c.what, c.peer, c.world_size): c for c in claims}
    rows = list(dict.fromkeys((c.what, c.peer, c.op) for c in claims))
    lines = [
        f"| operation | against | {' | '.join(f'world {size}' for size in sizes)} |",
        f"| --- | --- |{' --- |' * len(sizes)}",
        *(
            f"| {what} | {against(op, peer)} | "
            + " | ".join(_cell(by_key.get((what, peer, size))) for size in sizes)
            + " |"
            for what, peer, op in rows
        ),
    ]
    notes = []
    for command in dict.fromkeys(claim.command for claim in claims):
        ran = [claim for claim in claims if claim.command == command]
        machine, rounds = ran[0].machine, sorted({claim.rounds for claim in ran})
        versions = ", ".join(f"{key} {machine[key]}" for key in VERSIONS if machine.get(key))
        crowded = [size for size in sizes if size > machine["cores"]]
        notes.append(
            f"Measured on {machine['date']} with `{command}` on a {machine['cores']}-core {machine['machine']}"
            f" machine (load average {_load_text(machine).split('average ')[1]} during the run; {versions}),"
            f" {rounds[0]} to {rounds[-1]} rounds per ratio"
            + "".join(f"; world {size}: {size} ranks on {machine['cores']} cores, oversubscribed" for size in crowded)
            + "."
        )
    legend = (
        "Each cell: the peer's time over ours (above 1: this library is faster), the median of the"
        f" per-round ratios **in bold**, and its {CONFIDENCE * 100:.0f} % confidence interval [low-high]."
    )
    return "\n".join([*lines, "", legend, *("\n" + note for note in notes)])


def with_table(page: str, claims: Sequence[Claim]) -> str:
    """The page with the text between its claim markers rendered anew from ``claims``."""
    head, start, rest = page.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"the page needs the markers {START!r} and {END!r}")
    return f"{head}{START}\n{render(claims)}\n{END}{tail}"


def _write_claims(claims: Sequence[Claim], path: Path) -> None:
    about = (
        "The performance page's headline claims, made by python -m benchmarks.verify measure and checked by"
        " communicator bench --verify-docs. ratio: the peer's time over ours, median of per-round ratios, with"
        " its confidence interval [low, high]."
    )
    document = {"about": about, "claims": [dataclasses.asdict(claim) for claim in claims]}
    path.write_text(json.dumps(document, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.verify", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("measure", "render"), help="measure: run the headline and write it all")
    parser.add_argument("--claims", type=Path, default=CLAIMS, help=f"the claims file (default {CLAIMS})")
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page with the table (default {PAGE})")
    parser.add_argument("--plot", type=Path, default=PLOT, help=f"measure: the plot to draw (default {PLOT})")
    parser.add_argument("--record", type=Path, help="measure: also keep the bench's JSON record here")
    args = parser.parse_args(argv)
    if args.action == "measure":
        from benchmarks.cli import rerun  # the command line imports this module: imported here, after it

        command = shlex.join([*PREFIX, *HEADLINE_ARGS])
        code, record, load = _run_bench(rerun, list(HEADLINE_ARGS))
        if code != 0 or not record:
            print(f"the bench exited {code}: no claims written", file=sys.stderr)
            return 1
        if args.record:
            args.record.write_text(json.dumps(record, indent=1))
        _write_claims(claims_from(record, command, load), args.claims)
        from benchmarks.plot import plot  # matplotlib only where a plot is drawn

        plot(load_claims(args.claims), args.plot)
    args.page.write_text(with_table(args.page.read_text(), load_claims(args.claims)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
