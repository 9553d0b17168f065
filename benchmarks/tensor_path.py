"""The ``tensor-path`` case: a tensor inside an object against the tensor ops, and gathers of
shapes the ranks do not know against gathers of equal shapes, in one interleaved run.

Each rank holds float32 tensors of its own values. Two kinds of op are timed:

- ``all_gather_object`` and ``broadcast_object`` of one tensor (64 MiB) against this library's
  tensor op with the shapes known (``all_gather(t, same_shape=True)``, ``broadcast(t, src)``) and
  the peers' tensor ops: ``torch.distributed``'s ``all_gather`` and ``broadcast``,
  ``ignite.distributed``'s (``broadcast`` with ``safe_mode=True``: a shape all_reduce, then the
  broadcast) and ``mmengine.dist``'s;
- the default ``all_gather(t)`` and ``gather(t)`` (shapes unknown: a record of every rank's shape
  first) at several sizes, against ``all_gather(t, same_shape=True)`` and, for ``gather``, which
  has no such mode, torch's ``gather`` of equal shapes.

The calls are checked once and timed round robin by :func:`.timing.time_case`, as the other cases
are; the targets are judged on the rounds' ratios (:mod:`.spread`). Gathers return new tensors on
every side (torch's into lists the call allocates, as its callers write it); the broadcasts of the
tensor ops write into a tensor the caller already holds, the object op into a new one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.aligned import aligned
from benchmarks.measured import CaseRun, all_correct
from benchmarks.ops import MMENGINE, OURS, TORCH, Context, Impl, Op, load_mmengine
from benchmarks.overhead import IGNITE, load_ignite
from benchmarks.record import call_record, targets_record
from benchmarks.spread import Progress
from benchmarks.table import format_errors, format_targets, format_unjudged
from benchmarks.targets import Outcome, Target, straddling, target_spread
from benchmarks.timing import time_case
from communicator.base import Communicator
from communicator.testing.spawn import launch

__all__ = [
    "FULL",
    "MiB",
    "OURS_TENSOR",
    "QUICK",
    "TENSOR_PATH",
    "Sizes",
    "TensorPath",
    "format_report",
    "outcomes",
    "report",
    "run",
    "size_text",
    "sweep_op",
    "targets",
    "tensor_op",
]

TENSOR_PATH = "tensor-path"
#: This library's tensor op with the shapes known: ``all_gather(t, same_shape=True)``, ``broadcast(t, src)``.
OURS_TENSOR = "ours_tensor"
IMPLS = (OURS, OURS_TENSOR, TORCH, IGNITE, MMENGINE)  # the table's columns, in order
OBJECT_OPS = ("all_gather_object", "broadcast_object")
SRC = DST = 0
KiB, MiB = 1024, 1024 * 1024
# The bounds: an object op within 1.1 times the tensor op; the default gathers within 1.25
# times the equal-shape ones; and the object ops ahead of (at least level with) every peer's tensor op.
OBJECT_BOUND, SHAPES_BOUND = 1.10, 1.25


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The object ops' tensor, and the sizes of the default gathers, in bytes a rank."""

    tensor_bytes: int
    sweep: tuple[int, ...]


FULL = Sizes(64 * MiB, (64 * KiB, MiB, 16 * MiB, 64 * MiB))
QUICK = Sizes(MiB, (KiB, 512 * KiB))  # a smoke test: one size inside the shape records, one past them


@dataclasses.dataclass(frozen=True)
class TensorPath:
    """Rank 0's report of the case at one world size."""

    world_size: int
    sizes: Sizes
    run: CaseRun


