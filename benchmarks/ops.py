"""The timed operations, each written once per implementation: this library, torch.distributed,
mmengine.dist, and the two floors (:mod:`.floor`).

An implementation is ``fn(context, data) -> result``. Every rank calls the same implementations in
the same order, so the collectives inside them line up.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.compare import same_objects, same_reductions
from benchmarks.floor import FLOOR, FLOOR_FRESH, FLOOR_IMPLS, floor_valid
from communicator.base import Communicator

__all__ = [
    "FLOOR",
    "FLOOR_FRESH",
    "IMPLS",
    "MMENGINE",
    "MMENGINE_GPU",
    "OURS",
    "OURS_SAFE",
    "TORCH",
    "Context",
    "Op",
    "build_ops",
    "load_mmengine",
]

OURS = "ours"
OURS_SAFE = "ours_safe"
TORCH = "torch"
MMENGINE = "mmengine"
MMENGINE_GPU = "mmengine_gpu"
#: Every implementation name, in the order the report shows them.
IMPLS = (OURS, OURS_SAFE, TORCH, MMENGINE, MMENGINE_GPU, FLOOR, FLOOR_FRESH)
DST = SRC = 0


@dataclasses.dataclass
class Context:
    """What the implementations need on this rank."""

    comm: Communicator  # the default (pickle) serializer
    safe: Communicator  # serializer="safe" over the same processes
    scratch: str  # a local directory every rank sees, for mmengine's tmpdir mode
    tmpdirs: Iterator[int] = dataclasses.field(default_factory=itertools.count)

    def next_tmpdir(self) -> str:
        """A fresh directory name, the same on every rank (ranks call this in lockstep)."""
        return os.path.join(self.scratch, f"collect{next(self.tmpdirs)}")


Impl = Callable[[Context, Any], Any]


Prepare = Callable[[Any, Sequence[int]], Any]  # (payload, every rank's pickled length) -> the input


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation: its implementations, how to tell a result right, and how to turn a payload into its input."""

    name: str
    impls: Mapping[str, Impl]
    same: Callable[[Any, Any], bool]  # (ours, theirs) -> whether theirs is right
    prepare: Prepare
    # Implementations with an input of their own (the floors' blocks), checked on their own.
    own_inputs: Mapping[str, Prepare] = dataclasses.field(default_factory=dict)
    own_checks: Mapping[str, Callable[[Any], bool]] = dataclasses.field(default_factory=dict)

    def input_for(self, impl: str, payload: Any, lengths: Sequence[int]) -> Any:
        return self.own_inputs.get(impl, self.prepare)(payload, lengths)


def load_mmengine() -> ModuleType | None:
    """``mmengine.dist`` when it is installed."""
    try:
        return importlib.import_module("mmengine.dist")
    except ImportError:
        return None


def _world() -> int:
    return dist.get_world_size()


def _is_src() -> bool:
    return dist.get_rank() == SRC


def _torch_all_gather_object(context: Context, data: Any) -> list[Any]:
    out: list[Any] = [None] * _world()
    dist.all_gather_object(out, data)
    return out


def _torch_gather_object(context: Context, data: Any) -> list[Any] | None:
    out: list[Any] | None = [None] * _world() if dist.get_rank() == DST else None
    dist.gather_object(data, out, dst=DST)
    return out


def _torch_broadcast_object(context: Context, data: Any) -> Any:
    box = [data if _is_src() else None]
    dist.broadcast_object_list(box, src=SRC)
    return box[0]


