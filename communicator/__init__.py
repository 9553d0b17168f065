"""communicator: one object for distributed PyTorch code.

``with Communicator.create(cfg) as comm:`` gives a :class:`NonDistComm` in one process and a
:class:`TorchComm` under torchrun, Slurm or MPI (and a :class:`SubgroupComm` for some of its ranks), so
code that receives ``comm`` has no branches.

``import communicator`` imports torch and registers torch's ``"communicator"`` backend at once. The
command line (``python -m communicator``, the ``communicator`` script) imports the package without
them, so that ``--help``, ``--version`` and usage errors answer at once: its public names then load
on first use, and the command line loads them before it runs a command.
"""

import os
import sys
from typing import TYPE_CHECKING

from communicator.version import __version__


def _run_as_command_line() -> bool:
    """Whether this import is the command line's: ``python -m communicator`` (the interpreter
    imports the package while ``sys.argv[0]`` is still ``"-m"``; ``sys.orig_argv`` names the
    module just before the arguments) or the ``communicator`` script that pip writes (its file,
    named ``communicator``, is ``__main__``)."""
    if sys.argv[:1] == ["-m"]:
        return sys.orig_argv[-len(sys.argv)] in ("communicator", "-mcommunicator")
    script = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    return os.path.basename(script) == "communicator"


_COMMAND_LINE = _run_as_command_line()
_BY_MODULE = _COMMAND_LINE and sys.argv[:1] == ["-m"]  # now: runpy replaces sys.argv[0] before main runs


def _require_torch() -> None:
    """Import torch, or say which python lacks it; ``python -m communicator`` in a clone, with a
    python without torch, runs the clone's ./run in its place (which makes and fills the clone's
    venv once), unless ./run's own python is this one."""
    try:
        import torch  # noqa: F401 - first: an environment without it is named, not only the module
    except ModuleNotFoundError as missing:
        if missing.name != "torch":
            raise
        run = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run")
        if _BY_MODULE and os.access(run, os.X_OK) and not os.environ.get("COMMUNICATOR_RUN"):
            print(f"communicator: {sys.executable} has no torch: running {run} in its place", file=sys.stderr)
            os.environ["COMMUNICATOR_RUN"] = "1"
            os.execv(run, [run, *sys.argv[1:]])
        raise ModuleNotFoundError(
            f"communicator needs torch, which {sys.executable} (environment {sys.prefix}) cannot import: "
            "install it there first, e.g. python -m pip install torch==2.13.0",
            name="torch",
        ) from missing


def _load() -> None:
    """Import the public names (torch with them) and register the backend, once."""
    _require_torch()
    from communicator import _public

    globals().update((name, getattr(_public, name)) for name in _public.__all__)


if TYPE_CHECKING or not _COMMAND_LINE:
    _require_torch()
    from communicator._public import (
        CollectiveMismatchError,
        CommConfig,
        CommError,
        CommTimeoutError,
        Communicator,
        ConfigError,
        ContextGroup,
        ExcludedError,
        Handle,
        NonDistComm,
        NonMemberComm,
        NotMemberError,
        PeerClosedError,
        PeerLostError,
        RemoteError,
        RevokedError,
        SubgroupComm,
        TorchComm,
        launch,
    )
else:

    def __getattr__(name: str) -> object:
        """Run as the command line: a public name loads them all on first use (PEP 562)."""
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        _load()
        return globals()[name]


__all__ = [
    "CollectiveMismatchError",
    "CommConfig",
    "CommError",
    "CommTimeoutError",
    "Communicator",
    "ConfigError",
    "ContextGroup",
    "ExcludedError",
    "Handle",
    "NonDistComm",
    "NonMemberComm",
    "NotMemberError",
    "PeerClosedError",
    "PeerLostError",
    "RemoteError",
    "RevokedError",
    "SubgroupComm",
    "TorchComm",
    "__version__",
    "launch",
]