def size_text(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def sweep_op(kind: str, nbytes: int) -> str:
    """The name of a default gather's op at one size: ``all_gather, 1 MiB``."""
    return f"{kind}, {size_text(nbytes)}"


def tensor_op(op: str) -> str:
    """This library's tensor op that ``op`` is compared with (the ``ours_tensor`` column)."""
    return "broadcast(t, src)" if op.startswith("broadcast") else "all_gather(t, same_shape=True)"


def _flat(result: Any) -> Any:
    """A gather's result as one tensor (ignite's is concatenated already); others as they are."""
    return torch.cat(list(result)) if isinstance(result, list) and result else result


def _same(expected: Any, actual: Any) -> bool:
    if expected is None or actual is None:
        return expected is actual  # gathers give None off the destination
    first, second = _flat(expected), _flat(actual)
    return bool(first.dtype == second.dtype and torch.equal(first, second))


def _payload(rank: int, nbytes: int) -> torch.Tensor:
    return torch.full((nbytes // 4,), float(rank + 1))


def _receiver(tensor: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """An in-place broadcast's own tensor: the source's payload there, elsewhere a tensor to overwrite
    (each implementation its own, so that one's result does not stand in for another's)."""
    return tensor if dist.get_rank() == SRC else torch.zeros_like(tensor)


def _as_is(tensor: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    return tensor


def _torch_all_gather(context: Context, tensor: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return out


def _torch_gather(context: Context, tensor: torch.Tensor) -> list[torch.Tensor] | None:
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())] if dist.get_rank() == DST else None
    dist.gather(tensor, out, dst=DST)
    return out


def _torch_broadcast(context: Context, tensor: torch.Tensor) -> torch.Tensor:
    dist.broadcast(tensor, SRC)
    return tensor


def _object_ops(comm: Communicator, mm: ModuleType | None, idist: ModuleType | None) -> list[Op]:
    gathers: dict[str, Impl] = {
        OURS: lambda context, t: comm.all_gather_object(t),
        OURS_TENSOR: lambda context, t: comm.all_gather(t, same_shape=True),
        TORCH: _torch_all_gather,
    }
    broadcasts: dict[str, Impl] = {
        OURS: lambda context, t: comm.broadcast_object(t if comm.rank == SRC else None, src=SRC),
        OURS_TENSOR: lambda context, t: comm.broadcast(t, SRC),
        TORCH: _torch_broadcast,
    }
    if idist is not None:
        gathers[IGNITE] = lambda context, t: idist.all_gather(t)
        broadcasts[IGNITE] = lambda context, t: idist.broadcast(
            t if comm.rank == SRC else None, src=SRC, safe_mode=True
        )
    if mm is not None:
        gathers[MMENGINE] = lambda context, t: mm.all_gather(t)

        def mm_broadcast(context: Context, tensor: torch.Tensor) -> torch.Tensor:
            mm.broadcast(tensor, SRC)
            return tensor

        broadcasts[MMENGINE] = mm_broadcast
    in_place = dict.fromkeys((OURS_TENSOR, TORCH, MMENGINE), _receiver)
    return [
        Op("all_gather_object", gathers, _same, _as_is),
        Op("broadcast_object", broadcasts, _same, _as_is, in_place),
    ]


def _sweep_ops(comm: Communicator, sweep: Sequence[int]) -> list[Op]:
    all_gathers: dict[str, Impl] = {
        OURS: lambda context, t: comm.all_gather(t),
        OURS_TENSOR: lambda context, t: comm.all_gather(t, same_shape=True),
        TORCH: _torch_all_gather,
    }
    gathers: dict[str, Impl] = {OURS: lambda context, t: comm.gather(t, dst=DST), TORCH: _torch_gather}
    return [
        *(Op(sweep_op("all_gather", size), all_gathers, _same, _as_is) for size in sweep),
        *(Op(sweep_op("gather", size), gathers, _same, _as_is) for size in sweep),
    ]


def targets(sizes: Sizes) -> list[Target]:
    """The case's targets at these sizes: every ratio of a round's times, judged on its interval."""

    def ratio(op: str, top: str, bottom: str, at_most: float | None = None, at_least: float | None = None) -> Target:
        return Target(TENSOR_PATH, f"{op} {top}/{bottom}", ((op, top),), ((op, bottom),), at_least, at_most)

    return [
        *(
            target
            for op in OBJECT_OPS
            for target in (
                ratio(op, OURS, OURS_TENSOR, at_most=OBJECT_BOUND),
                *(ratio(op, peer, OURS, at_least=1.0) for peer in (TORCH, IGNITE, MMENGINE)),
            )
        ),
        *(ratio(sweep_op("all_gather", size), OURS, OURS_TENSOR, at_most=SHAPES_BOUND) for size in sizes.sweep),
        *(ratio(sweep_op("gather", size), OURS, TORCH, at_most=SHAPES_BOUND) for size in sizes.sweep),
    ]


def _rank(comm: Communicator, sizes: Sizes, repeat: int, max_repeat: int, sample: float) -> TensorPath | None:
    ops = [*_object_ops(comm, load_mmengine(), load_ignite()), *_sweep_ops(comm, sizes.sweep)]
    big = _payload(comm.rank, sizes.tensor_bytes)
    payloads = dict.fromkeys(OBJECT_OPS, big)
    payloads |= {
        sweep_op(kind, size): _payload(comm.rank, size) for kind in ("all_gather", "gather") for size in sizes.sweep
    }
    inputs = {(op.name, impl): op.input_for(impl, payloads[op.name], ()) for op in ops for impl in op.impls}
    say = Progress(f"{TENSOR_PATH}, world size {comm.world_size}: ", enabled=comm.rank == 0).say
    say(
        f"one float32 tensor a rank: {size_text(sizes.tensor_bytes)} in the object ops, "
        f"{', '.join(size_text(size) for size in sizes.sweep)} in the default gathers; {len(inputs)} calls, checked"
        f" once, then {repeat} timed rounds"
        + (f" (up to {max_repeat} where a target is within noise)" if max_repeat > repeat else ""),
        force=True,
    )
    # The calls close over this rank's communicator: the context only fills the timing's signature.
    timings = time_case(
        Context(comm, comm, ""),
        ops,
        inputs,
        repeat,
        sample,
        more=functools.partial(straddling, TENSOR_PATH, among=targets(sizes)) if max_repeat > repeat else None,
        max_repeat=max_repeat,
        progress=functools.partial(say, force=True),
    )
    describe = "one float32 tensor a rank, inside an object and as a tensor; default gathers by size"
    run_ = CaseRun(TENSOR_PATH, describe, [sizes.tensor_bytes] * comm.world_size, timings)
    return TensorPath(comm.world_size, sizes, run_) if comm.rank == 0 else None


def run(world_size: int, sizes: Sizes, repeat: int, max_repeat: int, sample: float, timeout: float) -> TensorPath:
    """The case on ``world_size`` fresh local gloo ranks: rank 0's report."""
    results = launch(_rank, world_size, {"backend": "gloo"}, (sizes, repeat, max_repeat, sample), timeout=timeout)
    report: TensorPath = results[0]
    return report


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _row(result: TensorPath, op: str) -> list[str]:
    run_ = result.run
    ours, tensor = run_.median_ms((op, OURS)), run_.median_ms((op, OURS_TENSOR))
    over = (
        "-" if OURS_TENSOR not in run_.impls(op) else "n/a" if ours is None or not tensor else f"{ours / tensor:.2f}x"
    )
    right = all(run_.timings.correct[op, impl] for impl in run_.impls(op))
    label = f"{op}, {size_text(result.sizes.tensor_bytes)}" if op in OBJECT_OPS else op
    cells = [_number(run_.median_ms((op, impl))) if impl in run_.impls(op) else "-" for impl in IMPLS]
    return [label, *cells, over, "yes" if right else "NO"]


LEGEND = (
    "ms: the median of the rounds, the slowest rank's; ours: the object op (object rows) or the default, shapes\n"
    "unknown (all_gather, gather rows); ours tensor: all_gather(t, same_shape=True), or broadcast(t, src) into the\n"
    "caller's tensor; ours/tensor: the ratio of the medians beside it (above 1: ours is slower); -: no such call"
)


def format_report(result: TensorPath, quick: bool, aims: Sequence[Outcome]) -> str:
    """The table of medians, the failures, and the targets with their intervals and verdicts."""
    header = ["op", "ours ms", "ours tensor ms", "torch ms", "ignite ms", "mmengine ms", "ours/tensor", "correct"]
    rows = [_row(result, op) for op in result.run.ops()]
    text = f"{aligned([header, *rows], left=(0,), rule=True)}\n{LEGEND}"
    errors = format_errors([result.run])
    if errors:
        text += f"\n{errors}"
    if quick:
        return f"{text}\n\n{format_unjudged()}"
    return (
        f"{text}\n\ntargets: the median of the rounds' ratios [90 % confidence interval]; met or missed only where"
        f" the\ninterval lies on one side of the target, else within noise\n{format_targets(aims)}"
    )


def outcomes(result: TensorPath) -> list[Outcome]:
    seconds = result.run.timings.seconds
    return [Outcome(target, target_spread(target, seconds, seconds)) for target in targets(result.sizes)]


def report(result: TensorPath, quick: bool) -> tuple[str, dict[str, Any], bool]:
    """(the printed report, the case's JSON record, whether this library's every call ran and was right)."""
    aims = outcomes(result)
    run_ = result.run
    record = {
        "describe": run_.describe,
        "tensor_bytes": result.sizes.tensor_bytes,
        "sweep_bytes": list(result.sizes.sweep),
        "ops": {
            op: {"impls": {impl: call_record(run_, op, impl) for impl in IMPLS if impl in run_.impls(op)}}
            for op in run_.ops()
        },
        "targets": [] if quick else targets_record(aims),
    }
    return format_report(result, quick, aims), record, all_correct([run_])
