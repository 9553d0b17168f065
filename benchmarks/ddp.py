"""The ``ddp``, ``fsdp`` and ``pg-overhead`` cases: torch's own parallel training through
``comm.as_process_group()`` against the same through a native gloo group, on the same ranks.

- ``ddp``: a training step (forward, backward, optimizer step) of an MLP under
  ``DistributedDataParallel``, its bucket all-reduces through either group.
- ``fsdp``: the same step with every linear layer and the model ``fully_shard``-ed (FSDP2) over
  ``DeviceMesh.from_group`` of either group: its all-gathers and reduce-scatters through it.
- ``pg-overhead``: a blocking one-element ``dist.all_reduce`` with ``group=`` either group.

As in the ``overhead`` case, blocks alternate between the two sides (which one goes first
alternates with the round), after a warm-up; a block's time per step (or call) is the slowest
rank's; a row gives each side's median over the rounds and the median of the rounds' ratios, ours
over native, with its confidence interval (:mod:`.spread`), judged against the target; while the
interval straddles the target more rounds run, up to a cap (every rank holds the same reduced
times, so every rank decides alike). Both sides of a model case start from the same weights and
see the same batches, so after the same number of steps their parameters must agree: the row's
check says whether they do.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from benchmarks.aligned import aligned
from benchmarks.scaling import oversubscribed
from benchmarks.spread import CONFIDENCE, MIN_ROUNDS, NOT_JUDGED, WITHIN_NOISE, Progress, Spread, judge, spread_of
from communicator.base import Communicator
from communicator.testing.spawn import launch

__all__ = ["CASES", "DDP", "FSDP", "PG_OVERHEAD", "Row", "Settings", "format_rows", "run"]

DDP, FSDP, PG_OVERHEAD = "ddp", "fsdp", "pg-overhead"
CASES = (DDP, FSDP, PG_OVERHEAD)
TARGETS = {DDP: 1.03, FSDP: 1.03, PG_OVERHEAD: 1.05}
NAMES = {DDP: "DDP step", FSDP: "FSDP2 step", PG_OVERHEAD: "all_reduce(1)"}
#: The MLP: FEATURES -> HIDDEN -> HIDDEN -> FEATURES, 15.7 M parameters (63 MB of float32 gradients).
FEATURES, HIDDEN, BATCH = 1024, 3072, 32
QUICK_FEATURES, QUICK_HIDDEN, QUICK_BATCH = 16, 32, 4


@dataclasses.dataclass(frozen=True)
class Settings:
    """How long each case runs: rounds of blocks (at most ``cap`` where a ratio straddles its
    target), ``steps`` training steps a block (model cases), ``calls`` calls a block (pg-overhead)."""

    model_rounds: int = 9
    model_cap: int = 15
    steps: int = 2
    warmup_steps: int = 2
    rounds: int = 15
    cap: int = 45
    calls: int = 1000
    warmup_calls: int = 50
    quick: bool = False

    @classmethod
    def quick_run(cls) -> Settings:
        """A smoke test: a tiny model, the fewest rounds with an interval, single steps, short blocks."""
        return cls(MIN_ROUNDS, MIN_ROUNDS, 1, 1, MIN_ROUNDS, MIN_ROUNDS, 20, 5, True)


@dataclasses.dataclass(frozen=True)
class Row:
    """One comparison at one world size: medians per step in ms (per call in µs for pg-overhead),
    the rounds' ratios ours/native, the target; ``check``: whether both sides ended equal."""

    case: str
    world_size: int
    model: str
    native: float
    ours: float
    spread: Spread
    target: float
    check: str
    judged: bool = True  # False in a --quick run

    @property
    def verdict(self) -> str:
        return judge(self.spread, at_most=self.target) if self.judged else NOT_JUDGED


def _mlp(quick: bool) -> nn.Module:
    torch.manual_seed(0)
    features, hidden = (QUICK_FEATURES, QUICK_HIDDEN) if quick else (FEATURES, HIDDEN)
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, features)
    )


