"""The programs in docs/examples/ run and pass their own checks; the docs build strictly."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from doc_snippets import DOCS, ROOT, clean_env, pages
from test_snippets import check_exit
from warm_python import WarmPython

from communicator.testing.spawn import free_port

EXAMPLES = sorted((DOCS / "examples").glob("*.py"))
EXAMPLE_TIMEOUT = 300
REQUIRED = {"train_ddp.py", "evaluate.py", "subgroups.py", "unit_test_module.py"}


def run(command: list[str], cwd: Path, timeout: float = EXAMPLE_TIMEOUT) -> subprocess.CompletedProcess[str]:
    env = clean_env(ROOT)
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's banner about its future, not about these docs
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited with {result.returncode}\n--- stdout ---\n{result.stdout[-4000:]}"
            f"\n--- stderr ---\n{result.stderr[-6000:]}"
        )
    return result


def test_the_examples_are_there() -> None:
    assert {p.name for p in EXAMPLES} >= REQUIRED


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_shape(path: Path) -> None:
    """Each example has main() and a __main__ guard, and a page shows it."""
    tree = ast.parse(path.read_text())
    assert any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body), (
        f"{path.name}: no main()"
    )
    assert 'if __name__ == "__main__":' in path.read_text(), f"{path.name}: no __main__ guard"
    relative = f"docs/examples/{path.name}"
    assert any(relative in page.read_text() for page in pages()), f"no page mentions {relative}"


@pytest.mark.timeout(EXAMPLE_TIMEOUT + 60)
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path, tmp_path: Path, warm_python: WarmPython) -> None:
    """Run as a user would: ``python docs/examples/NAME.py`` (in a warm interpreter, see
    ``warm_python.py``); the example asserts its own answer."""
    result = warm_python.run([str(path)], tmp_path, clean_env(ROOT), EXAMPLE_TIMEOUT)
    check_exit(result, f"python {path.name}")
    assert result.stdout.strip(), f"{path.name} printed nothing"


@pytest.mark.timeout(EXAMPLE_TIMEOUT + 60)
def test_train_ddp_under_torchrun(tmp_path: Path, warm_python: WarmPython) -> None:
    """The DDP example also runs with each process one rank of a launcher's job (torchrun's, see
    ``warm_python.py``)."""
    env = {**clean_env(ROOT), "MASTER_PORT": str(free_port())}
    result = warm_python.run([str(DOCS / "examples" / "train_ddp.py")], tmp_path, env, EXAMPLE_TIMEOUT, torchrun=2)
    check_exit(result, "torchrun train_ddp.py")
    assert "in one process" in result.stdout


@pytest.mark.timeout(EXAMPLE_TIMEOUT + 60)
def test_unit_test_module_under_pytest(tmp_path: Path) -> None:
    """The page says the example's tests can be collected by pytest."""
    result = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(DOCS / "examples" / "unit_test_module.py"),
        ],
        cwd=tmp_path,
    )
    assert "3 passed" in result.stdout


@pytest.mark.timeout(180)
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[docs]')")
    result = run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=tmp_path,
        timeout=170,
    )
    assert (tmp_path / "site" / "api" / "index.html").is_file()
    assert "WARNING -" not in result.stderr, result.stderr  # strict mode already fails on them
    # Long code lines wrap on a narrow screen (docs/about.md: how to look at it in a browser)
    assert "white-space: pre-wrap" in (tmp_path / "site" / "stylesheets" / "extra.css").read_text()
    assert "stylesheets/extra.css" in (tmp_path / "site" / "quickstart" / "index.html").read_text()
