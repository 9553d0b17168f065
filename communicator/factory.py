"""The registry of communicator classes; `decide` what communicator this process needs, and why,
without communicating; `build` a registered class.

``Communicator.create`` builds what the decision names, and ``communicator info`` prints the same
decision, so the two can never disagree. The built-in classes are registered by name like any
user's: ``"nondist"`` (:class:`~communicator.transports.nondist.NonDistComm`) and ``"torch"``
(:class:`~communicator.transports.torch_comm.TorchComm`).

A registered transport of its own (a direct ``Communicator`` subclass) gets its endpoints from the
launcher by defining the class-level hook ``from_launcher`` (see :class:`FromLauncher`).

The base class also names two builders it cannot import, since they are its subclasses: the
default subgroups (:mod:`communicator.transports.context_group` registers them with
:func:`provide`) and the ``torch.distributed`` view of a communicator
(:mod:`communicator.transports.process_group`). Importing :mod:`communicator` registers both.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import torch.distributed as dist

from communicator.config import CommConfig
from communicator.errors import ConfigError
from communicator.launchers import LAUNCHERS, LauncherEnv, detect_launcher
from communicator.startup import resolve_backend, world_of_one

T = TypeVar("T")

__all__ = [
    "REGISTRY",
    "SINGLE",
    "TORCH",
    "Decision",
    "FromLauncher",
    "build",
    "check_hook",
    "decide",
    "provide",
    "provided",
]

#: The registered names of the built-in classes.
SINGLE, TORCH = "nondist", "torch"
#: Every registered communicator class by name (``Communicator.register`` writes here).
REGISTRY: dict[str, type[Any]] = {}
#: The builders the base class uses but cannot import, by role ("context_groups", "process_group").
_PROVIDED: dict[str, Callable[..., Any]] = {}
#: The name of the class-level constructor hook of a registered transport.
_HOOK = "from_launcher"


class FromLauncher(Protocol):
    """A registered class that ``create`` builds from the launcher's view of this process.

    ``from_launcher(config, launcher)`` is a ``classmethod`` that returns this process's rank of the
    job: ``launcher.rank`` of ``launcher.world_size``, meeting the others at
    ``launcher.master_addr:launcher.master_port`` (a rendezvous store there, for example).
    ``launcher`` is what launch(), torchrun, srun or mpirun set, read as
    :func:`~communicator.launchers.detect_launcher` reads it with the configuration's ``launcher``,
    ``master_addr`` and ``master_port``; without a launcher, or with ``launcher="none"``, it is a
    world of one on a free local port.
    """

    @classmethod
    def from_launcher(cls, config: CommConfig, launcher: LauncherEnv) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Decision:
    """What ``create`` builds: the registered ``type``, on which backend, and why."""

    type: str
    backend: str
    reason: str
    launcher: LauncherEnv | None = None


def decide(config: CommConfig, registered: Mapping[str, type[Any]]) -> Decision:
    """The decision for ``config`` in this process (``registered``: the registered classes by name).

    Raises:
        ConfigError: an unknown type, a malformed ``from_launcher`` hook, or malformed or missing
            launcher variables.
    """
    if config.type is not None:
        if config.type not in registered:
            raise ConfigError(f"type={config.type!r} is not registered: expected one of {sorted(registered)}")
        built = registered[config.type]
        if not check_hook(built):
            return Decision(config.type, "-", f"the registered type {config.type!r}")
        env = _launcher(config)
        where = "no launcher variables (a world of one)" if env is None else env.explain()
        reason = f"the registered type {config.type!r}, built by {built.__qualname__}.{_HOOK} from {where}"
        return Decision(config.type, "-", reason, env)
    if config.launcher == "none":
        return Decision(SINGLE, "none", "launcher='none' asks for a single process")
    if dist.is_available() and dist.is_initialized():
        reason = "torch.distributed was already initialised: adopted its default group (not owned)"
        if str(dist.get_backend()) == "communicator":
            reason = "torch.distributed's default group is the 'communicator' backend: a view of its communicator"
        return Decision(TORCH, str(dist.get_backend()), reason)
    env = _launcher(config)
    if env is None:
        looked = ", ".join(launcher.name for launcher in LAUNCHERS)
        return Decision(SINGLE, "none", f"no launcher variables found (looked for {looked}): a single process")
    backend = resolve_backend(config.backend, env.local_size)
    return Decision(TORCH, backend, f"{env.explain()}: start and own a {backend} group", env)


def check_hook(cls: Callable[..., Any]) -> bool:
    """Whether ``cls`` has a ``from_launcher`` hook (raising ``ConfigError`` when it is not a classmethod)."""
    hook = inspect.getattr_static(cls, _HOOK, None)
    if hook is None:
        return False
    if not isinstance(hook, classmethod):
        raise ConfigError(
            f"{cls.__qualname__}.{_HOOK} is a {type(hook).__name__}: define it as "
            f"@classmethod {_HOOK}(cls, config: CommConfig, launcher: LauncherEnv)"
        )
    return True


def build(cls: Callable[[CommConfig], T], config: CommConfig) -> T:
    """What ``cls.from_config(config)`` does by default: ``cls.from_launcher(config, launcher)`` with
    the launcher this process was started by (a world of one without one) where the class has that
    hook, else ``cls(config)``. A launcher's missing or malformed variables raise ``ConfigError``
    before the hook runs."""
    if not check_hook(cls):
        return cls(config)
    made: T = getattr(cls, _HOOK)(config, _launcher(config) or world_of_one())
    return made


def provide(role: str, builder: Callable[..., Any]) -> None:
    """Register the ``builder`` the base class calls for ``role`` (its modules do, at import)."""
    _PROVIDED[role] = builder


def provided(role: str) -> Callable[..., Any]:
    """The builder registered for ``role``."""
    return _PROVIDED[role]


def _launcher(config: CommConfig) -> LauncherEnv | None:
    if config.launcher == "none":
        return None
    return detect_launcher(config.launcher, master_addr=config.master_addr, master_port=config.master_port)
