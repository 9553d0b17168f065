"""Differential runs against ``torch.distributed``: every dtype the library moves, every reduce op and
every tensor form (inference tensors, parameters, views, 0-dim, empty and stride-0 tensors) on real
gloo ranks. Each case must give the same outcome on every rank, the reference's values (torch's own
collective where gloo takes the dtype and op, exact arithmetic otherwise), and leave the
communicator usable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as torch_dist

from communicator import Communicator
from communicator.reductions import REDUCE_OPS, WIRE_DTYPES
from communicator.transports.gloo_dtypes import UNSUPPORTED

pytestmark = pytest.mark.world_size(2, 3)

_TORCH_OPS = {
    "sum": "SUM",
    "product": "PRODUCT",
    "min": "MIN",
    "max": "MAX",
    "band": "BAND",
    "bor": "BOR",
    "bxor": "BXOR",
}
_BITWISE = ("band", "bor", "bxor")


def _values(rank: int, n: int, uneven: bool = False) -> list[int]:
    """1..3: every sum and product stays exact in float8; ``uneven``: an integer mean does not divide."""
    return [(rank + i) % 3 + 1 for i in range(n - uneven)] + [1 + (rank == 0)] * uneven


def _make(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([v % 2 == 1 for v in values])
    if dtype.is_complex:
        return torch.tensor([complex(v, -v) for v in values], dtype=dtype)
    return torch.tensor(values, dtype=torch.float64).to(dtype)


#: Tensor forms: how the user's tensor is made from plain values, and whether it has data.
FORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "plain": lambda t: t,
    "inference": lambda t: _inference(t),
    "parameter": lambda t: torch.nn.Parameter(t, requires_grad=t.is_floating_point() or t.is_complex()),
    "view": lambda t: torch.stack([t, t]).t()[:, 0],  # non-contiguous: a column of a transpose
    "scalar": lambda t: t[0].clone(),
    "empty": lambda t: t[:0].clone(),
    "stride-0 empty": lambda t: torch.empty_strided((0,), (0,), dtype=t.dtype),
}


def _inference(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return t.clone()


def _reference(op: str, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor | str:
    """The reduction of ``parts``, computed exactly; a string names the error every rank must raise."""
    if (dtype.is_complex and op not in ("sum", "mean", "product")) or (
        op in _BITWISE and (dtype.is_floating_point or dtype.is_complex)
    ):
        return "TypeError"
    if dtype == torch.bool:
        flags = torch.stack(parts)
        if op == "mean":
            return "ValueError"
        if op in ("sum", "max", "bor"):
            return flags.any(0)
        if op == "bxor":
            return flags.sum(0) % 2 == 1
        return flags.all(0)
    wide = torch.stack([p.to(torch.complex128 if dtype.is_complex else torch.float64) for p in parts])
    if op in _BITWISE:
        ints = wide.to(torch.int64)
        result = ints[0]
        for more in ints[1:]:
            result = {"band": result & more, "bor": result | more, "bxor": result ^ more}[op]
        return result.to(dtype)
    if op == "mean":
        total = wide.sum(0)
        if not (dtype.is_floating_point or dtype.is_complex):
            return "ValueError" if bool((total.real % len(parts)).any()) else (total / len(parts)).to(dtype)
        if dtype.itemsize == 1:  # float8: the sum rounds once, then the mean
            return (total.to(dtype).double() / len(parts)).to(dtype)
        return (total / len(parts)).to(dtype)
    reduced = {"sum": wide.sum(0), "product": wide.prod(0)}.get(op)
    if reduced is None:
        reduced = wide.amin(0) if op == "min" else wide.amax(0)
    return reduced.to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits (NaN-safe, float8 included), shape and dtype."""

    def raw(t: torch.Tensor) -> list[int]:
        return t.detach().reshape(-1).clone().view(torch.uint8).tolist() if t.numel() else []

    return a.shape == b.shape and a.dtype == b.dtype and raw(a) == raw(b)


