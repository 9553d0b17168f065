"""The README's first screen: what and why, the two commands, then a before and after."""

from __future__ import annotations

import os
import subprocess

from doc_snippets import README, ROOT, snippets

DEMO = "./run demo"
TESTS = "./run test"
FIRST_SCREEN = 60  # lines: the commands and the communicator's example start within it


def _first_bash_block(lines: list[str]) -> list[str]:
    start = lines.index("```bash")
    return lines[start + 1 : lines.index("```", start + 1)]


def test_the_two_commands_come_first_each_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    block = _first_bash_block(lines)
    assert lines.index("```bash") < 15
    commands = [line.split("#")[0].strip() for line in block]
    assert commands == [DEMO, TESTS]
    assert all(len(line) <= 100 for line in block)


def test_ci_runs_the_readme_s_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1] == TESTS


def test_the_run_script_refuses_an_unknown_command_before_installing() -> None:
    script = ROOT / "run"
    assert os.access(script, os.X_OK)
    for arguments in ([], ["deploy"]):
        done = subprocess.run([str(script), *arguments], capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 2 and "usage: ./run demo | ./run test" in done.stderr, done


def test_the_example_is_on_the_first_screen_and_runs_plain_and_under_torchrun() -> None:
    blocks = snippets(README)
    ours = [block for block in blocks if "from communicator import" in block.code]
    assert ours, "the README has no example with a communicator"
    assert ours[0].line <= FIRST_SCREEN, f"the example starts at line {ours[0].line}"
    for block in ours:  # test_snippets.py runs each in every mode its marker names
        assert {"python", "torchrun 2"} <= set(block.modes), f"{block.id} runs as {block.modes}"
    before = [block for block in blocks if "import torch.distributed as dist" in block.code]
    assert before and "torchrun 2" in before[0].modes  # the before side runs too
