"""``communicator demo``: a distributed evaluation on local gloo ranks, checked against one process.

Every rank scores its shard of a synthetic data set (interleaved, as ``DistributedSampler`` shards),
rank 0 collects the per-sample records in dataset order, the metrics are reduced across ranks,
each half of the ranks computes its own metric in a subgroup, and the answer is compared with the
same evaluation run in a single process.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
import torch

from communicator.base import Communicator
from communicator.spawn import launch
from communicator.testing import run_single

__all__ = ["add_arguments", "evaluate", "run"]

FEATURES = 16
CLASSES = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", "-n", type=int, default=4, help="number of local ranks (default 4)")
    parser.add_argument("--samples", type=int, default=20_000, help="data set size (default 20000)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before the ranks are stopped")


def _data(samples: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed synthetic data set and a fixed linear classifier (the same in every process)."""
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(FEATURES, CLASSES, generator=generator)
    features = torch.randn(samples, FEATURES, generator=generator)
    labels = (features @ weights + 0.5 * torch.randn(samples, CLASSES, generator=generator)).argmax(1)
    return weights, features, labels


def evaluate(comm: Communicator, samples: int) -> dict[str, Any]:
    """The evaluation every rank runs; returns rank 0's view (records, metrics, timings)."""
    timings: dict[str, float] = {}

    def stage(name: str, start: float) -> float:
        timings[name] = time.perf_counter() - start
        return time.perf_counter()

    start = time.perf_counter()
    settings: dict[str, int] = comm.broadcast_object({"samples": samples} if comm.is_main_process else {})
    seed = comm.sync_random_seed(1234)
    weights, features, labels = _data(settings["samples"])
    start = stage("setup", start)

    # DistributedSampler-style shard, padded so every rank holds the same number of items.
    per_rank = math.ceil(samples / comm.world_size)
    indices = [(comm.rank + comm.world_size * k) % samples for k in range(per_rank)]
    logits = features[indices] @ weights
    confidence, prediction = torch.softmax(logits, dim=1).max(dim=1)
    records = [
        {"index": index, "label": label, "prediction": predicted, "confidence": score, "embedding": embedding}
        for index, label, predicted, score, embedding in zip(
            indices,
            labels[indices].tolist(),
            prediction.tolist(),
            confidence.tolist(),
            logits.numpy().astype(np.float32),
            strict=True,
        )
    ]
    start = stage("inference", start)

    collected = comm.collect_results(records, size=samples)
    start = stage("collect_results", start)

    own = records[: len(range(comm.rank, samples, comm.world_size))]  # the rest is the sampler's padding
    correct = sum(r["prediction"] == r["label"] for r in own)
    metrics = comm.all_reduce_dict(
        {
            "correct": torch.tensor(correct),
            "seen": len(own),
            "confidence": torch.tensor(sum(r["confidence"] for r in own)),
        }
    )
    start = stage("all_reduce_dict", start)

    half_id = comm.rank * 2 // comm.world_size
    half_seen = comm.split(color=half_id).all_reduce_dict({"seen": len(own)})["seen"]
    start = stage("subgroup", start)

    return {
        "seed": seed,
        "records": collected,
        "metrics": {
            "correct": int(metrics["correct"]),
            "seen": metrics["seen"],
            "confidence": float(metrics["confidence"]),
        },
        "half": (half_id, half_seen),
        "timings": timings,
    }


def _summary(result: dict[str, Any]) -> tuple[list[tuple[int, int, int]], int]:
    records = result["records"]
    return [(r["index"], r["label"], r["prediction"]) for r in records], len(records)


def run(args: argparse.Namespace) -> int:
    print(f"communicator demo: evaluating {args.samples} samples on {args.world_size} local gloo ranks")
    begin = time.perf_counter()
    results = launch(evaluate, args.world_size, None, (args.samples,), timeout=args.timeout)
    distributed_seconds = time.perf_counter() - begin
    begin = time.perf_counter()
    reference = run_single(evaluate, args.samples)
    single_seconds = time.perf_counter() - begin
    ours = results[0]

    checks = {
        "records in dataset order, none lost": _summary(ours) == _summary(reference),
        "embeddings identical": all(
            np.array_equal(a["embedding"], b["embedding"])
            for a, b in zip(ours["records"], reference["records"], strict=True)
        ),
        "accuracy equals single process": ours["metrics"]["correct"] == reference["metrics"]["correct"],
        "confidence sum within 1e-6": abs(ours["metrics"]["confidence"] - reference["metrics"]["confidence"])
        <= 1e-6 * max(1.0, abs(reference["metrics"]["confidence"])),
        "subgroups cover every sample": sum(dict(x["half"] for x in results).values()) == args.samples,
        "one seed on every rank": len({x["seed"] for x in results}) == 1,
    }
    width = max(len(name) for name in ours["timings"])
    print(f"\n{'stage':<{width}}  rank 0 time")
    for name, seconds in ours["timings"].items():
        print(f"{name:<{width}}  {seconds * 1000:8.1f} ms")
    print(f"\naccuracy {ours['metrics']['correct'] / args.samples:.4f} on {args.samples} samples")
    print(
        f"wall time: {distributed_seconds:.2f} s on {args.world_size} ranks (start-up included), "
        f"{single_seconds:.2f} s in one process\n"
    )
    check_width = max(len(name) for name in checks)
    for name, ok in checks.items():
        print(f"{name:<{check_width}}  {'ok' if ok else 'FAILED'}")
    passed = all(checks.values())
    print("\nthe distributed answer equals the single-process answer" if passed else "\nMISMATCH")
    return 0 if passed else 1
