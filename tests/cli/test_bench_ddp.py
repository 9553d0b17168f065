"""``communicator bench --cases ddp fsdp pg-overhead --quick``: every row is measured, both sides of
each model case end with equal weights, and the table with its ratio's definition fits 120 columns
(no timing is judged here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.ddp import CASES, DDP, FSDP, NAMES, PG_OVERHEAD, Row, Settings, format_rows
from benchmarks.spread import spread_of
from communicator.cli import main


@pytest.mark.timeout(180)
def test_quick_run_has_every_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--cases", *CASES, "--world-size", "2", "--json", str(out)]) == 0
    (world,) = json.loads(out.read_text())["worlds"]
    rows = world["process_group"]
    assert [(row["case"], row["world_size"]) for row in rows] == [(DDP, 2), (FSDP, 2), (PG_OVERHEAD, 2)]
    for row in rows:
        assert row["native"] > 0 and row["ours"] > 0 and row["spread"]["rounds"] >= 5, row
        assert row["verdict"] == "not judged"  # a smoke test: a tiny model, few rounds
    assert [row["check"] for row in rows] == ["same", "same", ""]  # DDP and FSDP2 trained alike on both sides
    printed = capsys.readouterr().out
    table = printed[printed.index("DDP and FSDP2 through comm.as_process_group()") :]
    assert all(NAMES[case] in table for case in CASES) and "ratio: ours/native" in table
    assert "verdicts: not judged (a --quick run is a smoke test)" in table
    assert max(len(line) for line in table.splitlines()) <= 120


def test_the_table_fits_120_columns_whatever_the_figures() -> None:
    spread = spread_of([0.987654, 1.234567, 12.345678, 1.0, 1.01])
    rows = [
        Row(case, world, "MLP 15.7M" if case != PG_OVERHEAD else "", 12345.6, 99999.9, spread, 1.03, "DIFFER")
        for world in (2, 64)
        for case in CASES
    ]
    text = format_rows(rows, Settings())
    assert max(len(line) for line in text.splitlines()) <= 120, text
    assert "64*" in text and "ranks > cores" in text
