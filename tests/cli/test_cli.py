"""The command line itself: a bare command is a usage error that lists what there is to run;
--version names the release; errors go to stderr with a non-zero exit."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import communicator
from communicator.cli import COMMANDS


def _cli(*arguments: str, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "communicator", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **environ},
    )


def test_a_bare_command_prints_usage_and_exits_2() -> None:
    done = _cli()
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.startswith("usage: communicator")
    for name, summary in COMMANDS.items():
        assert name in done.stderr and summary.split()[0] in done.stderr


def test_errors_go_to_stderr_with_a_non_zero_exit() -> None:
    bad_configuration = _cli("info", COMMUNICATOR_LAUNCHER="no-such-launcher")
    assert bad_configuration.returncode == 2 and bad_configuration.stdout == ""
    assert "no-such-launcher" in bad_configuration.stderr
    bad_argument = _cli("demo", "--world-size", "0")
    assert bad_argument.returncode == 2 and bad_argument.stdout == ""
    assert "--world-size" in bad_argument.stderr
    unknown = _cli("no-such-command")
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr


def test_version_is_the_installed_release() -> None:
    done = _cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"communicator {communicator.__version__}"
    assert communicator.__version__ == importlib.metadata.version("communicator")


def test_a_python_without_torch_is_named() -> None:
    # torch hidden from this interpreter, as in an environment that never installed it
    hidden = "import sys, runpy; sys.modules['torch'] = None; sys.argv[1:] = ['info']; runpy.run_module('communicator')"
    done = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: communicator needs torch") and sys.executable in last, last


def test_a_python_without_torch_is_named_and_handed_to_the_clone_s_run_script(tmp_path) -> None:
    """``python -m communicator`` with a python that cannot import torch: in a clone it runs
    ``./run`` in its place (here ``COMMUNICATOR_RUN`` says ``./run``'s own python is the one
    without torch, so nothing is handed on), and the error names that python."""
    import pathlib

    (tmp_path / "torch.py").write_text("raise ModuleNotFoundError('no torch here', name='torch')\n")
    root = pathlib.Path(__file__).resolve().parents[2]
    environ = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}", "COMMUNICATOR_RUN": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "communicator", "info"], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "communicator needs torch, which" in done.stderr, done.stderr
    assert (root / "run").exists() and os.access(root / "run", os.X_OK)
