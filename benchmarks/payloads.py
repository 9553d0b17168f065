"""What each rank sends in the benchmark: evaluation-like payloads, deterministic per rank."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

__all__ = ["FULL", "QUICK", "Sizes", "array_items", "eval_records", "small_metrics", "tensor_dict", "tensor_items"]

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big the payloads are: the full run, or a quick one for tests."""

    records: int  # per-image evaluation records per rank
    items: int  # dicts that carry the arrays of the arrays/tensors/unequal cases
    array_bytes: int  # bytes of arrays per rank (the large rank of the unequal case)
    unequal_small_bytes: int  # bytes per rank of the other ranks of the unequal case
    big_dict_elements: int  # float32 elements of each of the 10 tensors of dict10m


FULL = Sizes(records=1000, items=200, array_bytes=64 * MiB, unequal_small_bytes=4 * MiB, big_dict_elements=1_000_000)
QUICK = Sizes(records=100, items=20, array_bytes=2 * MiB, unequal_small_bytes=256 * 1024, big_dict_elements=10_000)


def small_metrics(rank: int) -> dict[str, float]:
    """A dict of 10 floats, like the scalars a training step logs."""
    return {f"metric_{i}": rank + i / 10 for i in range(10)}


def eval_records(rank: int, count: int) -> list[dict[str, Any]]:
    """Detection results, one small dict per image: id, box, score, label."""
    rng = np.random.default_rng(rank)
    boxes = rng.uniform(0, 640, size=(count, 4)).round(2).tolist()
    scores = rng.uniform(0, 1, size=count).round(4).tolist()
    labels = rng.integers(0, 80, size=count).tolist()
    return [
        {"image_id": rank * count + i, "bbox": boxes[i], "score": scores[i], "label": labels[i]} for i in range(count)
    ]


def array_items(rank: int, total_bytes: int, items: int) -> list[dict[str, Any]]:
    """``items`` dicts holding a float32 mask each, ``total_bytes`` in all: dense per-image predictions."""
    elements = max(1, total_bytes // (4 * items))
    rng = np.random.default_rng(rank)
    return [
        {"image_id": rank * items + i, "mask": rng.random(elements, dtype=np.float32), "label": i % 80}
        for i in range(items)
    ]


def tensor_items(rank: int, total_bytes: int, items: int) -> list[dict[str, Any]]:
    """The same payload as :func:`array_items`, with torch tensors instead of NumPy arrays."""
    return [{**item, "mask": torch.from_numpy(item["mask"])} for item in array_items(rank, total_bytes, items)]


def tensor_dict(rank: int, count: int, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """``count`` float32 tensors of ``shape``, keyed like a model's logged losses."""
    generator = torch.Generator().manual_seed(rank)
    return {f"loss_{i:03d}": torch.rand(shape, generator=generator) for i in range(count)}
