"""The performance page's claims: the page's table is the claims file's rendering, and
``communicator bench --verify-docs`` decides on given numbers (a recorded run stands in for the
rerun: nothing here is timed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import benchmarks.cli
from benchmarks.spread import Spread
from benchmarks.verify import (
    CLAIMS,
    HEADLINE,
    PAGE,
    PREFIX,
    Claim,
    load_claims,
    measured,
    render,
    reproduces,
    verify_docs,
    with_table,
)
from communicator.cli import main

COMMAND = "python -m communicator bench --world-size 2 --cases small overhead --repeat 5 --json old.json"
ARGV = ["--world-size", "2", "--cases", "small", "overhead", "--repeat", "5"]  # the command less its --json
MACHINE = {"cores": 2, "machine": "x86_64", "load": [1.0, 2.0], "python": "3.11", "torch": "2", "date": "2000-01-01"}


def _claim(case: str, op: str, peer: str, median: float, low: float, high: float) -> Claim:
    return Claim(f"{op} of {case}", case, op, peer, 2, median, low, high, 5, 0.9375, COMMAND, MACHINE)


def _record(torch_ms: list[float], ours_ms: list[float], ours_over_torch: Spread) -> dict[str, Any]:
    """A bench JSON record in the bench's shape: one case op and one overhead row at world 2."""
    impls = {"ours": {"times_ms": ours_ms}, "torch": {"times_ms": torch_ms}}
    row = {"name": "all_reduce, 1 element", "baseline": "torch", "spread": dataclasses.asdict(ours_over_torch)}
    world = {
        "world_size": 2,
        "cases": {"small": {"ops": {"all_gather_object": {"impls": impls}}}},
        "overhead": {"rows": [row]},
    }
    return {"world_sizes": [2], "environment": {"cpus": 2}, "worlds": [world]}


# Per round, torch took 2 to 3 times ours: ratios 2.0 2.25 2.5 2.75 3.0, median 2.5, interval [2.0-3.0].
RECORDED = _record([2.0, 4.5, 7.5, 11.0, 15.0], [1.0, 2.0, 3.0, 4.0, 5.0], Spread(1.25, 1.1, 1.6, 5, 0.9375))


def _fake_bench(record: dict[str, Any], code: int = 0) -> tuple[list[list[str]], Any]:
    """A bench that writes ``record`` where --json says and exits with ``code``; the argvs it got."""
    calls: list[list[str]] = []

    def bench(argv: list[str]) -> int:
        calls.append(argv)
        Path(argv[argv.index("--json") + 1]).write_text(json.dumps(record))
        return code

    return calls, bench


def _claims_file(tmp_path: Path, claims: list[Claim]) -> Path:
    path = tmp_path / "claims.json"
    path.write_text(json.dumps({"claims": [dataclasses.asdict(claim) for claim in claims]}))
    return path


def test_the_page_table_is_the_rendering_of_the_claims_file() -> None:
    page = PAGE.read_text()
    assert with_table(page, load_claims(CLAIMS)) == page, "run python -m benchmarks.verify render"


def test_the_claims_file_holds_the_headline_measured_once() -> None:
    claims = load_claims(CLAIMS)
    sizes = {claim.world_size for claim in claims}
    assert {(claim.pick, claim.world_size) for claim in claims} == {(pick, size) for pick in HEADLINE for size in sizes}
    for claim in claims:
        assert claim.command.split()[: len(PREFIX)] == list(PREFIX)
        assert claim.low <= claim.median <= claim.high
        assert claim.rounds >= 5 and claim.confidence >= 0.9  # an interval, not a range of too few rounds
        assert claim.machine["cores"] and claim.machine["load"], "every figure names its machine and load"


def test_the_render_names_the_command_machine_and_load() -> None:
    text = render([_claim("small", "all_gather_object", "torch", 2.4, 2.0, 3.0)])
    assert "**2.40** [2.00-3.00]" in text
    assert f"`{COMMAND}`" in text and "2-core x86_64" in text and "load average 1.0-2.0" in text


