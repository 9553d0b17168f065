"""``torchrun`` (torch.distributed.run) and anything else that sets ``RANK`` / ``WORLD_SIZE``."""

from __future__ import annotations

from collections.abc import Mapping

from typing_extensions import override

from communicator.launchers.base import LauncherEnv, check_port

__all__ = ["TorchrunEnv"]

_REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TorchrunEnv(LauncherEnv):
    """torchrun's variables; also a hand-made ``RANK``/``WORLD_SIZE``/``MASTER_*`` environment.

    When ``LOCAL_WORLD_SIZE`` is unset the job is taken to be one node (``LOCAL_RANK`` defaults to
    ``RANK``); ``GROUP_RANK`` (torchrun) or ``NODE_RANK`` give the node, else ``RANK // LOCAL_WORLD_SIZE``.
    """

    name = "pytorch"
    hint = "torchrun sets them all; by hand, set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
    variables = (
        "TORCHELASTIC_RUN_ID",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "GROUP_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    )
    # torch.distributed.elastic's agent also sets these for each worker (TORCHELASTIC_USE_AGENT_STORE,
    # TORCHELASTIC_ERROR_FILE, ...).
    extra_variables = ("ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE")
    prefixes = ("TORCHELASTIC_",)

    @classmethod
    @override
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """torchrun ran us (``TORCHELASTIC_RUN_ID``), or ``RANK`` and ``WORLD_SIZE`` are both set."""
        return "TORCHELASTIC_RUN_ID" in environ or ("RANK" in environ and "WORLD_SIZE" in environ)

    @classmethod
    @override
    def missing(cls, environ: Mapping[str, str]) -> list[str]:
        return [name for name in _REQUIRED if name not in environ]

    @property
    @override
    def rank(self) -> int:
        return self._below("RANK", self._int("RANK"), "WORLD_SIZE", self.world_size)

    @property
    @override
    def world_size(self) -> int:
        return self._int("WORLD_SIZE", minimum=1)

    @property
    @override
    def local_rank(self) -> int:
        return self._local_rank_or_derived("LOCAL_RANK")

    @property
    @override
    def local_size(self) -> int:
        return self._local_size_or_world("LOCAL_WORLD_SIZE")

    @property
    @override
    def node_rank(self) -> int:
        return self._node_rank_or_derived("GROUP_RANK", "NODE_RANK")

    @property
    @override
    def num_nodes(self) -> int:
        nodes = self._optional_int("GROUP_WORLD_SIZE", minimum=1)
        return self._nodes_from_world() if nodes is None else nodes

    @override
    def _master_addr_from_env(self) -> tuple[str, str]:
        return self._str("MASTER_ADDR"), "MASTER_ADDR"

    @override
    def _master_port_from_env(self) -> tuple[int, str]:
        return check_port(self._int("MASTER_PORT"), "MASTER_PORT"), "MASTER_PORT"
