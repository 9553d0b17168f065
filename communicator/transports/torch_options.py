"""The options objects of a torch process group's methods (``allreduce`` per op; ``broadcast``,
``gather``, ``scatter`` per root), made once, for the hot paths that call the group's own methods
(see :mod:`communicator.transports.torch_comm`)."""

from __future__ import annotations

import functools

import torch.distributed as dist

__all__ = ["all_reduce_options", "broadcast_options", "gather_options", "scatter_options"]


@functools.cache
def all_reduce_options(op: dist.ReduceOp.RedOpType) -> dist.AllreduceOptions:
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp(op)
    return options


@functools.cache
def broadcast_options(root: int) -> dist.BroadcastOptions:
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = root, 0
    return options


@functools.cache
def gather_options(root: int) -> dist.GatherOptions:
    options = dist.GatherOptions()
    options.rootRank = root
    return options


@functools.cache
def scatter_options(root: int) -> dist.ScatterOptions:
    options = dist.ScatterOptions()
    options.rootRank = root
    return options
