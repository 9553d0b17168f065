"""Whether two implementations returned the same thing (checked once per case, outside the timings)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from communicator.check.equality import same_value

__all__ = ["same_objects", "same_reductions"]


def same_objects(expected: Any, actual: Any) -> bool:
    """Exact structural equality; arrays and tensors compare by type, dtype, shape and values."""
    return same_value(actual, expected)


def same_reductions(expected: Mapping[str, torch.Tensor], actual: Mapping[str, torch.Tensor]) -> bool:
    """Equal keys and values up to float rounding: ranks may add in a different order."""
    return expected.keys() == actual.keys() and all(
        expected[key].dtype == actual[key].dtype
        and expected[key].shape == actual[key].shape
        and torch.allclose(expected[key], actual[key], rtol=1e-5, atol=1e-6)
        for key in expected
    )
