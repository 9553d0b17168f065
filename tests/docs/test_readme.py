"""The README's first screen: what, why, the two commands with the venv step, then the example."""

from __future__ import annotations

from doc_snippets import README, ROOT, snippets

# Each command makes a new venv in a directory of its own, so that commands run at once in one
# clone (the same one twice included) never empty or rebuild the venv another runs from.
# The venv's python is named outright: a python that comes first on PATH otherwise (pyenv's, with no
# torch) ran the demo once. Activation still puts the venv's tools (torchrun) on PATH for the tests.
VENV = 'venv=$(mktemp -d) && python3 -m venv "$venv" && . "$venv/bin/activate" && '
PYTHON = '"$venv/bin/python"'
DEMO = VENV + f"{PYTHON} -m pip install torch==2.13.0 && {PYTHON} -m pip install -e . && {PYTHON} -m communicator demo"
TESTS = VENV + (
    f'{PYTHON} -m pip install torch==2.13.0 && {PYTHON} -m pip install -e ".[test,docs,bench]" '
    f"&& {PYTHON} -m pytest -n 3 --dist loadgroup"
)
FIRST_SCREEN = 40  # lines


def _first_bash_block(lines: list[str]) -> list[str]:
    start = lines.index("```bash")
    return lines[start + 1 : lines.index("```", start + 1)]


def test_the_commands_come_first_in_one_block_each_with_the_venv_step() -> None:
    # Each line runs alone on a fresh machine (no torch, Debian's Python refusing pip outside a venv).
    lines = README.read_text(encoding="utf-8").splitlines()
    block = _first_bash_block(lines)
    commands = [line for line in block if not line.startswith("#")]
    assert commands == [DEMO, TESTS]


def test_ci_runs_the_readme_s_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1] == TESTS


def test_the_example_is_on_the_first_screen_and_runs_plain_and_under_torchrun() -> None:
    blocks = snippets(README)
    assert blocks, "the README has no Python example"
    assert blocks[0].line <= FIRST_SCREEN, f"the example starts at line {blocks[0].line}"
    for block in blocks:  # test_snippets.py runs each in every mode its marker names
        assert {"python", "torchrun 2"} <= set(block.modes), f"{block.id} runs as {block.modes}"
