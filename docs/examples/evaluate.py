"""Distributed evaluation: sharded inference, ordered result collection, metric reduction.

Each rank scores its shard of a test set and rank 0 gets every per-sample result back in dataset
order with ``collect_results``. Two shardings are shown:

- ``interleave`` (the default): rank ``r`` holds samples ``r, r + W, r + 2W, ...``, exactly what
  ``torch.utils.data.DistributedSampler`` hands out, including the padding it adds when the data
  set does not divide evenly; ``size=len(dataset)`` drops that padding.
- ``contiguous``: rank ``r`` holds one contiguous block (``numpy.array_split``).

Samples the model cannot score (a missing input) give a ``None`` result, which is kept in place.
The whole evaluation then runs in one process and the answers must be identical.

Run it with ``python docs/examples/evaluate.py``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from communicator import Communicator, launch
from communicator.testing import run_single

SAMPLES = 1003  # not a multiple of 3 or 4: the interleaved shards are padded
FEATURES = 16
CLASSES = 4


def make_problem() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed linear classifier and a labelled test set, the same in every process."""
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(FEATURES, CLASSES, generator=generator)
    features = torch.randn(SAMPLES, FEATURES, generator=generator)
    labels = (features @ weights + 0.3 * torch.randn(SAMPLES, CLASSES, generator=generator)).argmax(1)
    features[::97] = float("nan")  # a few unusable samples
    return weights, features, labels


def score(weights: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, index: int) -> dict[str, object] | None:
    """One sample's result, or ``None`` when it cannot be scored."""
    x = features[index]
    if torch.isnan(x).any():
        return None
    probabilities = torch.softmax(x @ weights, dim=0)
    prediction = int(probabilities.argmax())
    return {
        "index": index,
        "prediction": prediction,
        "correct": prediction == int(labels[index]),
        "confidence": float(probabilities[prediction]),
    }


def shard(comm: Communicator, order: str) -> list[int]:
    if order == "interleave":
        return list(DistributedSampler(range(SAMPLES), num_replicas=comm.world_size, rank=comm.rank, shuffle=False))
    return np.array_split(np.arange(SAMPLES), comm.world_size)[comm.rank].tolist()


def evaluate(comm: Communicator, order: str = "interleave") -> dict[str, object] | None:
    weights, features, labels = make_problem()
    indices = shard(comm, order)
    part = [score(weights, features, labels, i) for i in indices]

    # Metrics: counts over this rank's real samples (padding excluded), summed over the ranks.
    # The sampler's padding sits at the end of an interleaved shard.
    own = len(range(comm.rank, SAMPLES, comm.world_size)) if order == "interleave" else len(indices)
    real = [r for r in part[:own] if r is not None]
    totals = comm.all_reduce_dict({"correct": sum(r["correct"] for r in real), "scored": len(real)})

    results = comm.collect_results(part, size=SAMPLES, order=order)
    if results is None:  # every rank but rank 0
        return None
    return {"results": results, "accuracy": totals["correct"] / totals["scored"], "scored": totals["scored"]}


def main(world_size: int = 3) -> dict[str, float]:
    reference = run_single(evaluate)  # one process: a NonDistComm, the same code
    outcome = {}
    for order in ("interleave", "contiguous"):
        distributed = launch(evaluate, world_size, args=(order,))[0]
        assert distributed is not None
        assert len(distributed["results"]) == SAMPLES
        assert [r["index"] for r in distributed["results"] if r is not None] == [
            i for i, r in enumerate(reference["results"]) if r is not None
        ], "not in dataset order"
        assert distributed["results"] == reference["results"], "results differ from one process"
        assert distributed["accuracy"] == reference["accuracy"]
        missing = sum(r is None for r in distributed["results"])
        print(
            f"{order:>10}: {SAMPLES} results in dataset order ({missing} None kept), "
            f"accuracy {distributed['accuracy']:.4f} == single process {reference['accuracy']:.4f}"
        )
        outcome[order] = distributed["accuracy"]
    return outcome


if __name__ == "__main__":
    main()