def _torch_all_reduce_dict(context: Context, data: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What a torch user writes: concatenate, one all_reduce, split back."""
    keys = sorted(data)
    flat = torch.cat([data[key].reshape(-1) for key in keys])
    dist.all_reduce(flat)
    pieces = torch.split(flat, [data[key].numel() for key in keys])
    return {key: piece.reshape(data[key].shape) for key, piece in zip(keys, pieces, strict=True)}


# -- the reference row: gloo's all_gather of as many bytes as the pickled payload ---------------


def _padded_bytes(payload: Any, lengths: Sequence[int]) -> torch.Tensor:
    """As many bytes as the longest rank's pickled payload: gloo's all_gather needs one length everywhere."""
    return torch.full((max(lengths),), dist.get_rank() + 1, dtype=torch.uint8)


def _torch_raw_all_gather(context: Context, data: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(data) for _ in range(_world())]
    dist.all_gather(out, data)
    return out


# -- mmengine.dist ----------------------------------------------------------------------------


def _mmengine_impls(mm: ModuleType) -> dict[str, dict[str, Impl]]:
    def broadcast_object(context: Context, data: Any) -> Any:
        box = [data if _is_src() else None]
        mm.broadcast_object_list(box, src=SRC)
        return box[0]

    def all_reduce_dict(context: Context, data: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        reduced = dict(data)  # mmengine replaces the values of the dict it is given
        mm.all_reduce_dict(reduced)
        return reduced

    return {
        "all_gather_object": {MMENGINE: lambda context, data: mm.all_gather_object(data)},
        "gather_object": {MMENGINE: lambda context, data: mm.gather_object(data, dst=DST)},
        "broadcast_object": {MMENGINE: broadcast_object},
        "collect_results": {
            MMENGINE: lambda context, data: mm.collect_results(
                data, len(data) * _world(), device="cpu", tmpdir=context.next_tmpdir()
            ),
            MMENGINE_GPU: lambda context, data: mm.collect_results(data, len(data) * _world(), device="gpu"),
        },
        "all_reduce_dict": {MMENGINE: all_reduce_dict},
    }


# -- every op by name ---------------------------------------------------------------------------


def _as_is(payload: Any, lengths: Sequence[int]) -> Any:
    return payload


_SAME: dict[str, Callable[[Any, Any], bool]] = {"all_reduce_dict": same_reductions}
_PREPARE: dict[str, Callable[[Any, Sequence[int]], Any]] = {"raw_all_gather": _padded_bytes}


def _ours_and_safe(call: Callable[[Communicator, Any], Any]) -> dict[str, Impl]:
    return {
        OURS: lambda context, data: call(context.comm, data),
        OURS_SAFE: lambda context, data: call(context.safe, data),
    }


def build_ops(mm: ModuleType | None) -> dict[str, Op]:
    """Every operation by name, with mmengine's implementations when ``mm`` is given."""
    impls: dict[str, dict[str, Impl]] = {
        "all_gather_object": {
            **_ours_and_safe(lambda comm, data: comm.all_gather_object(data)),
            TORCH: _torch_all_gather_object,
        },
        "gather_object": {
            **_ours_and_safe(lambda comm, data: comm.gather_object(data, dst=DST)),
            TORCH: _torch_gather_object,
        },
        "broadcast_object": {
            **_ours_and_safe(lambda comm, data: comm.broadcast_object(data if _is_src() else None, src=SRC)),
            TORCH: _torch_broadcast_object,
        },
        "collect_results": _ours_and_safe(lambda comm, data: comm.collect_results(data, size=len(data) * _world())),
        "all_reduce_dict": {
            OURS: lambda context, data: context.comm.all_reduce_dict(data),
            TORCH: _torch_all_reduce_dict,
        },
        "raw_all_gather": {TORCH: _torch_raw_all_gather},
    }
    for name, extra in (_mmengine_impls(mm) if mm is not None else {}).items():
        impls[name].update(extra)
    for name, floors in FLOOR_IMPLS.items():
        impls[name].update({floor: impl for floor, (impl, _) in floors.items()})
    return {
        name: Op(
            name,
            table,
            _SAME.get(name, same_objects),
            _PREPARE.get(name, _as_is),
            {floor: prepare for floor, (_, prepare) in FLOOR_IMPLS.get(name, {}).items()},
            dict.fromkeys(FLOOR_IMPLS.get(name, {}), floor_valid),
        )
        for name, table in impls.items()
    }
