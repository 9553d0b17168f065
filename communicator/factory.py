"""`create`: choose and build the communicator this process needs, and say why."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from communicator.base import Communicator
from communicator.config import CommConfig, ConfigLike
from communicator.errors import CommError, ConfigError
from communicator.launchers import LAUNCHERS, detect_launcher
from communicator.launchers.base import LauncherEnv
from communicator.nondist import NonDistComm
from communicator.torch_comm import Topology, TorchComm, restore_environ

__all__ = ["create", "resolve_backend"]


def create(cfg: ConfigLike = None) -> Communicator:
    config = CommConfig.of(cfg)
    if config.type is not None:
        registry = Communicator.registered()
        if config.type not in registry:
            raise ConfigError(
                f"type={config.type!r} is not registered: expected one of {sorted(registry) or 'none registered'}"
            )
        return registry[config.type].from_config(config)
    if config.launcher == "none":
        return NonDistComm(config, reason="launcher='none' asks for a single process")
    if dist.is_available() and dist.is_initialized():
        return TorchComm.adopt(
            config, reason="torch.distributed was already initialised: adopted its default group (not owned)"
        )
    env = detect_launcher(config.launcher, master_addr=config.master_addr, master_port=config.master_port)
    if env is None:
        looked = ", ".join(cls.name for cls in LAUNCHERS)
        return NonDistComm(config, reason=f"no launcher variables found (looked for {looked}): a single process")
    return _initialize(config, env)


def resolve_backend(backend: str, local_size: int = 1) -> str:
    """``auto`` means nccl when CUDA is usable with a GPU for each local rank, else gloo; an
    unavailable backend, or nccl with fewer GPUs than local ranks, is a ConfigError."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if dist.is_nccl_available() and gpus >= local_size else "gloo"
    if backend == "nccl" and 0 < gpus < local_size:
        raise ConfigError(
            f"backend='nccl' needs one GPU per local rank: {local_size} ranks on this node but {gpus} GPU(s) "
            "visible; use backend='gloo' or fewer ranks per node"
        )
    available = {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available() and torch.cuda.is_available(),
        "mpi": dist.is_mpi_available(),
    }
    if not available[backend]:
        raise ConfigError(
            f"backend={backend!r} is not available in this torch build or machine: "
            f"available are {[name for name, ok in available.items() if ok]}"
        )
    return backend


_started = 0  # groups this process has started: every rank counts the same way


def _rendezvous_port(port: int) -> int:
    """``port`` for the first group a process starts, ``port + k`` for the k-th after it.

    World rank 0 serves the store; when it closes a group, a peer that is quicker to start the next
    one could still reach the old store and read its stale keys. A new port per group rules that out.
    Under torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE``) the agent serves ``port``.
    """
    global _started
    _started += 1
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return port
    return (port - 1 + _started - 1) % 65535 + 1  # stays within 1..65535


def _initialize(config: CommConfig, env: LauncherEnv) -> TorchComm:
    """Start and own a process group from the launcher's variables."""
    backend = resolve_backend(config.backend, env.local_size)
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    saved = {key: os.environ.get(key) for key in env.env_updates()}
    os.environ.update(env.env_updates())
    init_method = config.init_method or f"tcp://{env.master_addr}:{_rendezvous_port(env.master_port)}"
    try:
        dist.init_process_group(
            backend, init_method=init_method, rank=env.rank, world_size=env.world_size, timeout=config.timeout
        )
        comm = TorchComm(
            config,
            topology=Topology(env.local_rank, env.local_size, env.node_rank, env.num_nodes),
            owner=True,
            reason=f"{env.explain()}; initialised {backend} at {init_method}",
        )
    except BaseException as error:
        if dist.is_initialized():
            dist.destroy_process_group()
        restore_environ(saved)
        if isinstance(error, (CommError, KeyboardInterrupt)):
            raise
        raise CommError(
            f"could not start the {backend} group at {init_method} (rank {env.rank} of {env.world_size}): {error}"
        ) from error
    comm._env_restore = saved
    return comm
