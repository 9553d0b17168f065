"""The command line itself: a bare command is a usage error that lists what there is to run;
--version names the release; errors go to stderr with a non-zero exit; --help, --version and usage
errors import no torch, while ``import communicator`` registers torch's backend at once."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import communicator
from communicator.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_python_without_torch_is_named_and_handed_to_the_clone_s_run_script(tmp_path: Path) -> None:
    """``python -m communicator`` with a python that cannot import torch: in a clone it runs
    ``./run`` in its place (here ``COMMUNICATOR_RUN`` says ``./run``'s own python is the one
    without torch, so nothing is handed on), and the error names that python; --help needs no torch."""
    (tmp_path / "torch.py").write_text("raise ModuleNotFoundError('no torch here', name='torch')\n")
    environ = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "COMMUNICATOR_RUN": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "communicator", "info"], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "communicator needs torch, which" in done.stderr, done.stderr
    assert (ROOT / "run").exists() and os.access(ROOT / "run", os.X_OK)
    helped = subprocess.run(
        [sys.executable, "-m", "communicator", "--help"], env=environ, capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0 and helped.stdout.startswith("usage: communicator"), helped.stderr


def test_a_python_without_torch_hands_a_command_to_the_clone_s_run_script(tmp_path: Path) -> None:
    """In a clone (here a copy of the package beside a ./run that says what it got), ``python -m
    communicator COMMAND`` with a python without torch runs ./run with the same arguments."""
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "communicator", clone / "communicator", ignore=shutil.ignore_patterns("__pycache__"))
    (clone / "run").write_text('#!/bin/sh\necho "./run got: $*"\n')
    (clone / "run").chmod(0o755)
    (tmp_path / "torch.py").write_text("raise ModuleNotFoundError('no torch here', name='torch')\n")
    environ = {k: v for k, v in os.environ.items() if k != "COMMUNICATOR_RUN"}
    environ["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{clone}"
    done = subprocess.run(  # from tmp_path: python -m puts the working directory first on the path
        [sys.executable, "-m", "communicator", "info", "--launcher", "none"],
        env=environ,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stdout == "./run got: info --launcher none\n", done.stderr
    assert f"{sys.executable} has no torch: running {clone / 'run'} in its place" in done.stderr


# -- what the command line imports ------------------------------------------------------------------------

#: The script pip writes for an entry point ``module:function`` (pip's template).
SCRIPT = """import re
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({function}())
"""


def _console_script(folder: Path) -> Path:
    """The ``communicator`` script pip would install from pyproject.toml's ``[project.scripts]``."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["communicator"]
    module, function = entry.split(":")
    script = folder / "communicator"
    script.write_text(SCRIPT.format(module=module, function=function))
    return script


def _imports(*command: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python -X importtime *command`` from the repository: the result and every module it imported."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *command],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    modules = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return done, modules


@pytest.mark.parametrize("entry", ["module", "script"])
@pytest.mark.parametrize(
    ("arguments", "code", "says"),
    [
        (["--help"], 0, "usage: communicator"),
        (["--version"], 0, f"communicator {communicator.__version__}"),
        (["no-such-command"], 2, "invalid choice: 'no-such-command'"),
        (["--no-such-option"], 2, "unrecognized arguments: --no-such-option"),
        ([], 2, "usage: communicator"),
    ],
)
def test_help_version_and_usage_errors_import_no_torch(
    entry: str, arguments: list[str], code: int, says: str, tmp_path: Path
) -> None:
    command = ["-m", "communicator"] if entry == "module" else [str(_console_script(tmp_path))]
    done, modules = _imports(*command, *arguments)
    assert done.returncode == code, done.stderr[-2000:]
    assert says in (done.stdout if code == 0 else done.stderr)
    assert "communicator.cli" in modules
    assert not {name for name in modules if name == "torch" or name.startswith("torch.")}


@pytest.mark.parametrize("entry", ["module", "script"])
def test_a_command_loads_the_package_and_its_backend(entry: str, tmp_path: Path) -> None:
    command = ["-m", "communicator"] if entry == "module" else [str(_console_script(tmp_path))]
    done, modules = _imports(*command, "info")
    assert done.returncode == 0 and done.stdout.startswith("decision: "), done.stderr[-2000:]
    assert {"torch", "communicator._public", "communicator.transports.backend"} <= modules


def test_an_import_registers_the_backend_at_once(tmp_path: Path) -> None:
    """A plain import, and one inside a package run with ``python -m``, registers the backend at once."""
    check = (
        "import communicator, torch.distributed as dist\n"
        "assert hasattr(dist.Backend, 'COMMUNICATOR'), 'the backend is not registered'\n"
        "assert communicator.Communicator.__name__ == 'Communicator'\n"
    )
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text(check)
    (tmp_path / "trainer" / "__main__.py").write_text("print('trained')\n")
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), str(ROOT)))}
    for command in (["-c", check + "print('trained')"], ["-m", "trainer"]):
        done = subprocess.run(
            [sys.executable, *command], env=environ, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0 and done.stdout == "trained\n", done.stderr[-2000:]
