"""Structural equality for results that hold arrays and tensors (``==`` on them is elementwise)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["same_value"]


def same_value(got: Any, want: Any) -> bool:
    """Equal structure and values: tensors and arrays by type, dtype, shape and content, containers
    item by item, anything else by type and ``==``."""
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == want.dtype and np.array_equal(got, want)
    if isinstance(want, Mapping):
        return isinstance(got, Mapping) and got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in want)
    if isinstance(want, (list, tuple)):
        return (
            type(got) is type(want)
            and len(got) == len(want)
            and all(same_value(a, b) for a, b in zip(got, want, strict=True))
        )
    return type(got) is type(want) and bool(got == want)
