"""The demo: the README's main job. Its command, its exit status, and checks that can fail."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

from communicator.cli.demo import EMBEDDING_TOLERANCE, compare, evaluate
from communicator.testing import run_single


def _demo(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "communicator", "demo", *arguments],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _check_lines(output: str) -> dict[str, str]:
    table = output.split("in one process\n", 1)[1].split("\n\n", 1)[0]
    return {line[:36].strip(): line[36:].strip() for line in table.splitlines() if line.strip()}


@pytest.mark.parametrize("arguments", [(), ("--world-size", "3", "--samples", "1001")], ids=["readme", "odd-size"])
def test_the_demo_command_passes_every_check(arguments: tuple[str, ...]) -> None:
    done = _demo(*arguments)
    assert done.returncode == 0, done.stdout + done.stderr
    checks = _check_lines(done.stdout)
    assert len(checks) == 6
    assert set(checks.values()) == {"ok"}, done.stdout
    assert "the distributed answer equals the single-process answer" in done.stdout


def test_compare_names_what_differs() -> None:
    reference = run_single(evaluate, 200)
    ours = copy.deepcopy(reference)
    # Float noise within the tolerance passes; a flipped prediction and a wrong embedding do not.
    ours["records"][3]["embedding"] = ours["records"][3]["embedding"] * (1 + EMBEDDING_TOLERANCE / 10)
    assert not any(compare([ours], reference, 200).values())
    ours["records"][7]["prediction"] = (ours["records"][7]["prediction"] + 1) % 5
    ours["records"][9]["embedding"] = ours["records"][9]["embedding"] + 0.5
    ours["seed"] = reference["seed"] + 1
    other = copy.deepcopy(ours)
    other["seed"] = reference["seed"]
    other["half"] = (1, 50)  # a second half that claims samples the first already covers

    problems = {name: text for name, text in compare([ours, other], reference, 200).items() if text}

    assert set(problems) == {
        "records in dataset order, none lost",
        f"embeddings within {EMBEDDING_TOLERANCE:g}",
        "one seed on every rank",
        "subgroups cover every sample",
    }
    assert problems["records in dataset order, none lost"].startswith("record 7 is (index, label, prediction)")
    assert problems[f"embeddings within {EMBEDDING_TOLERANCE:g}"].startswith("record 9:")


def test_a_mismatch_fails_the_command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from communicator.cli import demo, main

    def lossy(results: object, world: int, cfg: object, args: tuple[int], **kwargs: object) -> list[object]:
        answers = [run_single(evaluate, args[0])]
        answers[0]["records"] = answers[0]["records"][:-1]  # one result lost
        return answers

    monkeypatch.setattr(demo, "launch", lossy)
    assert main(["demo", "--world-size", "1", "--samples", "50"]) == 1
    output = capsys.readouterr().out
    assert "records in dataset order, none lost  FAILED: 49 records, expected 50" in output
    assert output.rstrip().endswith("MISMATCH")
