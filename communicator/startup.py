"""Starting a job's process group from what its launcher says.

``start`` initialises torch's default group for this process (a world of one on a free local
port when no launcher is there) and returns what the communicator that owns it must remember:
the layout, why, the environment it set, and whether this process serves the rendezvous store.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import socket

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

import communicator.control.keyspace as keyspace
from communicator.config import CommConfig, store_address
from communicator.control.log import StoreHandle
from communicator.control.records import MARK_KEY, TOKEN_VARIABLE, mark
from communicator.errors import CommError, ConfigError
from communicator.launchers import EnvironmentPatch, LauncherEnv, Topology, TorchrunEnv
from communicator.launchers.local import free_port
from communicator.launchers.network import network_env

__all__ = ["Started", "resolve_backend", "start", "world_of_one"]


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


def world_of_one() -> LauncherEnv:
    """The launcher environment of a single process on a free local port."""
    return TorchrunEnv({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})


@dataclasses.dataclass
class Started:
    """What an owning communicator remembers of the group it started."""

    topology: Topology
    reason: str
    environment: EnvironmentPatch
    hosts_store: bool  # this process serves the rendezvous store: it must leave last


_started = 0  # groups this process has started: every rank of a job counts the same way


def _outside_store(config: CommConfig, env: LauncherEnv) -> tuple[str, int, str] | None:
    """Where a store outside the ranks runs, and the prefix under which jobs with this job's
    ``MASTER_PORT`` take their key spaces there: the configured one, else torchrun's agent's;
    ``None``: world rank 0 serves one."""
    if config.store is not None:
        host, port = store_address(config.store)
        return host, port, f"communicator/job{env.master_port}/"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return env.master_addr, env.master_port, "communicator/"
    return None


def _own_space(client: TCPStore, prefix: str, config: CommConfig, env: LauncherEnv) -> PrefixStore:
    """This job's own keys in a store outside the ranks (see :mod:`communicator.control.keyspace`),
    once the store's secret is known to be this rank's too."""
    token = os.environ.get(TOKEN_VARIABLE, "")
    if client.check([MARK_KEY]):
        if not token:
            raise ConfigError(f"the store expects {TOKEN_VARIABLE}, the secret it was started with; it is not set here")
        if client.get(MARK_KEY).decode(errors="replace") != mark(token):
            raise ConfigError(f"{TOKEN_VARIABLE} here is not the secret the store was started with")
    place = f"served at {config.store}" if config.store is not None else "served by torchrun's agent"
    handle = StoreHandle(PrefixStore(prefix, client), place)
    space = keyspace.join(handle, env.rank, env.world_size, config.timeout.total_seconds())
    return PrefixStore(prefix + space, client)


def _rendezvous_port(port: int) -> int:
    """``port`` for the first group a process starts, ``port + k`` for the k-th after it.

    World rank 0 serves the store; when it closes a group, a peer that is quicker to start the next
    one could still reach the old store and read its stale keys. A new port per group rules that out.
    """
    return (port - 1 + _started - 1) % 65535 + 1  # stays within 1..65535


def start(config: CommConfig, env: LauncherEnv) -> Started:
    """Initialise torch's default group as ``env`` describes this process."""
    global _started
    _started += 1
    backend = resolve_backend(config.backend, env.local_size)
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    # Several nodes: the master host is checked, and gloo's interface chosen, before any rendezvous.
    environment = EnvironmentPatch({**env.env_updates(), **network_env(env, config.init_method)})
    host = f"[{env.master_addr}]" if ":" in env.master_addr else env.master_addr
    where = config.init_method or f"tcp://{host}:{env.master_port}"
    try:
        outside = _outside_store(config, env)
        if config.init_method is None and outside is not None:
            # A store outside the ranks (torchrun's agent's on MASTER_PORT, or config.store): every
            # group started gets a key space of its own there, or a second group would meet the
            # first one's stale keys (and, on a store of the user's, an earlier job's).
            address, port, prefix = outside
            if config.store is not None:
                where = f"the store at {config.store}"
            client = TCPStore(address, port, is_master=False, timeout=config.timeout)
            store = _own_space(client, prefix, config, env)
            dist.init_process_group(
                backend, store=store, rank=env.rank, world_size=env.world_size, timeout=config.timeout
            )
            hosts_store = False
        else:
            if config.init_method is None:
                where = f"tcp://{host}:{_rendezvous_port(env.master_port)}"
            dist.init_process_group(
                backend, init_method=where, rank=env.rank, world_size=env.world_size, timeout=config.timeout
            )
            hosts_store = env.rank == 0 and not where.startswith("file:")
        leave_together()
        topology, placement = env.topology(), ""
        if not env.places_nodes and env.world_size > 1:
            placed = _placed_by_host(env)
            if placed is not None:
                topology, placement = placed, "; nodes placed by host name"
                environment.update(topology.env_updates())
        reason = f"{env.explain(topology)}; initialised {backend} at {where}{placement}"
    except BaseException as error:
        if dist.is_initialized():
            dist.destroy_process_group()
        environment.restore()
        if isinstance(error, (CommError, KeyboardInterrupt)):
            raise
        raise CommError(
            f"could not start the {backend} group at {where} (rank {env.rank} of {env.world_size}): {error}"
        ) from error
    return Started(topology, reason, environment, hosts_store)


def leave_together(group: dist.ProcessGroup | None = None) -> None:
    """A gloo group's members return from its creation together (one barrier on it; the default
    group with ``None``): gloo's connecting ends at different times on a pair's two ends, and a
    member that went on and closed or exited at once would fail another still connecting to it
    with "Connection closed by peer"."""
    if dist.get_backend(group) == "gloo":
        dist.barrier(group=group)


def _placed_by_host(env: LauncherEnv) -> Topology | None:
    """The layout the ranks' host names give, when it agrees with every rank's local size as the
    launcher states it (else ``None``: the launcher's layout stands). Exchanged through the group's
    store, not a collective: under NCCL nothing touches a GPU."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"communicator/host/{env.rank}", f"{env.local_size} {socket.gethostname()}")
    entries = [
        entry.decode().split(" ", 1)
        for entry in store.multi_get([f"communicator/host/{r}" for r in range(env.world_size)])
    ]
    hosts = [host for _, host in entries]
    ranks_on = collections.Counter(hosts)
    if any(ranks_on[host] != int(size) for size, host in entries):  # nodes the variables describe on one host
        return None
    return Topology.from_hosts(env.rank, hosts)
