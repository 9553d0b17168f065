"""What gloo cannot carry natively, and how every dtype travels anyway, exactly.

gloo (torch 2.x) refuses int16, uint16, uint32, uint64 and the float8 types in every collective
("Invalid scalar type"), and no backend takes complex tensors; point-to-point transfers carry any
dtype. A complex tensor is summed as its real view. Moving data needs no arithmetic, so
those tensors move as their bytes. A reduction is done in a wider type that gives the same
result: int16 and uint16 in int32, uint32 in int64, float8 in float32 (then rounded once), and
uint64 in int64, which adds and multiplies the same bits; for its min and max the top bit is
flipped first, which maps unsigned order onto signed order. The narrowing copy back wraps around
as the native type would.

torch's NCCL group refuses int16 too ("Input tensor data type is not supported for NCCL process
group: Short") and the other dtypes its type table lacks, so ``TorchComm`` converts under every
backend: the conversions are exact, and a dtype a backend carries passes through untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from communicator.ops.staging import editing

__all__ = ["Converted", "as_bytes", "for_reduction"]

#: Dtypes gloo's collectives refuse.
UNSUPPORTED: frozenset[torch.dtype] = frozenset(
    {torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2}
)
_WIDER = {
    torch.int16: torch.int32,
    torch.uint16: torch.int32,
    torch.uint32: torch.int64,
    torch.float8_e4m3fn: torch.float32,
    torch.float8_e5m2: torch.float32,
}
_SIGN = -(2**63)  # int64 with only the top bit set


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself, or a flat uint8 view of its memory when gloo refuses its dtype or it is
    complex (``tensor`` is contiguous: the view shares its storage, so writes land in it)."""
    if tensor.dtype in UNSUPPORTED or tensor.is_complex():
        return tensor.reshape(-1).view(torch.uint8)
    return tensor


class Converted:
    """A started reduction on a converted copy: waiting on it also writes the result back, once."""

    __slots__ = ("after", "work")

    def __init__(self, work: Any, after: Callable[[], None]) -> None:
        self.work, self.after = work, after

    def wait(self, timeout: Any = None) -> Any:
        result = self.work.wait() if timeout is None else self.work.wait(timeout)
        after, self.after = self.after, _nothing
        after()
        return result

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


def _nothing() -> None:
    return None


def for_reduction(tensor: torch.Tensor, op: str) -> tuple[torch.Tensor, Callable[[], None] | None]:
    """The tensor gloo reduces in place of ``tensor`` (``op`` applied to it gives ``tensor``'s
    result), and what turns that result into ``tensor``'s (``None``: it already is)."""
    if tensor.is_complex():  # a complex sum is the sum of the real and imaginary parts
        return torch.view_as_real(tensor), None
    if tensor.dtype not in UNSUPPORTED:
        return tensor, None
    if tensor.dtype == torch.uint64:
        same_bits = tensor.view(torch.int64)
        if op not in ("min", "max"):
            return same_bits, None
        ordered = same_bits ^ _SIGN
        return ordered, lambda: _copy(same_bits, ordered ^ _SIGN)
    wide = tensor.to(_WIDER[tensor.dtype])
    return wide, lambda: _copy(tensor, wide)


def _copy(into: torch.Tensor, values: torch.Tensor) -> None:
    # Runs when the work is waited on, outside the launch's no-grad or inference mode: an inference
    # tensor or a parameter needs it again, or the copy fails after the collective ran.
    with editing(into):
        into.copy_(values)
