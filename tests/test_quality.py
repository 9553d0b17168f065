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


#: The modules at the top of the package: the spec and what every call runs through. Everything else
#: lives in a folder of its own (docs/custom.md's "Where things are" says which).
TOP = {
    "__init__",
    "__main__",
    "_public",  # the public names, loaded by __init__ at once, or on first use by the command line
    "arguments",
    "base",
    "config",
    "crosscheck",
    "dist",
    "errors",
    "factory",
    "fingerprints",
    "guard",
    "handles",
    "pytest_plugin",
    "reductions",
    "startup",
    "version",
}
#: Lines of code (docstrings, comments and blank lines aside) a module may hold.
MAX_CODE_LINES = 500


def test_the_top_of_the_package_holds_only_the_agreed_modules() -> None:
    top = {path.stem for path in (ROOT / "communicator").glob("*.py")}
    assert top == TOP, f"not agreed: {sorted(top - TOP)}; gone: {sorted(TOP - top)}"


def _room(module: str) -> str:
    """A top-level module is a room of its own; a folder is one room, whatever it holds."""
    return ".".join(module.split(".")[:2])


def test_no_room_imports_upward() -> None:
    """Rooms import each other without a circle, so each sits on a floor below all that import it;
    and nothing inside the package imports the package itself (its ``__init__`` imports them), but
    the command line, which loads it."""
    rooms: dict[str, set[str]] = {}
    for name, imported in _imports_between_modules().items():
        # the command line loads the package's public names itself (so that --help needs no torch)
        itself = name in ("communicator", "communicator.cli")
        assert "communicator" not in imported or itself, f"{name} imports the package itself"
        rooms.setdefault(_room(name), set()).update(_room(i) for i in imported if _room(i) != _room(name))
    floor: dict[str, int] = {}

    def depth(room: str, path: tuple[str, ...]) -> int:
        if room in path:
            pytest.fail(f"rooms import each other in a circle: {' -> '.join([*path[path.index(room) :], room])}")
        if room not in floor:
            floor[room] = 1 + max((depth(r, (*path, room)) for r in rooms.get(room, ())), default=0)
        return floor[room]

    for room in sorted(rooms):
        depth(room, ())
    assert floor["communicator.base"] > floor["communicator.ops"] > floor["communicator.guard"]
    assert floor["communicator.transports"] > floor["communicator.base"]


def _code_lines(path: Path) -> int:
    import ast
    import io
    import tokenize

    text = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skipped:
            lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docstrings)
    return len(lines)


def test_no_module_is_over_the_size_limit() -> None:
    sizes = {str(p.relative_to(ROOT)): _code_lines(p) for p in sorted((ROOT / "communicator").rglob("*.py"))}
    assert sizes["communicator/base.py"] > 100  # the count sees code
    over = {name: size for name, size in sizes.items() if size > MAX_CODE_LINES}
    assert not over, f"split these modules (lines of code over {MAX_CODE_LINES}): {over}"


def test_the_machinery_cannot_be_overridden() -> None:
    """A subclass that defines a name of the machinery every operation shares is refused at class
    creation: it would silently lose failure signalling."""
    from communicator import Communicator
    from communicator.base import MACHINERY

    assert {"_wait", "_await", "_start", "_plane", "_complete"} <= MACHINERY
    with pytest.raises(TypeError, match="_wait"):
        type("Sloppy", (Communicator,), {"_wait": lambda self, works, timeout=None: None})


def test_the_private_torch_function_the_groups_patch_still_exists() -> None:
    import torch.distributed.distributed_c10d as c10d

    from communicator.transports.groups import _group_name

    original = c10d._process_group_name
    with _group_name("communicator/test/"):
        assert str(c10d._process_group_name([0, 1], use_hashed_name=False)) == "communicator/test/"
    assert c10d._process_group_name is original  # put back


def test_the_public_names_are_one_list_in_two_places() -> None:
    """``__init__`` names them without importing torch (the command line's ``--help``);
    ``_public`` imports them, its ``__all__`` the explicit re-export mypy's strict mode needs."""
    import communicator
    from communicator import _public

    assert set(communicator.__all__) - {"__version__"} == set(_public.__all__)
