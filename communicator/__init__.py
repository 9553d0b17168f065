"""communicator: one object for distributed PyTorch code.

``with Communicator.create(cfg) as comm:`` gives a :class:`NonDistComm` in one process and a
:class:`TorchComm` under torchrun, Slurm or MPI (and a :class:`SubgroupComm` for some of its ranks), so
code that receives ``comm`` has no branches.
"""

import os
import sys

try:
    import torch  # noqa: F401 - first: an environment without it is named, not only the module
except ModuleNotFoundError as missing:
    if missing.name != "torch":
        raise
    # ``python -m communicator COMMAND`` in a clone, with a python that has no torch: the clone's
    # ./run makes and fills the clone's venv once and runs the command there (unless ./run's own
    # python is this one, or this is an import, not a run, or an installed package)
    _run = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run")
    if sys.argv[:1] == ["-m"] and os.access(_run, os.X_OK) and not os.environ.get("COMMUNICATOR_RUN"):
        print(f"communicator: {sys.executable} has no torch: running {_run} in its place", file=sys.stderr)
        os.environ["COMMUNICATOR_RUN"] = "1"
        os.execv(_run, [_run, *sys.argv[1:]])
    raise ModuleNotFoundError(
        f"communicator needs torch, which {sys.executable} (environment {sys.prefix}) cannot import: "
        "install it there first, e.g. python -m pip install torch==2.13.0",
        name="torch",
    ) from missing

from communicator.base import Communicator
from communicator.config import CommConfig
from communicator.errors import (
    CollectiveMismatchError,
    CommError,
    CommTimeoutError,
    ConfigError,
    ExcludedError,
    NotMemberError,
    PeerClosedError,
    PeerLostError,
    RemoteError,
    RevokedError,
)
from communicator.handles import Handle
from communicator.testing.spawn import launch
from communicator.transports.backend import register_backend
from communicator.transports.context_group import ContextGroup
from communicator.transports.nondist import NonDistComm
from communicator.transports.nonmember import NonMemberComm
from communicator.transports.torch_comm import SubgroupComm, TorchComm
from communicator.version import __version__

register_backend()  # torch.distributed.init_process_group(backend="communicator"), see docs/ddp.md

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
