"""The package's public names, and torch's ``"communicator"`` backend registered.

``import communicator`` imports this module at once; run as the command line, the package imports
it when a command runs (see :mod:`communicator`).
"""

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
    "launch",
]