def _describe(model: nn.Module) -> str:
    count = sum(p.numel() for p in model.parameters())
    return f"MLP {count / 1e6:.1f}M" if count >= 100_000 else f"MLP {count / 1e3:.1f}k"


def _block(fn: Callable[[], Any], repeats: int) -> float:
    """Seconds per call of ``fn`` over ``repeats`` calls, the slowest rank's (reduced after the clock stopped)."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    mine = torch.tensor([(time.perf_counter() - start) / repeats])
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine.item())


def _compare(
    native: Callable[[], Any],
    ours: Callable[[], Any],
    repeats: int,
    warmup: int,
    rounds: int,
    cap: int,
    target: float,
    progress: Progress,
) -> tuple[float, float, Spread]:
    """(native median, our median, the rounds' ratios), in seconds per call."""
    for fn in (native, ours):
        for _ in range(warmup):
            fn()
    times: tuple[list[float], list[float]] = ([], [])
    planned = rounds
    while True:
        for round_ in range(len(times[0]), planned):
            order = ((0, native), (1, ours)) if round_ % 2 == 0 else ((1, ours), (0, native))
            for index, fn in order:
                times[index].append(_block(fn, repeats))
            progress.say(f"round {round_ + 1} of {planned}", force=round_ + 1 == planned)
        spread = spread_of([mine / base for base, mine in zip(*times, strict=True)])
        if planned >= cap or judge(spread, at_most=target) != WITHIN_NOISE:
            return statistics.median(times[0]), statistics.median(times[1]), spread
        planned = min(cap, planned + max(rounds // 2, MIN_ROUNDS))
        progress.say(f"{spread.text()} straddles {target:.2f}: up to {planned} rounds", force=True)


def _ddp_step(group: Any, quick: bool, rank: int) -> tuple[Callable[[], None], Callable[[], list[torch.Tensor]]]:
    """One training step of DDP over ``group``, and the parameters it trained."""
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_mlp(quick), process_group=group)
    return _trainer(model, quick, rank), lambda: [p.detach().clone() for p in model.parameters()]


def _fsdp_step(group: Any, quick: bool, rank: int) -> tuple[Callable[[], None], Callable[[], list[torch.Tensor]]]:
    """One training step of FSDP2 over ``group``, and the parameters it trained (gathered)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model = _mlp(quick)
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in [m for m in model.modules() if isinstance(m, nn.Linear)]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return _trainer(model, quick, rank), lambda: [p.full_tensor().detach().clone() for p in model.parameters()]  # type: ignore[attr-defined]


def _trainer(model: nn.Module, quick: bool, rank: int) -> Callable[[], None]:
    generator = torch.Generator().manual_seed(rank)
    features, batch = (QUICK_FEATURES, QUICK_BATCH) if quick else (FEATURES, BATCH)
    x = torch.randn(batch, features, generator=generator)
    y = torch.randn(batch, features, generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad()
        torch.autograd.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()

    return step


def _agree(native: list[torch.Tensor], ours: list[torch.Tensor]) -> str:
    """Whether both sides' parameters agree on every rank."""
    same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(native, ours, strict=True))
    everywhere = torch.tensor([1.0 if same else 0.0])
    dist.all_reduce(everywhere, op=dist.ReduceOp.MIN)
    return "same" if everywhere.item() else "DIFFER"


def _rank(comm: Communicator, cases: Sequence[str], settings: Settings) -> list[Row]:
    world, pg = comm.world_size, comm.as_process_group()
    native_group = dist.group.WORLD

    def progress(case: str) -> Progress:
        return Progress(f"{case}, world size {world}: ", enabled=comm.rank == 0)

    rows = []
    for case in cases:
        if case == PG_OVERHEAD:
            rows.append(_blocking_calls(pg, settings, progress(case)))
            continue
        make = _ddp_step if case == DDP else _fsdp_step
        native_step, native_params = make(native_group, settings.quick, comm.rank)
        our_step, our_params = make(pg, settings.quick, comm.rank)
        seconds = _compare(
            native_step,
            our_step,
            settings.steps,
            settings.warmup_steps,
            settings.model_rounds,
            settings.model_cap,
            TARGETS[case],
            progress(case),
        )
        check = _agree(native_params(), our_params())
        model = _describe(_mlp(settings.quick))
        rows.append(Row(case, world, model, seconds[0] * 1e3, seconds[1] * 1e3, seconds[2], TARGETS[case], check))
    return rows


def _blocking_calls(pg: Any, settings: Settings, progress: Progress) -> Row:
    """The pg-overhead row: a blocking one-element all-reduce through ``pg`` against torch's default (gloo) group."""
    one = torch.zeros(1)  # reduced in place again and again: zeros stay finite
    native, group = dist.group.WORLD, pg
    target = TARGETS[PG_OVERHEAD]
    seconds = _compare(
        lambda: dist.all_reduce(one, group=native),
        lambda: dist.all_reduce(one, group=group),
        settings.calls,
        settings.warmup_calls,
        settings.rounds,
        settings.cap,
        target,
        progress,
    )
    return Row(PG_OVERHEAD, pg.size(), "", seconds[0] * 1e6, seconds[1] * 1e6, seconds[2], target, "")


def run(world_size: int, cases: Sequence[str], settings: Settings, timeout: float) -> list[Row]:
    """The rows of ``cases`` (in :data:`CASES` order) at ``world_size``, from rank 0 (every rank holds the same)."""
    ordered = [case for case in CASES if case in cases]
    rows = launch(_rank, world_size, {"backend": "gloo"}, (ordered, settings), timeout=timeout)[0]
    return [dataclasses.replace(row, judged=not settings.quick) for row in rows]


def _load() -> str:
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:  # not every platform has one
        return f"{os.cpu_count()} cores"


def format_rows(rows: Sequence[Row], settings: Settings) -> str:
    """The table (at most 120 characters wide) and what its ratio is."""
    header: tuple[str, ...] = ("case", "ranks", "model", "native", "ours", "ours/native [interval]", "rounds")
    header += ("target", "verdict", "params")
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        unit = "us" if row.case == PG_OVERHEAD else "ms"
        crowded = "*" if oversubscribed(row.world_size) else ""
        lines.append(
            (
                NAMES[row.case],
                f"{row.world_size}{crowded}",
                row.model,
                f"{row.native:.1f} {unit}",
                f"{row.ours:.1f} {unit}",
                row.spread.text(digits=3),
                str(row.spread.rounds),
                f"{row.target:.2f}",
                row.verdict,
                row.check,
            )
        )
    table = aligned(lines, left=(0, 2, 8, 9))
    blocks = (
        f"{settings.steps} step{'s' if settings.steps > 1 else ''}" if any(r.case != PG_OVERHEAD for r in rows) else ""
    )
    calls = f"{settings.calls} calls" if any(r.case == PG_OVERHEAD for r in rows) else ""
    per = " / ".join(part for part in (blocks, calls) if part)
    crowded = "; *: ranks > cores" if any(oversubscribed(r.world_size) for r in rows) else ""
    return (
        f"DDP and FSDP2 through comm.as_process_group() against gloo's group ({_load()}{crowded})\n"
        f"{table}\n"
        "ratio: ours/native, per round: the time per step (forward, backward, optimizer step; all_reduce(1): per\n"
        "blocking one-element call) through comm.as_process_group() over the same through gloo's group, the slowest\n"
        f"rank's, in alternating blocks of {per}; shown: the median of the rounds' ratios [{CONFIDENCE * 100:.0f} %"
        " confidence\ninterval]; "
        + (
            "a verdict only where the interval lies on one side of the target (at most)"
            if not settings.quick
            else f"verdicts: {NOT_JUDGED} (a --quick run is a smoke test)"
        )
        + "; params: whether\nboth sides ended with equal weights"
    )
