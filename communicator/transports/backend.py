"""torch's ``"communicator"`` backend: ``init_process_group(backend="communicator")`` builds a default
group whose operations run through a communicator.

:func:`register_backend` registers the name once. Under a launcher's variables (torchrun's
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) or with an explicit ``store``,
``torch.distributed.init_process_group(backend="communicator")`` then

1. initialises a default group of the configured backend from the same store, rank and size (keys
   under ``communicator/<backend>/``), within torch's own initialisation: ``auto`` (the default)
   is NCCL where every local rank has a GPU, as :meth:`~communicator.Communicator.create` decides,
   else gloo. Under NCCL the communicator stages CPU tensors through its GPU; a job whose tensors
   live on the CPU passes ``pg_options={"backend": "gloo"}``;
2. builds a :class:`~communicator.TorchComm` adopting it, with torch's timeout (or the
   :class:`~communicator.CommConfig` passed as ``pg_options``, a config or a mapping of its fields);
3. returns that communicator's :class:`~communicator.transports.process_group.CommProcessGroup`,
   which torch makes its default group: ``dist.get_backend()`` is ``"communicator"``.

``destroy_process_group()`` closes the communicator. ``communicator_of(None)`` (in
:mod:`communicator.transports.process_group`) gives it back.

A group torch creates later over such a world (``dist.new_group``) is a plain gloo group: its
members alone create it, and a communicator over some of a world's ranks is created by all of
them. For a guarded subgroup split the communicator and take its group:
``process_group_of(communicator_of(None).new_group(ranks))``.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore

from communicator.config import CommConfig
from communicator.errors import ConfigError
from communicator.startup import resolve_backend
from communicator.transports.process_group import BACKEND, CommProcessGroup, adopt_group
from communicator.transports.torch_comm import TorchComm

__all__ = ["BACKEND", "register_backend"]

#: Where the group under the communicator keeps its keys in the store torch hands the backend
#: (followed by that group's backend: ``communicator/gloo/``, ``communicator/nccl/``).
STORE_PREFIX = "communicator/"
_REASON = "built by torch.distributed.init_process_group(backend='communicator') over a {} group of its store"
#: The backends a default group under the communicator can have.
UNDER = ("auto", "gloo", "nccl")
_lock = threading.Lock()


def register_backend() -> None:
    """Make ``"communicator"`` a ``torch.distributed`` backend, for CPU and CUDA tensors (a gloo
    communicator stages CUDA tensors through the CPU, an NCCL one CPU tensors through its GPU).
    Calling it again, or in a torch build without ``torch.distributed``, does nothing."""
    with _lock:
        if not dist.is_available() or hasattr(dist.Backend, BACKEND.upper()):
            return
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


def _create(options: Any, settings: Any) -> Any:
    """torch's call for a new group of this backend: ``options`` holds its store, rank, size,
    timeout and (empty for the default group) world ranks; ``settings`` is ``pg_options``."""
    rank, size, timeout = options.group_rank, options.group_size, options.timeout
    if list(options.global_ranks_in_group):
        return dist.ProcessGroupGloo(options.store, rank, size, timeout)
    config = _config(settings, timeout)
    backend = resolve_backend(config.backend, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if backend == "nccl" and "LOCAL_RANK" in os.environ:  # else the device the caller set
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    store = PrefixStore(f"{STORE_PREFIX}{backend}/", options.store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=config.timeout)
    try:
        comm = TorchComm.adopt(config.replace(backend=backend), _REASON.format(backend))
    except BaseException:
        dist.destroy_process_group()
        raise
    group = CommProcessGroup(comm, owns=True)
    adopt_group(comm, group)
    return group


def _config(settings: Any, timeout: timedelta) -> CommConfig:
    """The communicator's configuration: ``pg_options`` when it is one (or a mapping of its
    fields), else the ``COMMUNICATOR_*`` variables with torch's timeout."""
    if settings is None:
        config = CommConfig.of(None).replace(timeout=timeout)
    elif isinstance(settings, CommConfig) or hasattr(settings, "keys"):
        config = CommConfig.of(settings)
    else:
        raise TypeError(
            f"pg_options for the {BACKEND!r} backend is a CommConfig or a mapping of its fields, "
            f"got {type(settings).__name__}"
        )
    if config.backend not in UNDER:
        raise ConfigError(f"the {BACKEND!r} backend runs over {' or '.join(UNDER[1:])}, not {config.backend!r}")
    return config
