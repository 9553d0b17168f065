"""mmengine's own ``Runner`` and ``SyncBuffersHook``, with ``mmengine.dist`` replaced by ``communicator.dist``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from communicator import Communicator
from communicator.testing import run_ranks

pytest.importorskip("mmengine")


def train_with_synced_buffers(comm: Communicator, work_dir: str) -> dict[str, Any]:
    import communicator.dist

    for name in ("mmengine.dist", "mmengine.dist.dist", "mmengine.dist.utils"):
        sys.modules[name] = communicator.dist  # every mmengine module of this rank calls communicator.dist
    import torch
    from mmengine.model import BaseModel
    from mmengine.runner import Runner
    from torch.utils.data import DataLoader, TensorDataset

    class Net(BaseModel):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)
            self.norm = torch.nn.BatchNorm1d(2)

        def forward(self, inputs: torch.Tensor, labels: torch.Tensor, mode: str = "tensor") -> Any:
            out = self.norm(self.linear(inputs))
            return {"loss": torch.nn.functional.cross_entropy(out, labels)} if mode == "loss" else out

    def collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {"inputs": torch.stack([b[0] for b in batch]), "labels": torch.stack([b[1] for b in batch])}

    generator = torch.Generator().manual_seed(comm.rank)  # each rank sees other data: other statistics
    data = TensorDataset(torch.randn(32, 4, generator=generator), torch.randint(0, 2, (32,), generator=generator))
    runner = Runner(
        model=Net(),
        work_dir=work_dir,
        train_dataloader=DataLoader(data, batch_size=8, collate_fn=collate),
        optim_wrapper={"optimizer": {"type": "SGD", "lr": 0.1}},
        train_cfg={"by_epoch": True, "max_epochs": 2},
        custom_hooks=[{"type": "SyncBuffersHook"}],
        default_hooks={"checkpoint": None},
        launcher="pytorch",
        env_cfg={"dist_cfg": {"backend": "gloo"}},
        cfg={"model_wrapper_cfg": {"type": "MMDistributedDataParallel", "device_ids": None}},  # CPU DDP
    )
    runner.train()
    norm = runner.model.module.norm
    return {
        "mean": norm.running_mean.tolist(),
        "var": norm.running_var.tolist(),
        "batches": (norm.num_batches_tracked.dtype, int(norm.num_batches_tracked)),
    }


@pytest.mark.timeout(300)
def test_runner_with_sync_buffers_hook_trains_through_communicator_dist(tmp_path: Path) -> None:
    ranks = run_ranks(train_with_synced_buffers, 2, str(tmp_path), cfg={"backend": "gloo"}, timeout=240)
    # After each epoch the hook averages every buffer, the int64 batch counter included.
    assert ranks[0]["batches"] == ranks[1]["batches"] == (ranks[0]["batches"][0], 8)
    assert str(ranks[0]["batches"][0]) == "torch.int64"
    for key in ("mean", "var"):
        assert ranks[0][key] == pytest.approx(ranks[1][key], rel=1e-6, abs=1e-7)