def test_ratios_are_the_peer_over_ours_per_round() -> None:
    claim = _claim("small", "all_gather_object", "torch", 0, 0, 0)
    assert measured(RECORDED, claim.pick, 2) == Spread(2.5, 2.0, 3.0, 5, 0.9375)
    # The overhead case reports ours over theirs: inverted, the interval's ends swap.
    row = _claim("overhead", "all_reduce, 1 element", "torch", 0, 0, 0)
    assert measured(RECORDED, row.pick, 2) == Spread(0.8, 1 / 1.6, 1 / 1.1, 5, 0.9375)
    assert measured(RECORDED, row.pick, 4) is None  # a world size that did not run
    assert measured(RECORDED, dataclasses.replace(claim, peer="mmengine").pick, 2) is None


@pytest.mark.parametrize(
    ("rerun", "expected"),
    [
        (Spread(2.6, 2.5, 2.9, 5, 0.94), True),  # inside
        (Spread(1.9, 1.7, 2.0, 5, 0.94), True),  # touching the claimed low end
        (Spread(1.5, 1.3, 1.9, 5, 0.94), False),  # wholly below
        (Spread(3.5, 3.1, 4.0, 5, 0.94), False),  # wholly above
        (None, False),  # not measured again
    ],
)
def test_a_claim_reproduces_when_the_intervals_overlap(rerun: Spread | None, expected: bool) -> None:
    assert reproduces(_claim("small", "all_gather_object", "torch", 2.4, 2.0, 3.0), rerun) is expected


def test_verify_docs_reruns_the_command_once_and_passes_claims_that_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = [
        _claim("small", "all_gather_object", "torch", 2.3, 1.9, 2.8),
        _claim("overhead", "all_reduce, 1 element", "torch", 0.85, 0.7, 0.95),
    ]
    calls, bench = _fake_bench(RECORDED)
    assert verify_docs(_claims_file(tmp_path, claims), bench) == 0
    assert len(calls) == 1 and calls[0][:-2] == ARGV  # one rerun for both claims, exactly their command
    out = capsys.readouterr().out
    assert out.count("reproduces ") == 2 and "2 of 2 claims reproduce" in out


def test_verify_docs_fails_on_a_claim_that_does_not_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claims = [
        _claim("small", "all_gather_object", "torch", 2.3, 1.9, 2.8),
        _claim("overhead", "all_reduce, 1 element", "torch", 1.2, 1.1, 1.3),  # claimed ahead; the rerun is behind
        _claim("small", "all_gather_object", "mmengine", 2.0, 1.8, 2.2),  # the rerun has no mmengine
    ]
    _, bench = _fake_bench(RECORDED)
    assert verify_docs(_claims_file(tmp_path, claims), bench) == 1
    out = capsys.readouterr().out
    assert "1 of 3 claims reproduce" in out
    assert "DOES NOT REPRODUCE  overhead all_reduce, 1 element torch/ours, world 2: claimed 1.20x [1.10-1.30]" in out
    assert "rerun not measured" in out


def test_a_failed_rerun_reproduces_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, bench = _fake_bench(RECORDED, code=1)
    assert verify_docs(_claims_file(tmp_path, [_claim("small", "all_gather_object", "torch", 2.3, 1.9, 2.8)]), bench)
    assert "the bench exited 1" in capsys.readouterr().out


def test_bench_verify_docs_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, bench = _fake_bench(RECORDED)
    monkeypatch.setattr(benchmarks.cli, "rerun", bench)
    path = _claims_file(tmp_path, [_claim("small", "all_gather_object", "torch", 2.3, 1.9, 2.8)])
    assert main(["bench", "--verify-docs", str(path), "--timeout", "5400"]) == 0
    assert calls[0][:-2] == [*ARGV, "--timeout", "5400"]  # a loaded machine may need more time: no figure changes


def test_the_plot_is_drawn_from_the_claims(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks.plot import main as plot_main

    out = tmp_path / "plot.png"
    assert plot_main([str(CLAIMS), str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
