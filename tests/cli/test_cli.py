"""The command line itself: a bare command lists what there is to run; --version names the release."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import communicator
from communicator.cli import COMMANDS


def _cli(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "communicator", *arguments], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_bare_command_prints_the_commands() -> None:
    done = _cli()
    assert done.returncode == 0, done.stderr
    for name, summary in COMMANDS.items():
        assert name in done.stdout and summary.split()[0] in done.stdout


def test_version_is_the_installed_release() -> None:
    done = _cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"communicator {communicator.__version__}"
    assert communicator.__version__ == importlib.metadata.version("communicator")
