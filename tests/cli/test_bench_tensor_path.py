"""``communicator bench --cases tensor-path --quick``: every call of the case is timed and checked,
its report fits 120 columns and its JSON holds every op; the targets, judged on given numbers
(nothing here is timed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.measured import CaseRun
from benchmarks.ops import MMENGINE, OURS, TORCH
from benchmarks.overhead import IGNITE
from benchmarks.spread import MET, MISSED, NOT_JUDGED, WITHIN_NOISE
from benchmarks.tensor_path import (
    FULL,
    OURS_TENSOR,
    QUICK,
    TENSOR_PATH,
    TensorPath,
    format_report,
    outcomes,
    sweep_op,
    targets,
)
from benchmarks.timing import Timings
from benchmarks.verify import HEADLINE, against
from communicator.cli import main

OBJECT_IMPLS = {OURS, OURS_TENSOR, TORCH, IGNITE, MMENGINE}


def _ops(sizes: tuple[int, ...]) -> list[str]:
    return [
        "all_gather_object",
        "broadcast_object",
        *(sweep_op(kind, s) for kind in ("all_gather", "gather") for s in sizes),
    ]


@pytest.mark.timeout(120)
def test_quick_run_times_and_checks_every_call(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--cases", TENSOR_PATH, "--world-size", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["all_correct"] is True
    (world,) = report["worlds"]
    assert world["all_correct"] is True and world["targets"] == []  # a smoke test judges no target
    case = world["cases"][TENSOR_PATH]
    assert case["tensor_bytes"] == QUICK.tensor_bytes and case["sweep_bytes"] == list(QUICK.sweep)
    assert list(case["ops"]) == _ops(QUICK.sweep)
    for op, recorded in case["ops"].items():
        impls = recorded["impls"]
        expected = OBJECT_IMPLS if op.endswith("_object") else {OURS, TORCH} if op.startswith("gather") else None
        if expected is None:  # the default all_gather, against same_shape=True and torch's
            expected = {OURS, OURS_TENSOR, TORCH}
        peers = {IGNITE, MMENGINE} & set(impls)  # optional: the bench runs without them
        assert set(impls) == expected - ({IGNITE, MMENGINE} - peers), op
        for impl, call in impls.items():
            assert call.get("error") is None and call["correct"] is True, (op, impl, call)
            assert call["median_ms"] > 0 and len(call["times_ms"]) == 2
    printed = capsys.readouterr().out
    assert "world size 2, tensor-path: median of 2 rounds" in printed
    assert f"targets: {NOT_JUDGED} (a --quick run is a smoke test" in printed
    assert max(len(line) for line in printed.splitlines()) <= 120


def _result(ours: float, tensor: float, torch_s: float) -> TensorPath:
    """A report at full sizes where every round took the same: ``ours``, ``tensor`` and torch's seconds."""
    seconds, correct = {}, {}
    for op in _ops(FULL.sweep):
        impls = {OURS: ours, TORCH: torch_s} | ({} if op.startswith("gather") else {OURS_TENSOR: tensor})
        for impl, value in impls.items():
            seconds[op, impl] = [value * (1 + i / 100) for i in range(9)]  # 9 rounds: a 90 % interval
            correct[op, impl] = True
    timings = Timings(seconds, correct, {}, dict.fromkeys(seconds, 1), {call: [0] for call in seconds})
    return TensorPath(2, FULL, CaseRun(TENSOR_PATH, "", [FULL.tensor_bytes] * 2, timings))


def test_targets_are_judged_on_the_rounds_ratios() -> None:
    verdicts = {o.target.label: o.verdict for o in outcomes(_result(ours=1.0, tensor=0.95, torch_s=2.0))}
    assert len(verdicts) == len(targets(FULL))
    assert verdicts["tensor-path all_gather_object ours/ours_tensor <= 1.1"] == MET
    assert verdicts["tensor-path broadcast_object torch/ours >= 1"] == MET
    assert verdicts["tensor-path broadcast_object ignite/ours >= 1"] == "n/a"  # a side that did not run
    assert verdicts["tensor-path gather, 1 MiB ours/torch <= 1.25"] == MET
    slow = {o.target.label: o.verdict for o in outcomes(_result(ours=1.0, tensor=0.5, torch_s=0.5))}
    assert slow["tensor-path all_gather, 64 KiB ours/ours_tensor <= 1.25"] == MISSED
    assert slow["tensor-path broadcast_object torch/ours >= 1"] == MISSED
    assert WITHIN_NOISE not in slow.values()


def test_the_report_fits_120_columns_whatever_the_figures() -> None:
    result = _result(ours=99.9999, tensor=0.0001, torch_s=99.9999)
    text = format_report(result, False, outcomes(result))
    assert max(len(line) for line in text.splitlines()) <= 120, text
    assert "all_gather_object, 64 MiB" in text and "gather, 64 KiB" in text and "missed" in text


def test_the_headline_names_this_library_s_tensor_op() -> None:
    picks = [pick for pick in HEADLINE if pick.case == TENSOR_PATH]
    assert {pick.op for pick in picks} >= {"all_gather_object", "broadcast_object"}
    assert against("broadcast_object", OURS_TENSOR) == "ours: broadcast(t, src)"
    assert against("all_gather, 1 MiB", OURS_TENSOR) == "ours: all_gather(t, same_shape=True)"
    assert against("all_gather_object", TORCH) == "torch.distributed"
