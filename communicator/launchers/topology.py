"""Where a process sits in its job, and the environment a communicator sets while it is open."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

__all__ = ["EnvironmentPatch", "Topology"]


@dataclasses.dataclass(frozen=True)
class Topology:
    """This process's index on its node, the node's size, the node's index, the node count."""

    local_rank: int = 0
    local_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1

    @classmethod
    def from_environ(cls, rank: int, world_size: int, environ: Mapping[str, str] | None = None) -> Topology:
        """The layout torchrun's variables describe (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
        ``GROUP_WORLD_SIZE``; a started communicator sets them under every launcher); without them, one node."""
        env = os.environ if environ is None else environ
        local_size = max(int(env.get("LOCAL_WORLD_SIZE", world_size)), 1)
        local_rank = int(env.get("LOCAL_RANK", rank % local_size))
        node_rank = int(env.get("GROUP_RANK", env.get("NODE_RANK", rank // local_size)))
        nodes = int(env.get("GROUP_WORLD_SIZE", -(-world_size // local_size)))
        return cls(local_rank, local_size, node_rank, max(1, nodes))

    @classmethod
    def from_hosts(cls, rank: int, hosts: Sequence[str]) -> Topology:
        """The layout of ranks whose host names are ``hosts`` (in rank order): a node per name, in
        the order of its lowest rank; local ranks in rank order on each node."""
        nodes = list(dict.fromkeys(hosts))
        mine = [r for r, host in enumerate(hosts) if host == hosts[rank]]
        return cls(mine.index(rank), len(mine), nodes.index(hosts[rank]), len(nodes))

    def env_updates(self) -> dict[str, str]:
        """The layout in torchrun's variables, which :meth:`from_environ` reads."""
        return {
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_size),
            "GROUP_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.num_nodes),
        }


class EnvironmentPatch:
    """Variables set for as long as a communicator is open, then put back as they were."""

    def __init__(self, updates: Mapping[str, str]) -> None:
        self._saved = {key: os.environ.get(key) for key in updates}
        os.environ.update(updates)

    def update(self, updates: Mapping[str, str]) -> None:
        """Set more variables (or set some again); ``restore`` puts each back as it was before the first."""
        for key in updates:
            self._saved.setdefault(key, os.environ.get(key))
        os.environ.update(updates)

    def restore(self) -> None:
        """Put every variable back (unset the ones that were unset); safe to call twice."""
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = {}
