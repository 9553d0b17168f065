"""A custom communicator by subclassing ``TorchComm``: override one method, register, build with ``create``.

``LoggingComm`` records every ``all_reduce`` it runs (shape, dtype, time) and otherwise is a
``TorchComm``. Registered under ``"logging"``, ``Communicator.create({"type": "logging"})``
builds it the way ``create`` builds a ``TorchComm``: it starts and owns the group under torchrun,
Slurm or MPI variables (or adopts an initialised one). Its ``all_reduce_dict`` calls for large
dicts go through the override too, since derived operations call ``self.all_reduce``.

``Evaluator`` is an ordinary module written against ``Communicator``: it runs unchanged on the
logging communicator of four ranks and on a ``NonDistComm`` (the single-process reference).

Run it with ``python docs/examples/custom_comm.py`` (4 local gloo ranks).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from communicator import CommConfig, Communicator, NonDistComm, TorchComm, launch


@Communicator.register("logging")
class LoggingComm(TorchComm):
    """A TorchComm that keeps a log of its all_reduce calls (``self.log``)."""

    def __init__(self, config: CommConfig | None = None) -> None:
        super().__init__(config)
        self.log: list[str] = []

    def all_reduce(self, tensor: torch.Tensor, op: Any = "sum", async_op: bool = False) -> Any:  # type: ignore[override]
        start = time.perf_counter()
        result = super().all_reduce(tensor, op, async_op)
        self.log.append(f"all_reduce {tensor.dtype} {list(tensor.shape)} {(time.perf_counter() - start) * 1e3:.2f} ms")
        return result


class Evaluator:
    """The mean squared error over a data set split across ranks, and every prediction in order."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm

    def __call__(self, predictions: torch.Tensor, targets: torch.Tensor, size: int) -> dict[str, Any]:
        squared = torch.nn.functional.mse_loss(predictions, targets, reduction="sum").double()
        totals = self.comm.all_reduce_dict({"squared": squared, "count": torch.tensor(targets.numel())})
        self.comm.all_reduce(squared)  # the sum of squared errors, once more through the logged method
        ordered = self.comm.collect_results(predictions.tolist(), size=size)
        return {"mse": (totals["squared"] / totals["count"]).item(), "sse": squared.item(), "predictions": ordered}


SAMPLES = 50


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, generator=generator)
    return inputs * 0.9, inputs  # predictions and targets


def evaluate(comm: Communicator) -> dict[str, Any]:
    predictions, targets = data()
    mine = slice(comm.rank, SAMPLES, comm.world_size)  # DistributedSampler's shard
    result = Evaluator(comm)(predictions[mine], targets[mine], SAMPLES)
    return {"class": type(comm).__name__, "log": getattr(comm, "log", []), **result}


def main() -> dict[str, Any]:
    reference = evaluate(NonDistComm())
    ranks = launch(evaluate, 4, {"type": "logging", "backend": "gloo"})
    assert all(r["class"] == "LoggingComm" and len(r["log"]) == 1 for r in ranks)
    # float32 losses summed per shard and in one batch differ in their last bits: compare within 1e-5
    assert abs(ranks[0]["mse"] - reference["mse"]) <= 1e-5 * max(1.0, reference["mse"])
    assert torch.allclose(torch.tensor(ranks[0]["predictions"]), torch.tensor(reference["predictions"]))
    for rank, outcome in enumerate(ranks):
        print(f"rank {rank} ({outcome['class']}): {'; '.join(outcome['log'])}")
    print(f"mse on 4 ranks {ranks[0]['mse']:.6f} == one process {reference['mse']:.6f}")
    return {"mse": ranks[0]["mse"], "expected": reference["mse"]}


if __name__ == "__main__":
    main()
