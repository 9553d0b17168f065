"""Elastic DistributedDataParallel without a restart: after a lost rank the survivors shrink the
communicator, rebuild DDP over the new communicator's process group, restore the model and the
optimizer from a surviving replica, and finish the training.

Four ranks train a small MLP with DDP over ``comm.as_process_group()``, so DDP's broadcasts and
all-reduces run through the communicator. At the 4th step of the second epoch rank 2 is killed
(SIGKILL, no goodbye). The others get ``PeerLostError`` or ``RemoteError`` from the step's DDP
collective instead of a hang, and then

- call ``shrink()``: ranks 0, 1, 3 become ranks 0, 1, 2 of a communicator of 3;
- rebuild the model and DDP over the new communicator's process group (the old DDP's hooks stay
  on the old model, which is dropped);
- restore the weights, the optimizer's momentum and the step from the new rank 0's replica
  (``broadcast_object``), not from a checkpoint on disk;
- run the interrupted step again, the data re-sharded three ways, and finish.

The result must equal a 3-rank run started from the restored state at that step. Run it with
``python docs/examples/elastic_ddp.py`` (``launch(..., on_failure="continue")`` lets the
survivors run on after a rank dies).
"""

from __future__ import annotations

import copy
import os
import signal
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from communicator import CommError, Communicator, launch
from communicator.errors import RemoteFailure

FEATURES, SAMPLES, GLOBAL_BATCH, EPOCHS = 6, 240, 24, 2
LOST_RANK, LOST_AT = 2, 13  # the global step at which rank 2 dies: the 4th step of the 2nd epoch
STEPS_PER_EPOCH = SAMPLES // GLOBAL_BATCH


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression problem, the same in every process."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, dtype=torch.float64, generator=generator)
    return x, torch.sin(x @ torch.linspace(-1.0, 1.0, FEATURES, dtype=torch.float64))[:, None]


def batch_of(step: int) -> torch.Tensor:
    """The sample indices of global step ``step``: a shuffle per epoch, one global batch a step."""
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(step // STEPS_PER_EPOCH))
    first = (step % STEPS_PER_EPOCH) * GLOBAL_BATCH
    return order[first : first + GLOBAL_BATCH]


def build(comm: Communicator, state: dict[str, Any]) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    """A model and its optimizer from ``state``, wrapped by DDP over the communicator's process group."""
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1)).double()
    model.load_state_dict(state["model"])
    ddp = DistributedDataParallel(model, process_group=comm.as_process_group())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    if state["optimizer"] is not None:
        optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # it would keep the given momentum tensors
    return ddp, optimizer


def ddp_step(comm: Communicator, ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, step: int) -> None:
    """One step on this rank's share of the global batch. DDP averages the gradients over the ranks,
    so each rank's loss is its share's sum scaled to the world: the step is the same on any world."""
    x, y = make_data()
    mine = batch_of(step)[comm.rank :: comm.world_size]  # re-sharded whenever the world changes
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(ddp(x[mine]), y[mine], reduction="sum") * comm.world_size / GLOBAL_BATCH
    loss.backward()
    optimizer.step()


def train(comm: Communicator, state: dict[str, Any], first_step: int) -> dict[str, Any]:
    """Train from ``first_step`` to the end; after a lost rank, go on with the survivors."""
    ddp, optimizer = build(comm, state)
    restored: dict[str, Any] | None = None
    step = first_step
    while step < EPOCHS * STEPS_PER_EPOCH:
        if step == LOST_AT and comm.rank == LOST_RANK and comm.world_size == 4:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash: no exception, no goodbye
        try:
            ddp_step(comm, ddp, optimizer, step)
        except CommError:  # PeerLostError on a rank that saw it, RemoteError on the others
            comm = comm.shrink()  # ranks 0, 1, 3 become 0, 1, 2 of 3
            mine = {"model": ddp.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            replica = comm.broadcast_object(mine if comm.rank == 0 else None, src=0)  # a surviving replica
            assert replica is not None
            restored, step = replica, replica["step"]
            ddp, optimizer = build(comm, restored)  # DDP over the new communicator's process group
            continue  # the interrupted step runs again, on the new shards
        step += 1
    return {
        "model": {name: t.clone() for name, t in ddp.module.state_dict().items()},
        "world_size": comm.world_size,
        "restored": restored,
        "finished": comm.agree(True),  # every survivor got here
    }


def elastic(comm: Communicator) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1)).double()
    return train(comm, {"model": model.state_dict(), "optimizer": None}, 0)


def from_step(comm: Communicator, state: dict[str, Any], step: int) -> dict[str, Any]:
    return train(comm, state, step)


def main() -> None:
    config = {"backend": "gloo", "timeout": 60}
    results = launch(elastic, 4, config, on_failure="continue")
    lost = results[LOST_RANK]
    assert isinstance(lost, RemoteFailure) and "SIGKILL" in lost.message, lost
    survivors = [r for r in results if not isinstance(r, RemoteFailure)]
    assert len(survivors) == 3 and all(r["world_size"] == 3 and r["finished"] for r in survivors)
    restored = survivors[0]["restored"]
    assert restored is not None and all(r["restored"]["step"] == LOST_AT for r in survivors)

    # The reference: three ranks started from the restored state at the step that was interrupted.
    reference = launch(from_step, 3, config, args=(restored, LOST_AT))
    for survivor, expected in zip(survivors, reference, strict=True):
        for name, weights in survivor["model"].items():
            assert weights.dtype == torch.float64
            assert torch.allclose(weights, expected["model"][name], rtol=1e-12, atol=1e-12), name
    final = survivors[0]["model"]["2.weight"]
    print(f"rank {LOST_RANK} was killed at step {LOST_AT}; 3 survivors shrank, rebuilt DDP over the new")
    print("communicator's process group, restored model and momentum from the new rank 0, and finished:")
    print(f"last layer {final.flatten()[:4].tolist()}..., as a 3-rank run from that step")


if __name__ == "__main__":
    main()
