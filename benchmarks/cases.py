"""The benchmark cases: a payload per rank and the operations timed on it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from benchmarks.payloads import (
    Sizes,
    array_items,
    eval_records,
    small_metrics,
    tensor_dict,
    tensor_items,
)

__all__ = ["CASES", "CASE_NAMES", "LIST_OPS", "OBJECT_OPS", "Case"]

OBJECT_OPS = ("all_gather_object", "gather_object", "broadcast_object")
LIST_OPS = (*OBJECT_OPS, "collect_results")  # for payloads that are lists of results
REFERENCE = ("raw_all_gather",)


@dataclasses.dataclass(frozen=True)
class Case:
    """A named payload, built on each rank from (rank, world size, sizes), and the ops timed on it;
    ``phases``: its object ops are also split into serialising, transfer and deserialising."""

    name: str
    describe: str
    build: Callable[[int, int, Sizes], Any]
    ops: tuple[str, ...]
    phases: bool = False


def _unequal(rank: int, world: int, sizes: Sizes) -> Any:
    # The last rank holds the large part, so a gather to rank 0 has to receive it.
    large = rank == world - 1
    return array_items(rank, sizes.array_bytes if large else sizes.unequal_small_bytes, sizes.items)


CASES = (
    Case("small", "a dict of 10 floats", lambda rank, world, sizes: small_metrics(rank), (*OBJECT_OPS, *REFERENCE)),
    Case(
        "records",
        "small per-image dicts (id, bbox, score, label)",
        lambda rank, world, sizes: eval_records(rank, sizes.records),
        (*LIST_OPS, *REFERENCE),
        phases=True,  # many small objects: where pickling weighs most
    ),
    Case(
        "arrays",
        "float32 NumPy arrays in dicts",
        lambda rank, world, sizes: array_items(rank, sizes.array_bytes, sizes.items),
        (*LIST_OPS, *REFERENCE),
    ),
    Case(
        "tensors",
        "the arrays payload as torch tensors",
        lambda rank, world, sizes: tensor_items(rank, sizes.array_bytes, sizes.items),
        (*LIST_OPS, *REFERENCE),
    ),
    Case("unequal", "arrays: the last rank large, the others small", _unequal, (*LIST_OPS, *REFERENCE)),
    Case(
        "dict100",
        "100 scalar float32 tensors",
        lambda rank, world, sizes: tensor_dict(rank, 100, ()),
        ("all_reduce_dict",),
    ),
    Case(
        "dict10m",
        "10 float32 tensors of many elements",
        lambda rank, world, sizes: tensor_dict(rank, 10, (sizes.big_dict_elements,)),
        ("all_reduce_dict",),
    ),
)

CASE_NAMES = tuple(case.name for case in CASES)
