"""``communicator info``: what ``Communicator.create()`` would build here, and why. Never rendezvouses."""

from __future__ import annotations

import argparse
import os
import platform

import torch
import torch.distributed as dist

from communicator.config import CommConfig
from communicator.errors import ConfigError
from communicator.launchers import describe_environment, detect_launcher

__all__ = ["add_arguments", "explain", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--launcher", default=None, help="force a launcher (default: COMMUNICATOR_LAUNCHER or auto)")
    parser.add_argument("--backend", default=None, help="force a backend (default: COMMUNICATOR_BACKEND or auto)")


def explain(config: CommConfig) -> list[str]:
    """The lines ``info`` prints: the decision, then the evidence."""
    lines = []
    if config.type is not None:
        lines.append(f"decision: the registered communicator {config.type!r}")
    elif config.launcher == "none":
        lines.append("decision: NonDistComm (launcher='none')")
    elif dist.is_available() and dist.is_initialized():
        lines.append("decision: TorchComm adopting the initialised default group")
    else:
        try:
            env = detect_launcher(config.launcher, master_addr=config.master_addr, master_port=config.master_port)
        except ConfigError as error:
            lines.append(f"decision: none, create() would raise ConfigError: {error}")
        else:
            if env is None:
                lines.append("decision: NonDistComm (no launcher variables found)")
            else:
                lines.append(f"decision: TorchComm owning a new group; {env.explain()}")
                lines.append(
                    f"  rank {env.rank} of {env.world_size}, local rank {env.local_rank} of {env.local_size}, "
                    f"node {env.node_rank} of {env.num_nodes}, master {env.master_addr}:{env.master_port}"
                )
    cuda = torch.cuda.is_available()
    backend = config.backend if config.backend != "auto" else ("nccl" if cuda else "gloo")
    lines.append(f"backend: {backend} (configured {config.backend!r})")
    lines.append("launchers:")
    lines.extend(f"  {line}" for line in describe_environment())
    lines.append(
        "backends available: "
        + ", ".join(
            f"{name}={'yes' if ok else 'no'}"
            for name, ok in (
                ("gloo", dist.is_gloo_available()),
                ("nccl", dist.is_nccl_available()),
                ("mpi", dist.is_mpi_available()),
            )
        )
    )
    devices = torch.cuda.device_count() if cuda else 0
    lines.append(
        f"devices: cpu, {devices} CUDA device(s)"
        + (f" (visible: {os.environ.get('CUDA_VISIBLE_DEVICES')})" if devices else "")
    )
    lines.append(f"python {platform.python_version()}, torch {torch.__version__}, host {platform.node()}")
    return lines


def run(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in (("launcher", args.launcher), ("backend", args.backend)) if v is not None}
    try:
        config = CommConfig.from_env().replace(**overrides)
    except ConfigError as error:
        print(f"error: {error}")
        return 2
    print("\n".join(explain(config)))
    return 0
