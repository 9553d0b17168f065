"""Whether two implementations returned the same thing (checked once per case, outside the timings)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["same_objects", "same_reductions"]


def same_objects(expected: Any, actual: Any) -> bool:
    """Exact structural equality; arrays and tensors compare by type, dtype, shape and values."""
    if isinstance(expected, torch.Tensor):
        return isinstance(actual, torch.Tensor) and expected.dtype == actual.dtype and torch.equal(expected, actual)
    if isinstance(expected, np.ndarray):
        return isinstance(actual, np.ndarray) and expected.dtype == actual.dtype and np.array_equal(expected, actual)
    if isinstance(expected, Mapping):
        return (
            isinstance(actual, Mapping)
            and expected.keys() == actual.keys()
            and all(same_objects(expected[key], actual[key]) for key in expected)
        )
    if isinstance(expected, (list, tuple)):
        return (
            type(expected) is type(actual)
            and len(expected) == len(actual)
            and all(same_objects(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return bool(expected == actual)


def same_reductions(expected: Mapping[str, torch.Tensor], actual: Mapping[str, torch.Tensor]) -> bool:
    """Equal keys and values up to float rounding: ranks may add in a different order."""
    return expected.keys() == actual.keys() and all(
        expected[key].dtype == actual[key].dtype
        and expected[key].shape == actual[key].shape
        and torch.allclose(expected[key], actual[key], rtol=1e-5, atol=1e-6)
        for key in expected
    )
