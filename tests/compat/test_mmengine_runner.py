"""mmengine's own ``Runner``, ``SyncBuffersHook`` and an ``Evaluator`` metric, with ``mmengine.dist``
replaced by ``communicator.dist`` through ``use_for_mmengine()``: on ranks that ``launch`` starts,
and under ``torchrun --nproc-per-node=2`` (``tests/launcher_scripts/mmengine_job.py``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from communicator import Communicator
from communicator.launchers.local import free_port
from communicator.testing import run_ranks

pytest.importorskip("mmengine")

# The jobs are CPU-only (gloo). mmengine's logger picks a GPU per local rank when CUDA is usable and
# fails with an IndexError on a machine with fewer GPUs than ranks: the GPUs are hidden from them.
NO_GPUS = {"CUDA_VISIBLE_DEVICES": ""}


def train_with_synced_buffers(comm: Communicator, work_dir: str) -> dict[str, Any]:
    return train(work_dir, comm.rank)


def train(work_dir: str, rank: int) -> dict[str, Any]:
    """Train and validate with mmengine's Runner on this rank; what the checks below compare."""
    import communicator.dist

    communicator.dist.use_for_mmengine()  # every mmengine module of this rank calls communicator.dist
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

    from mmengine.evaluator import BaseMetric, Evaluator

    class Accuracy(BaseMetric):  # type: ignore[misc]
        """Its results are collected across ranks by mmengine's own ``collect_results``."""

        def process(self, data_batch: Any, data_samples: Any) -> None:
            labels = data_batch["labels"]
            self.results.extend(
                (outputs.argmax() == label).item() for outputs, label in zip(data_samples, labels, strict=True)
            )

        def compute_metrics(self, results: list[bool]) -> dict[str, float]:
            return {"accuracy": sum(results) / len(results), "count": float(len(results))}

    generator = torch.Generator().manual_seed(rank)  # each rank sees other data: other statistics
    data = TensorDataset(torch.randn(32, 4, generator=generator), torch.randint(0, 2, (32,), generator=generator))
    runner = Runner(
        model=Net(),
        work_dir=work_dir,
        train_dataloader=DataLoader(data, batch_size=8, collate_fn=collate),
        optim_wrapper={"optimizer": {"type": "SGD", "lr": 0.1}},
        train_cfg={"by_epoch": True, "max_epochs": 2},
        val_dataloader=DataLoader(data, batch_size=8, collate_fn=collate),
        val_cfg={},
        val_evaluator=Evaluator([Accuracy()]),
        custom_hooks=[{"type": "SyncBuffersHook"}],
        default_hooks={"checkpoint": None},
        launcher="pytorch",
        env_cfg={"dist_cfg": {"backend": "gloo"}},
        cfg={"model_wrapper_cfg": {"type": "MMDistributedDataParallel", "device_ids": None}},  # CPU DDP
    )
    runner.train()
    metrics = runner.val()
    import mmengine.evaluator.metric

    norm = runner.model.module.norm
    return {
        "metrics": metrics,
        "ours": mmengine.evaluator.metric.collect_results is communicator.dist.collect_results,
        "mean": norm.running_mean.tolist(),
        "var": norm.running_var.tolist(),
        "batches": (str(norm.num_batches_tracked.dtype), int(norm.num_batches_tracked)),
    }


def check_ranks(ranks: list[dict[str, Any]]) -> None:
    # After each epoch the hook averages every buffer, the int64 batch counter included.
    assert [tuple(rank["batches"]) for rank in ranks] == [("torch.int64", 8)] * 2
    # The evaluator's results went through communicator.dist.collect_results (each rank evaluated its 32
    # samples; mmengine keeps the dataset's length of the collected results) and reached every rank alike.
    assert all(rank["ours"] for rank in ranks)
    assert ranks[0]["metrics"]["count"] == 32.0 and ranks[0]["metrics"] == ranks[1]["metrics"]
    for key in ("mean", "var"):
        assert ranks[0][key] == pytest.approx(ranks[1][key], rel=1e-6, abs=1e-7)


@pytest.mark.timeout(300)
def test_runner_with_sync_buffers_hook_trains_through_communicator_dist(tmp_path: Path) -> None:
    ranks = run_ranks(train_with_synced_buffers, 2, str(tmp_path), cfg={"backend": "gloo"}, timeout=240, env=NO_GPUS)
    check_ranks(ranks)


@pytest.mark.timeout(300)
def test_runner_under_torchrun(tmp_path: Path) -> None:
    # torchrun starts the ranks; mmengine's Runner initialises the group (init_dist, ours).
    script = Path(__file__).parents[1] / "launcher_scripts" / "mmengine_job.py"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_"))}
    environ.update(NO_GPUS)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1"]
    command += [f"--master-port={free_port()}", str(script), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=environ, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    # Both ranks write to one pipe: a rank's log line may run into a result, before or after it.
    decode = json.JSONDecoder().raw_decode
    found = {int(m.group(1)): decode(done.stdout, m.end())[0] for m in re.finditer(r"RESULT (\d+) ", done.stdout)}
    ranks = [found[rank] for rank in sorted(found)]
    assert len(ranks) == 2, done.stdout
    check_ranks(ranks)


ALREADY_IMPORTED = """
import mmengine.dist, mmengine.evaluator.metric, mmengine.hooks.sync_buffer_hook as hook
import communicator.dist
communicator.dist.use_for_mmengine()
import mmengine.dist as again
assert again is communicator.dist
assert mmengine.evaluator.metric.collect_results is communicator.dist.collect_results
assert hook.all_reduce_params is communicator.dist.all_reduce_params
print("rebound")
"""


def test_the_switch_rebinds_mmengine_modules_imported_before_it() -> None:
    # In a child process: the switch changes sys.modules for the rest of the process.
    done = subprocess.run([sys.executable, "-c", ALREADY_IMPORTED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "rebound" in done.stdout, done.stderr
