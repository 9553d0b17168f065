"""Coalesced reduction: tensors grouped into buckets, one all-reduce per bucket."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from communicator.base import Communicator
from communicator.reductions import ReduceOpLike

__all__ = ["all_reduce_coalesced", "make_buckets"]

MEGABYTE = 1024 * 1024


def make_buckets(tensors: Sequence[torch.Tensor], bucket_size_mb: int) -> list[list[torch.Tensor]]:
    """Group ``tensors`` by device and dtype, in the order they come.

    With ``bucket_size_mb > 0`` a bucket is closed when the next tensor would take it past that
    many megabytes (a larger tensor gets a bucket of its own). Full buckets come first, then the
    open ones in the order they were started, so every rank builds the same buckets.
    """
    limit = bucket_size_mb * MEGABYTE if bucket_size_mb > 0 else None
    filling: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    filled_bytes: dict[tuple[torch.device, torch.dtype], int] = {}
    full: list[list[torch.Tensor]] = []
    for tensor in tensors:
        key = (tensor.device, tensor.dtype)
        size = tensor.numel() * tensor.element_size()
        if limit is not None and key in filling and filled_bytes[key] + size > limit:
            full.append(filling.pop(key))
        if key not in filling:
            filling[key], filled_bytes[key] = [], 0
        filling[key].append(tensor)
        filled_bytes[key] += size
    return full + list(filling.values())


def all_reduce_coalesced(comm: Communicator, bucket: Sequence[torch.Tensor], op: ReduceOpLike) -> None:
    """Reduce every tensor of ``bucket`` in place with one all-reduce of their concatenation."""
    flat = torch.cat([tensor.reshape(-1) for tensor in bucket])
    comm.all_reduce(flat, op=op)
    for tensor, piece in zip(bucket, torch.split(flat, [tensor.numel() for tensor in bucket]), strict=True):
        tensor.copy_(piece.view_as(tensor))
