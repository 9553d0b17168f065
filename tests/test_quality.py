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


def _imports_between_modules() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports, anywhere in its code
    (inside functions and ``TYPE_CHECKING`` blocks too)."""
    import ast

    package = ROOT / "communicator"
    modules = {}
    for path in package.rglob("*.py"):
        name = ".".join(("communicator", *path.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def test_the_package_imports_no_module_in_a_circle() -> None:
    graph = _imports_between_modules()
    finished: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            pytest.fail(f"an import cycle: {' -> '.join([*path[path.index(name) :], name])}")
        if name not in finished:
            for imported in sorted(graph[name]):
                visit(imported, [*path, name])
            finished.add(name)

    for module in sorted(graph):
        visit(module, [])


def test_the_private_torch_function_the_groups_patch_still_exists() -> None:
    import torch.distributed.distributed_c10d as c10d

    from communicator.groups import _group_name

    original = c10d._process_group_name
    with _group_name("communicator/test/"):
        assert str(c10d._process_group_name([0, 1], use_hashed_name=False)) == "communicator/test/"
    assert c10d._process_group_name is original  # put back
