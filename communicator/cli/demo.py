"""``communicator demo``: a distributed evaluation on local gloo ranks, checked against one process.

Every rank scores its shard of a synthetic data set (interleaved, as ``DistributedSampler`` shards),
rank 0 collects the per-sample records in dataset order, the metrics are reduced across ranks,
each half of the ranks computes its own metric in a subgroup, and the answer is compared with the
same evaluation run in a single process.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import numpy as np
import torch

from communicator.base import Communicator
from communicator.errors import CommError
from communicator.testing import run_single
from communicator.testing.spawn import launch

__all__ = ["EMBEDDING_TOLERANCE", "add_arguments", "compare", "evaluate", "run"]

FEATURES = 16
CLASSES = 5


def _positive(kind: type[int] | type[float]) -> Any:
    """An argparse type: a positive ``kind``; anything else is a usage error (stderr, exit 2)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", "-n", type=_positive(int), default=4, help="number of local ranks (default 4)")
    parser.add_argument("--samples", type=_positive(int), default=20_000, help="data set size (default 20000)")
    parser.add_argument("--timeout", type=_positive(float), default=120.0, help="seconds before the ranks are stopped")
    parser.add_argument(
        "--stats", action="store_true", help="print rank 0's statistics of every operation (comm.stats())"
    )


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
    # The model runs in float64, so that a prediction never flips between a shard and the full
    # batch on a near-tie; the embedding shipped with each record is float32, as models emit.
    logits = features[indices].double() @ weights.double()
    confidence, prediction = torch.softmax(logits, dim=1).max(dim=1)
    records = [
        {"index": index, "label": label, "prediction": predicted, "confidence": score, "embedding": embedding}
        for index, label, predicted, score, embedding in zip(
            indices,
            labels[indices].tolist(),
            prediction.tolist(),
            confidence.tolist(),
            logits.float().numpy(),
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
        "stats": comm.stats().table(),
    }


#: Embeddings are float32 logits. A shard's matmul and the full batch's may take different BLAS
#: kernels (chosen by shape), so their last bits differ; they must agree within this (absolute,
#: relative to the magnitude). Everything else is compared exactly.
EMBEDDING_TOLERANCE = 1e-5
#: The confidence sums add 20000 float64 values in a different order on each side.
SUM_TOLERANCE = 1e-9


def _first_difference(ours: list[Any], reference: list[Any]) -> str:
    if len(ours) != len(reference):
        return f"{len(ours)} records, expected {len(reference)}"
    for position, (got, want) in enumerate(zip(ours, reference, strict=True)):
        if got != want:
            return f"record {position} is (index, label, prediction) {got}, expected {want}"
    return ""


def _embedding_difference(ours: list[dict[str, Any]], reference: list[dict[str, Any]]) -> str:
    worst, where = 0.0, -1
    for position, (got, want) in enumerate(zip(ours, reference, strict=True)):
        excess = np.abs(got["embedding"] - want["embedding"]) - EMBEDDING_TOLERANCE * (1 + np.abs(want["embedding"]))
        if float(excess.max()) > worst:
            worst, where = float(excess.max()), position
    if where < 0:
        return ""
    got, want = ours[where]["embedding"], reference[where]["embedding"]
    return f"record {where}: {got.tolist()} against {want.tolist()} (tolerance {EMBEDDING_TOLERANCE:g})"


def compare(results: list[dict[str, Any]], reference: dict[str, Any], samples: int) -> dict[str, str]:
    """Each check's name and what differs when it fails (empty when it passes).

    ``results`` holds every rank's return value of :func:`evaluate` (rank 0's carries the
    records), ``reference`` the single-process run's.
    """
    ours = results[0]
    mine, theirs = ours["records"], reference["records"]
    confidence, expected_confidence = ours["metrics"]["confidence"], reference["metrics"]["confidence"]
    seen = dict(x["half"] for x in results)
    seeds = sorted({x["seed"] for x in results})
    checks = {
        "records in dataset order, none lost": _first_difference(
            [(r["index"], r["label"], r["prediction"]) for r in mine],
            [(r["index"], r["label"], r["prediction"]) for r in theirs],
        ),
        f"embeddings within {EMBEDDING_TOLERANCE:g}": _embedding_difference(mine, theirs)
        if len(mine) == len(theirs)
        else "record counts differ",
        "accuracy equals single process": ""
        if ours["metrics"]["correct"] == reference["metrics"]["correct"]
        else f"{ours['metrics']['correct']} correct, expected {reference['metrics']['correct']}",
        f"confidence sum within {SUM_TOLERANCE:g}": ""
        if abs(confidence - expected_confidence) <= SUM_TOLERANCE * max(1.0, abs(expected_confidence))
        else f"{confidence!r}, expected {expected_confidence!r}",
        "subgroups cover every sample": ""
        if sum(seen.values()) == samples
        else f"the halves saw {seen}, {sum(seen.values())} in all, expected {samples}",
        "one seed on every rank": "" if len(seeds) == 1 else f"the ranks drew {seeds}",
    }
    return checks


def run(args: argparse.Namespace) -> int:
    print(f"communicator demo: evaluating {args.samples} samples on {args.world_size} local gloo ranks")
    begin = time.perf_counter()
    try:
        results = launch(evaluate, args.world_size, {"stats": args.stats}, (args.samples,), timeout=args.timeout)
    except CommError as error:  # a rank failed or the ranks timed out: the message says which, not a traceback
        print(f"communicator demo: the local ranks failed: {error}", file=sys.stderr, flush=True)
        return 1
    distributed_seconds = time.perf_counter() - begin
    begin = time.perf_counter()
    reference = run_single(evaluate, args.samples)
    single_seconds = time.perf_counter() - begin
    ours = results[0]
    checks = compare(results, reference, args.samples)

    width = max(len(name) for name in ours["timings"])
    print(f"\n{'stage':<{width}}  rank 0 time")
    for name, seconds in ours["timings"].items():
        print(f"{name:<{width}}  {seconds * 1000:8.1f} ms")
    if args.stats:
        print(f"\nrank 0's operations (comm.stats())\n{ours['stats']}")
    print(f"\naccuracy {ours['metrics']['correct'] / args.samples:.4f} on {args.samples} samples")
    print(
        f"wall time: {distributed_seconds:.2f} s on {args.world_size} ranks (start-up included), "
        f"{single_seconds:.2f} s in one process\n"
    )
    check_width = max(len(name) for name in checks)
    for name, problem in checks.items():
        print(f"{name:<{check_width}}  {'FAILED: ' + problem if problem else 'ok'}")
    passed = not any(checks.values())
    print("\nthe distributed answer equals the single-process answer" if passed else "\nMISMATCH")
    return 0 if passed else 1