def _outcome(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """``call``'s outcome (``ok`` or the refusal's type) and its result."""
    try:
        return "ok", call(*args, **kwargs)
    except (TypeError, ValueError) as error:
        return type(error).__name__, None


def differential(comm: Communicator) -> tuple[list[str], dict[str, str]]:
    """Every case on this rank: the problems found and each case's outcome (compared across ranks)."""
    world, rank, last = comm.world_size, comm.rank, comm.world_size - 1
    problems: list[str] = []
    outcomes: dict[str, str] = {}
    for dtype in WIRE_DTYPES:
        native = dtype not in UNSUPPORTED and not dtype.is_complex
        for form, make in FORMS.items():
            uneven = form == "view"
            parts = [make(_make(_values(r, 3, uneven), dtype)).detach() for r in range(world)]
            for op in REDUCE_OPS:
                case = f"all_reduce {dtype} {form} {op}"
                mine = make(_make(_values(rank, 3, uneven), dtype))
                want = _reference(op, [p.reshape(-1) for p in parts], dtype)
                got = outcomes[case] = _outcome(comm.all_reduce, mine, op=op)[0]
                if isinstance(want, str):
                    if got != want or not _same(mine, parts[rank]):  # a refused tensor keeps its values
                        problems.append(f"{case}: {got} {mine}, expected {want}")
                else:
                    problems += _compare(case, got, mine, want, native and op in _TORCH_OPS and form == "plain")
                case = f"reduce {dtype} {form} {op}"
                mine = make(_make(_values(rank, 3, uneven), dtype))
                got = outcomes[case] = _outcome(comm.reduce, mine, dst=last, op=op)[0]
                expected = want if rank == last or isinstance(want, str) else parts[rank]
                if got != (want if isinstance(want, str) else "ok"):
                    problems.append(f"{case}: {got}, expected {expected}")
                elif isinstance(expected, torch.Tensor) and not _same(mine.reshape(-1), expected.reshape(-1)):
                    problems.append(f"{case}: {mine}, expected {expected}")
            case = f"broadcast {dtype} {form}"
            mine = make(_make(_values(rank, 3, uneven), dtype))
            got = outcomes[case] = _outcome(comm.broadcast, mine, src=last)[0]
            if got != "ok" or not _same(mine.detach().reshape(-1), parts[last].reshape(-1)):
                problems.append(f"{case}: {got} {mine}, expected {parts[last]}")
            if form in ("plain", "inference", "empty"):
                problems += _scatters(comm, dtype, form, make, outcomes)
    with torch.inference_mode():  # inside inference mode too
        t = torch.ones(2, dtype=torch.uint16)
        comm.all_reduce(t)
    if t.tolist() != [world] * 2:
        problems.append(f"all_reduce in inference mode: {t}")
    after = torch.ones(1)
    comm.all_reduce(after)  # no case made the communicator unusable
    if after.item() != world:
        problems.append(f"after every case: {after}")
    return problems, outcomes


def _compare(case: str, got: str, mine: torch.Tensor, want: torch.Tensor, against_torch: bool) -> list[str]:
    """What is wrong with an all_reduce's result (``against_torch``: also run torch's own)."""
    problems = []
    if got != "ok" or not _same(mine.reshape(-1), want):
        problems.append(f"{case}: {got} {mine}, expected {want}")
    if isinstance(mine, torch.nn.Parameter) and mine.requires_grad != (mine.is_floating_point() or mine.is_complex()):
        problems.append(f"{case}: the parameter lost requires_grad")
    if against_torch and mine.numel():
        theirs = _make(_values(torch_dist.get_rank(), 3), mine.dtype)  # the plain form's input
        torch_dist.all_reduce(theirs, op=getattr(torch_dist.ReduceOp, _TORCH_OPS[case.rsplit(" ", 1)[1]]))
        if not _same(mine, theirs):
            problems.append(f"{case}: {mine}, torch.distributed gives {theirs}")
    return problems


def _scatters(
    comm: Communicator,
    dtype: torch.dtype,
    form: str,
    make: Callable[[torch.Tensor], torch.Tensor],
    outcomes: dict[str, str],
) -> list[str]:
    world, rank = comm.world_size, comm.rank
    problems = []
    for op in REDUCE_OPS:
        case = f"reduce_scatter {dtype} {form} {op}"
        inputs = [make(_make(_values(rank + k, 2), dtype)) for k in range(world)]
        got, result = _outcome(comm.reduce_scatter, inputs, op=op)
        outcomes[case] = got
        parts = [make(_make(_values(r + k, 2), dtype)).reshape(-1) for r in range(world) for k in range(world)]
        whole = [_reference(op, [parts[r * world + k] for r in range(world)], dtype) for k in range(world)]
        want = next((w for w in whole if isinstance(w, str)), whole[rank])  # an error anywhere is an error everywhere
        if isinstance(want, str):
            if got != want:
                problems.append(f"{case}: {got}, expected {want}")
        elif got != "ok" or not _same(result.reshape(-1), want):
            problems.append(f"{case}: {got} {result}, expected {want}")
    case = f"all_gather same_shape {dtype} {form}"
    got, gathered = _outcome(comm.all_gather, make(_make(_values(rank, 2), dtype)), same_shape=True)
    outcomes[case] = got
    expected = [make(_make(_values(r, 2), dtype)) for r in range(world)]
    if got != "ok" or not all(_same(g, e) for g, e in zip(gathered, expected, strict=True)):
        problems.append(f"{case}: {got} {gathered}, expected {expected}")
    return problems


def test_every_dtype_op_and_form_matches_torch_on_every_rank(run, world_size: int) -> None:
    results = run(differential, timeout=240)
    for problems, _ in results:
        assert not problems, "\n".join(problems[:40])
    outcomes = [outcome for _, outcome in results]
    assert all(o == outcomes[0] for o in outcomes), "ranks disagree on an outcome"
