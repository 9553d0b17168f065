"""``communicator info``: what ``Communicator.create()`` would build here, and why. Never rendezvouses."""

from __future__ import annotations

import argparse
import os
import platform
import sys

import torch
import torch.distributed as dist

from communicator.base import Communicator
from communicator.config import CommConfig
from communicator.errors import ConfigError
from communicator.factory import decide
from communicator.launchers import describe_environment
from communicator.launchers.network import describe_network

__all__ = ["add_arguments", "explain", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--launcher", default=None, help="force a launcher (default: COMMUNICATOR_LAUNCHER or auto)")
    parser.add_argument("--backend", default=None, help="force a backend (default: COMMUNICATOR_BACKEND or auto)")


def explain(config: CommConfig) -> list[str]:
    """The lines ``info`` prints: the decision ``create()`` would make here, then the evidence."""
    try:
        decision = decide(config, Communicator.registered())
    except ConfigError as error:
        lines = [f"decision: none, create() would raise ConfigError: {error}"]
    else:
        built = Communicator.registered()[decision.type]
        lines = [f"decision: {built.__name__}: {decision.reason}"]
        env = decision.launcher
        if env is not None:
            lines.append(
                f"  rank {env.rank} of {env.world_size}, local rank {env.local_rank} of {env.local_size}, "
                f"node {env.node_rank} of {env.num_nodes}, master {env.master_addr}:{env.master_port}"
            )
            lines.append(f"  network: {describe_network(env, config.init_method)}")
        lines.append(f"backend: {decision.backend} (configured {config.backend!r})")
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
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
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
        print(f"communicator info: error: {error}", file=sys.stderr)
        return 2
    print("\n".join(explain(config)))
    return 0
