"""`collect_results`'s arguments and merge: every rank's part of an evaluation, back in dataset order."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TypeVar

__all__ = ["check_parts", "merge_parts"]

T = TypeVar("T")
ORDERS = ("interleave", "contiguous")
DEVICES = ("cpu", "gpu", "cuda")


def check_parts(results: object, size: object, order: object, device: object) -> None:
    """Refuse bad arguments before any communication."""
    if isinstance(results, (str, bytes)) or not isinstance(results, Sequence):
        raise TypeError(f"results must be a list or tuple of this rank's items, got {type(results).__name__}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int (the dataset length), got {size!r}")
    if order not in ORDERS:
        raise ValueError(f"order={order!r} is invalid: expected one of {', '.join(ORDERS)}")
    if device not in DEVICES:
        raise ValueError(f"device={device!r} is invalid: expected one of {', '.join(DEVICES)}")


def merge_parts(parts: Sequence[Sequence[T]], size: int, order: str) -> list[T]:
    """Put the parts back in dataset order and keep the first ``size`` items."""
    merged: list[T] = []
    if order == "contiguous":
        for part in parts:
            merged.extend(part)
    elif parts and all(len(part) == len(parts[0]) for part in parts):  # a sampler's even shares
        merged = [None] * (len(parts[0]) * len(parts))  # type: ignore[list-item]
        for rank, part in enumerate(parts):
            merged[rank :: len(parts)] = part
    else:
        longest = max((len(p) for p in parts), default=0)
        for index in range(longest):
            merged.extend(part[index] for part in parts if index < len(part))
    if size > len(merged):
        warnings.warn(
            f"collect_results: size={size} but the ranks hold {len(merged)} results in all; "
            "returning the real ones (nothing is padded)",
            stacklevel=3,
        )
    return merged[:size]
