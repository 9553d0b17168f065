"""The package is typed (mypy --strict, py.typed) and lint-clean (ruff)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_is_clean() -> None:
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    pytest.importorskip("mypy")
    result = _run(sys.executable, "-m", "mypy")  # settings (strict, the package) in pyproject.toml
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_package_ships_its_type_marker() -> None:
    assert (ROOT / "communicator" / "py.typed").exists()
