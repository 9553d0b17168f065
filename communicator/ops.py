"""Reduction operations: names, torch equivalents and the checks that keep them exact."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["REDUCE_OPS", "WIRE_DTYPES", "ReduceOpLike", "check_op_dtype", "parse_op"]

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
    if isinstance(op, str):
        name = _ALIASES.get(op.lower(), op.lower())
        if name in REDUCE_OPS:
            return name
    elif isinstance(op, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        name = _ALIASES.get(str(op).rsplit(".", 1)[-1].lower(), str(op).rsplit(".", 1)[-1].lower())
        if name in REDUCE_OPS:
            return name
    raise ValueError(f"unknown reduce op {op!r}: expected one of {', '.join(REDUCE_OPS)} or a ReduceOp")


def torch_op(name: str) -> dist.ReduceOp.RedOpType:
    """The torch op that implements ``name`` (``mean`` is a sum followed by a division)."""
    return {
        "sum": dist.ReduceOp.SUM,
        "mean": dist.ReduceOp.SUM,
        "product": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
        "band": dist.ReduceOp.BAND,
        "bor": dist.ReduceOp.BOR,
        "bxor": dist.ReduceOp.BXOR,
    }[name]


def check_op_dtype(name: str, dtype: torch.dtype, in_place: bool = True) -> None:
    """Refuse combinations that would be silently wrong: bitwise ops on floats, an integer mean in place."""
    floating = dtype.is_floating_point or dtype.is_complex
    if name in _BITWISE and floating:
        raise TypeError(f"op {name!r} needs an integer or bool tensor, got {dtype}")
    if name == "mean" and in_place and not floating:
        raise TypeError(
            f"op 'mean' on a {dtype} tensor would truncate the average; reduce a floating tensor "
            "(e.g. t.double()) or use op='sum' and divide"
        )
