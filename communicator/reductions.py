"""Reduction operations: names, the dtypes each one accepts, and the exact integer mean."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "REDUCE_OPS",
    "WIRE_DTYPES",
    "ReduceOpLike",
    "check_op_dtype",
    "divide_exactly",
    "is_floating",
    "parse_op",
]

ReduceOpLike = str | dist.ReduceOp | dist.ReduceOp.RedOpType

#: Dtypes the library moves as raw bytes (tensor metadata and tensors inside objects). The order is
#: part of the wire format: a dtype's index is its code.
WIRE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.uint16,
    torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
)  # fmt: skip

REDUCE_OPS = ("sum", "mean", "product", "min", "max", "band", "bor", "bxor")
_ALIASES = {"avg": "mean", "prod": "product"}
_BITWISE = ("band", "bor", "bxor")


def parse_op(op: object) -> str:
    """The canonical name of ``op`` (a case-insensitive string or a ``torch.distributed.ReduceOp``)."""
    if type(op) is str and op in REDUCE_OPS:  # the common spelling, at once
        return op
    if isinstance(op, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        op = str(op).rsplit(".", 1)[-1]
    if isinstance(op, str):
        name = _ALIASES.get(op.lower(), op.lower())
        if name in REDUCE_OPS:
            return name
    raise ValueError(f"unknown reduce op {op!r}: expected one of {', '.join(REDUCE_OPS)} or a ReduceOp")


def is_floating(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def check_op_dtype(name: str, dtype: torch.dtype) -> None:
    """Refuse what has no meaning: bitwise ops on non-integers, the order of complex numbers."""
    if name in _BITWISE and is_floating(dtype):
        raise TypeError(f"op {name!r} needs an integer or bool tensor, got {dtype}")
    if dtype.is_complex and name in ("min", "max"):
        raise TypeError(f"op {name!r} is not defined for complex tensors ({dtype}): they have no order")


def divide_exactly(total: torch.Tensor, world: int, keep: torch.Tensor) -> None:
    """Turn a sum into the mean in place; an integer sum must divide exactly.

    An integer tensor cannot hold a fractional mean, and truncating it silently is wrong. When every
    element divides (identical counters such as BatchNorm's ``num_batches_tracked`` always do) the
    exact mean is written; otherwise ``total`` gets ``keep``'s values back (what this rank passed)
    and ``ValueError`` is raised. Every rank holds the same sum, so every rank decides the same.
    """
    if is_floating(total.dtype):
        if total.dtype in _NO_DIVISION:  # float8: torch divides it in no kernel; round once from float32
            total.copy_(total.float().div_(world))
        else:
            total.div_(world)
        return
    if total.dtype == torch.bool:  # the mean of flags is a fraction: a bool cannot hold it
        total.copy_(keep)
        raise ValueError("op 'mean' of a bool tensor is a fraction; reduce a floating tensor instead")
    remainder, quotient = _divide(total, world)
    if bool(remainder.any()):
        total.copy_(keep)
        raise ValueError(
            f"op 'mean' of a {total.dtype} tensor: the sum does not divide by the world size ({world}), and an "
            "integer tensor cannot hold the fraction; reduce a floating tensor (e.g. t.double()) or use op='sum' "
            "(the tensor keeps this rank's values)"
        )
    if quotient is None:
        total.floor_divide_(world)
    elif total.dtype == torch.uint64:
        total.view(torch.int64).copy_(quotient)
    else:
        total.copy_(quotient)


_NO_DIVISION = frozenset({torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64})
_HALF = 2**32


def _divide(total: torch.Tensor, world: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The remainder of ``total / world``, and the quotient as int64 where torch cannot divide
    ``total``'s dtype (``None``: it can). uint64 is divided in 32-bit halves, so nothing overflows."""
    if total.dtype not in _NO_DIVISION:
        return torch.remainder(total, world), None
    if total.dtype != torch.uint64:
        wide = total.to(torch.int64)
        return wide % world, wide // world
    bits = total.view(torch.int64)  # the same 64 bits: split them into halves that int64 holds
    high, low = (bits >> 32) & (_HALF - 1), bits & (_HALF - 1)
    middle = (high % world) * _HALF + low  # < world * 2**32
    return middle % world, (high // world) * _HALF + middle // world  # wraps to the same bits
