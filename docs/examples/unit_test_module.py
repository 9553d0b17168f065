"""A module that takes its communicator in ``__init__``, unit-tested in one process and run on 2 ranks.

``ClassificationMetrics`` never imports ``torch.distributed`` and never asks whether it is
distributed: it calls ``self.comm``. A test hands it a ``NonDistComm`` (a world of one, no
process group, no ports) and checks exact numbers; ``run_ranks`` runs the very same code on real
gloo ranks, and the dataset-wide answer must not depend on how the data was split.

Run it with ``python docs/examples/unit_test_module.py``, or collect the tests with
``pytest docs/examples/unit_test_module.py``.
"""

from __future__ import annotations

import torch

from communicator import Communicator, NonDistComm
from communicator.testing import run_ranks


class ClassificationMetrics:
    """Accumulates a confusion matrix batch by batch; ``compute()`` gives dataset-wide metrics."""

    def __init__(self, comm: Communicator, num_classes: int) -> None:
        self.comm = comm
        self.num_classes = num_classes
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)
        self.loss_sum = 0.0
        self.seen = 0
        self.predicted: list[int] = []

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        predictions = logits.argmax(1)
        index = labels * self.num_classes + predictions
        self.confusion += torch.bincount(index, minlength=self.num_classes**2).view(self.num_classes, -1)
        self.loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        self.seen += len(labels)
        self.predicted.extend(predictions.tolist())

    def compute(self) -> dict[str, float]:
        """Metrics over every rank's samples, on every rank (one collective)."""
        totals = self.comm.all_reduce_dict({"confusion": self.confusion, "loss_sum": self.loss_sum, "seen": self.seen})
        confusion = totals["confusion"].double()
        recall = confusion.diag() / confusion.sum(1).clamp(min=1)
        return {
            "accuracy": (confusion.diag().sum() / confusion.sum()).item(),
            "macro_recall": recall.mean().item(),
            "loss": totals["loss_sum"] / totals["seen"],
            "samples": totals["seen"],
        }

    def predictions(self, size: int) -> list[int] | None:
        """Every prediction in dataset order on rank 0 (ranks hold interleaved shards); None elsewhere."""
        return self.comm.collect_results(self.predicted, size=size)


# -- the data the tests use --------------------------------------------------------------------

LOGITS = torch.tensor(
    [
        [2.0, 0.1, 0.0],
        [0.2, 1.5, 0.1],
        [0.1, 0.2, 3.0],
        [1.0, 0.0, 2.0],
        [0.0, 2.5, 0.1],
        [3.0, 0.0, 0.2],
        [0.1, 0.0, 0.3],
        [0.0, 1.0, 0.5],
    ]
)
LABELS = torch.tensor([0, 1, 2, 0, 1, 0, 2, 2])  # samples 3 and 7 are misclassified


# -- unit tests: one process, no launcher, exact answers ---------------------------------------


def test_metrics_in_one_process() -> None:
    metrics = ClassificationMetrics(NonDistComm(), num_classes=3)
    metrics.update(LOGITS[:4], LABELS[:4])
    metrics.update(LOGITS[4:], LABELS[4:])
    result = metrics.compute()
    assert result["accuracy"] == 6 / 8
    assert result["samples"] == 8
    assert abs(result["macro_recall"] - (2 / 3 + 1 + 2 / 3) / 3) < 1e-12
    assert metrics.predictions(size=8) == [0, 1, 2, 2, 1, 0, 2, 1]


def test_bad_input_fails_as_it_would_on_many_ranks() -> None:
    metrics = ClassificationMetrics(NonDistComm(), num_classes=3)
    try:
        metrics.comm.collect_results(metrics.predicted, size=-1)
    except ValueError as error:
        assert "size" in str(error)
    else:
        raise AssertionError("a negative size must be refused")


# -- the same module on two real ranks ----------------------------------------------------------


def _on_ranks(comm: Communicator) -> tuple[dict[str, float], list[int] | None]:
    metrics = ClassificationMetrics(comm, num_classes=3)
    shard = slice(comm.rank, None, comm.world_size)  # interleaved, as DistributedSampler shards
    metrics.update(LOGITS[shard], LABELS[shard])
    return metrics.compute(), metrics.predictions(size=len(LABELS))


def test_metrics_on_two_ranks() -> None:
    single = ClassificationMetrics(NonDistComm(), num_classes=3)
    single.update(LOGITS, LABELS)
    expected = single.compute()
    (rank0, predictions), (rank1, nothing) = run_ranks(_on_ranks, 2)
    assert rank0 == rank1  # every rank gets the dataset-wide metrics
    assert rank0["accuracy"] == expected["accuracy"] and rank0["samples"] == 8
    assert abs(rank0["loss"] - expected["loss"]) < 1e-12
    assert predictions == single.predictions(size=8) and nothing is None


def main() -> None:
    for test in (
        test_metrics_in_one_process,
        test_bad_input_fails_as_it_would_on_many_ranks,
        test_metrics_on_two_ranks,
    ):
        test()
        print(f"{test.__name__}: passed")


if __name__ == "__main__":
    main()
