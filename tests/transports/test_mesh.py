"""A 2 by 2 ``DeviceMesh`` whose dimensions are subgroup communicators' process groups: HSDP (FSDP2
sharding over one dimension, replicating over the other) trains as it does over gloo's groups."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from communicator import Communicator
from communicator.testing import run_ranks


def _hsdp(groups: tuple[dist.ProcessGroup, dist.ProcessGroup], rank: int) -> list[torch.Tensor]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(
        list(groups), "cpu", mesh=torch.arange(4).reshape(2, 2), mesh_dim_names=("replicate", "shard")
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).double()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        optimizer.zero_grad()
        x = torch.full((4, 8), float(rank + step), dtype=torch.float64)
        model(x).pow(2).mean().backward()
        optimizer.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]  # type: ignore[attr-defined]


def hsdp_over_subgroups(comm: Communicator) -> bool:
    replicas = comm.split(color=comm.rank % 2)  # ranks {0, 2} and {1, 3}: the same shard on each
    shards = comm.split(color=comm.rank // 2)  # ranks {0, 1} and {2, 3}: one model, sharded
    mine = _hsdp((replicas.as_process_group(), shards.as_process_group()), comm.rank)
    native_groups = [dist.new_group(r) for r in ([0, 2], [1, 3], [0, 1], [2, 3])]
    column, row = native_groups[comm.rank % 2], native_groups[2 + comm.rank // 2]
    native = _hsdp((column, row), comm.rank)
    return all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(mine, native, strict=True))


def test_hsdp_on_a_mesh_of_subgroup_communicators_trains_as_over_gloo() -> None:
    assert run_ranks(hsdp_over_subgroups, 4, timeout=120) == [True] * 4
