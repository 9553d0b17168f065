"""The device of nested data (tensors inside dicts and sequences), and moving it to another."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["Data", "cast_data_device", "get_data_device"]

#: A tensor, or a mapping or iterable whose leaves are tensors.
Data = torch.Tensor | Mapping[Any, Any] | Iterable[Any]


def _children(data: object) -> Iterable[Any] | None:
    """The items of a container, or ``None`` when ``data`` is not one (strings are not)."""
    if isinstance(data, Mapping):
        return data.values()
    if isinstance(data, Iterable) and not isinstance(data, str):
        return data
    return None


def get_data_device(data: Data) -> torch.device:
    """The one device every tensor in ``data`` is on.

    Raises:
        ValueError: the tensors are on different devices, or a container is empty.
        TypeError: a leaf is not a tensor.
    """
    if isinstance(data, torch.Tensor):
        return data.device
    children = _children(data)
    if children is None:
        raise TypeError(f"data should be a Tensor, sequence of tensor or dict, but got {data!r}")
    found: torch.device | None = None
    for child in children:
        device = get_data_device(child)
        if found is not None and device != found:
            raise ValueError(f"device type in data should be consistent, but got {device} and {found}")
        found = device
    if found is None:
        raise ValueError("data should not be empty.")
    return found


def cast_data_device(data: Data, device: torch.device, out: Data | None = None) -> Data:
    """``data`` with every tensor on ``device`` (tensors already there are not copied).

    Containers keep their type. With ``out`` (the same structure), every tensor is also copied
    into the matching tensor of ``out``.

    Raises:
        TypeError: ``out`` is of another type than ``data``, or a set; a leaf is not a tensor.
        ValueError: a container is empty, or a mapping and its ``out`` differ in length.
    """
    if out is not None:
        if type(data) is not type(out):
            raise TypeError(f"out should be the same type with data, but got {type(data)} and {type(out)}")
        if isinstance(out, set):
            raise TypeError("out should not be a set")
    if isinstance(data, torch.Tensor):
        moved = data if data.device == device else data.to(device)
        if isinstance(out, torch.Tensor):
            out.copy_(moved)
        return moved
    if isinstance(data, Mapping):
        targets: Mapping[Any, Any] = out if isinstance(out, Mapping) else dict.fromkeys(data)
        if len(targets) != len(data):
            raise ValueError(f"length of data and out should be same, but got {len(data)} and {len(targets)}")
        moved_items = {key: cast_data_device(value, device, targets[key]) for key, value in data.items()}
        if not moved_items:
            raise ValueError("data should not be empty")
        return type(data)(moved_items)  # type: ignore[call-arg]
    if isinstance(data, Iterable) and not isinstance(data, (str, np.ndarray)):
        pairs = zip(data, out, strict=False) if out is not None else ((item, None) for item in data)
        moved_list = [cast_data_device(item, device, target) for item, target in pairs]
        if not moved_list:
            raise ValueError("data should not be empty")
        return type(data)(moved_list)  # type: ignore[call-arg]
    raise TypeError(f"data should be a Tensor, list of tensor or dict, but got {data!r}")
