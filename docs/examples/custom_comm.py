"""Custom communicators: a registered subclass that logs, and a pipeline-stage layout built from options.

``LoggingComm`` is a ``TorchComm`` that records every collective it runs (name, sizes, time).
It is registered under ``"logging"``, so ``Communicator.create({"type": "logging", ...})``
builds it; ``from_config`` reads its settings from ``config.options``.

``PipelineComm`` adds a two-stage pipeline layout on top of it: ``stage`` (which half of the
model this rank runs), ``stage_comm`` (the ranks of the same stage: the data-parallel group of
that stage) and ``peer`` (the rank of the other stage that this rank exchanges activations with).

``Evaluator`` is an ordinary module written against ``Communicator``; it runs unchanged on the
world, on a ``NonDistComm`` and on one pipeline stage.

Run it with ``python docs/examples/custom_comm.py`` (4 local gloo ranks).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from communicator import CommConfig, Communicator, NonDistComm, TorchComm, launch
from communicator.torch_comm import Topology


@Communicator.register("logging")
class LoggingComm(TorchComm):
    """A TorchComm that keeps a log of the operations it runs (``self.log``)."""

    def __init__(self, config: CommConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.log: list[str] = []
        self.verbose = bool(config.options.get("verbose", False))

    @classmethod
    def from_config(cls, config: CommConfig) -> LoggingComm:
        """Start (and own) torch's default group from torchrun-style variables, unless it is running."""
        if dist.is_initialized():
            return cls.adopt(config, reason="LoggingComm adopting the initialised default group")
        backend = "gloo" if config.backend == "auto" else config.backend
        dist.init_process_group(backend, init_method=config.init_method or "env://", timeout=config.timeout)
        topology = Topology(
            local_rank=int(os.environ.get("LOCAL_RANK", dist.get_rank())),
            local_size=int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())),
        )
        return cls(config, owner=True, topology=topology, reason=f"LoggingComm started {backend} from env://")

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        entry = f"{what} {(time.perf_counter() - start) * 1e3:.1f} ms"
        self.log.append(entry)
        if self.verbose:
            print(f"[rank {self.rank}] {entry}")

    # Override what should be logged; call the parent for the work itself.

    def all_reduce(self, tensor: torch.Tensor, op: Any = "sum", async_op: bool = False) -> Any:
        with self.timed("all_reduce"):
            return super().all_reduce(tensor, op, async_op)

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        with self.timed(f"send to {dst}"):
            super().send(tensor, dst, tag)

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> torch.Tensor:
        with self.timed(f"recv from {src}"):
            return super().recv(tensor, src, tag)

    def all_gather_object(self, obj: Any) -> list[Any]:
        with self.timed("all_gather_object"):
            return super().all_gather_object(obj)

    def all_reduce_dict(self, data: Any, op: Any = "sum") -> dict[str, Any]:
        with self.timed("all_reduce_dict"):
            return super().all_reduce_dict(data, op)


@Communicator.register("pipeline")
class PipelineComm(LoggingComm):
    """The world, split into ``options["stages"]`` consecutive blocks of ranks."""

    def __init__(self, config: CommConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        stages = int(config.options.get("stages", 2))
        if self.world_size % stages:
            raise ValueError(f"{self.world_size} ranks cannot form {stages} equal pipeline stages")
        self.per_stage = self.world_size // stages
        self.stage = self.rank // self.per_stage
        self.stages = stages
        # Every rank takes part in the split; each gets the group of its own stage.
        self.stage_comm = self.split(color=self.stage)

    def next_rank(self) -> int | None:
        """The rank in the next stage that receives this rank's activations."""
        return self.rank + self.per_stage if self.stage + 1 < self.stages else None

    def previous_rank(self) -> int | None:
        return self.rank - self.per_stage if self.stage > 0 else None


class Evaluator:
    """A module written against ``Communicator``: the mean loss and every prediction, in order."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor, size: int) -> dict[str, Any]:
        loss = torch.nn.functional.mse_loss(outputs, targets, reduction="sum").double()
        totals = self.comm.all_reduce_dict({"loss_sum": loss, "count": targets.numel()})
        predictions = self.comm.collect_results(outputs.squeeze(1).tolist(), size=size)
        return {"loss": (totals["loss_sum"] / totals["count"]).item(), "predictions": predictions}


SAMPLES, FEATURES, HIDDEN = 64, 6, 10


def make_model_and_data() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    first, second = torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Linear(HIDDEN, 1)
    x = torch.randn(SAMPLES, FEATURES)
    return first, second, x, x.sum(1, keepdim=True)


def pipeline_eval(comm: Communicator) -> dict[str, Any]:
    """Run on ``Communicator.create({"type": "pipeline", ...})``: stage 0 runs the first layer,
    stage 1 the second; the ranks of stage 1 evaluate with ``Evaluator(comm.stage_comm)``."""
    assert isinstance(comm, PipelineComm)
    first, second, x, y = make_model_and_data()
    replica, replicas = comm.stage_comm.rank, comm.stage_comm.world_size
    with torch.no_grad():
        if comm.stage == 0:
            comm.send(torch.relu(first(x[replica::replicas])), dst=comm.next_rank())
            return {"stage": 0, "log": comm.log}
        hidden = torch.empty(len(x[replica::replicas]), HIDDEN)
        comm.recv(hidden, src=comm.previous_rank())
        result = Evaluator(comm.stage_comm)(second(hidden), y[replica::replicas], size=SAMPLES)
    return {"stage": 1, "stage_rank": replica, "log": comm.log, **result}


def main() -> dict[str, Any]:
    # The reference: the whole model, the same Evaluator, one process.
    first, second, x, y = make_model_and_data()
    with torch.no_grad():
        expected = Evaluator(NonDistComm())(second(torch.relu(first(x))), y, size=SAMPLES)

    config = {"type": "pipeline", "backend": "gloo", "options": {"stages": 2, "verbose": False}}
    outcomes = launch(pipeline_eval, 4, config)
    stage1 = [o for o in outcomes if o["stage"] == 1]
    main_of_stage = next(o for o in stage1 if o["stage_rank"] == 0)
    assert abs(main_of_stage["loss"] - expected["loss"]) < 1e-6, (main_of_stage["loss"], expected["loss"])
    assert torch.allclose(torch.tensor(main_of_stage["predictions"]), torch.tensor(expected["predictions"]), atol=1e-6)
    assert all(o["loss"] == main_of_stage["loss"] for o in stage1)
    for rank, outcome in enumerate(outcomes):
        print(f"rank {rank} (stage {outcome['stage']}): {', '.join(outcome['log'])}")
    print(f"stage 1 loss {main_of_stage['loss']:.6f} == one process {expected['loss']:.6f}")
    return {"loss": main_of_stage["loss"], "expected": expected["loss"]}


if __name__ == "__main__":
    main()
