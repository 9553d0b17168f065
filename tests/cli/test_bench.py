"""``communicator bench --quick``: every case, op and implementation is timed and checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from communicator.bench.cases import CASES
from communicator.bench.ops import build_ops, load_mmengine
from communicator.cli import main


@pytest.mark.timeout(120)
def test_quick_bench_records_every_call(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"

    code = main(["bench", "--quick", "--world-size", "2", "--json", str(out)])

    assert code == 0
    report = json.loads(out.read_text())
    assert report["world_size"] == 2
    assert report["repeat"] == 2
    assert report["all_correct"] is True
    ops = build_ops(load_mmengine())
    for case in CASES:
        recorded = report["cases"][case.name]["ops"]
        assert list(recorded) == list(case.ops)
        for op in case.ops:
            impls = recorded[op]["impls"]
            assert set(impls) == set(ops[op].impls), (case.name, op)
            for impl, record in impls.items():
                assert record.get("error") is None, (case.name, op, impl, record)
                assert record["correct"] is True, (case.name, op, impl)
                assert record["median_ms"] > 0
                assert len(record["times_ms"]) == 2
    assert report["targets"] == []  # set for the full payloads: a quick run does not judge them
    printed = capsys.readouterr().out
    assert "torch/ours" in printed
    assert all(case.name in printed for case in CASES)
    assert "MISSED" not in printed and "not judged in a --quick run" in printed
    overhead = report["overhead"]
    assert overhead["world_size"] == 2 and overhead["recording_us"] > 0
    names = [row["name"] for row in overhead["rows"]]
    assert names[:4] == [
        "all_reduce, 1 element",
        "broadcast, 1 element",
        "barrier",
        "all_gather, 1 element, same_shape=True",
    ]
    assert all(row["baseline_us"] > 0 and row["ours_us"] > 0 for row in overhead["rows"])
    assert "overhead: world size 2" in printed


@pytest.mark.timeout(120)
def test_bench_prints_the_library_s_own_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--quick", "--world-size", "2", "--cases", "small", "dict100", "--stats"])

    assert code == 0
    printed = capsys.readouterr().out
    table = printed.split("rank 0's operations in the cases, every call (comm.stats())\n", 1)[1]
    rows = {line.split()[1]: line.split() for line in table.splitlines()[1:] if line.strip()}
    # small: three object ops; dict100: all_reduce_dict; each checked once, then 2 timed rounds of single calls
    for op in ("all_gather_object", "gather_object", "broadcast_object", "all_reduce_dict"):
        assert int(rows[op][2]) == 3, rows[op]
