"""`decide` what communicator this process needs, and why, without communicating.

``Communicator.create`` builds what the decision names, and ``communicator info`` prints the same
decision, so the two can never disagree. The built-in classes are registered by name like any
user's: ``"nondist"`` (:class:`~communicator.nondist.NonDistComm`) and ``"torch"``
(:class:`~communicator.torch_comm.TorchComm`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import torch.distributed as dist

from communicator.config import CommConfig
from communicator.errors import ConfigError
from communicator.launchers import LAUNCHERS, LauncherEnv, detect_launcher
from communicator.startup import resolve_backend

__all__ = ["SINGLE", "TORCH", "Decision", "decide"]

#: The registered names of the built-in classes.
SINGLE, TORCH = "nondist", "torch"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What ``create`` builds: the registered ``type``, on which backend, and why."""

    type: str
    backend: str
    reason: str
    launcher: LauncherEnv | None = None


def decide(config: CommConfig, registered: Collection[str]) -> Decision:
    """The decision for ``config`` in this process (``registered``: the registered type names).

    Raises:
        ConfigError: an unknown type, or malformed or missing launcher variables.
    """
    if config.type is not None:
        if config.type not in registered:
            raise ConfigError(f"type={config.type!r} is not registered: expected one of {sorted(registered)}")
        return Decision(config.type, "-", f"the registered type {config.type!r}")
    if config.launcher == "none":
        return Decision(SINGLE, "none", "launcher='none' asks for a single process")
    if dist.is_available() and dist.is_initialized():
        reason = "torch.distributed was already initialised: adopted its default group (not owned)"
        return Decision(TORCH, str(dist.get_backend()), reason)
    env = detect_launcher(config.launcher, master_addr=config.master_addr, master_port=config.master_port)
    if env is None:
        looked = ", ".join(launcher.name for launcher in LAUNCHERS)
        return Decision(SINGLE, "none", f"no launcher variables found (looked for {looked}): a single process")
    backend = resolve_backend(config.backend, env.local_size)
    return Decision(TORCH, backend, f"{env.explain()}: start and own a {backend} group", env)
