"""Every Python code block of the documentation runs (see ``doc_snippets.py`` for how each is run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from doc_snippets import README, ROOT, Snippet, all_snippets, clean_env, pages, snippets, stray_python_fences
from warm_python import WarmPython

from communicator.testing.spawn import free_port

SNIPPETS = [s for s in all_snippets() if not s.is_include]
SCRIPT_TIMEOUT = 240


def page_dir(snippet: Snippet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory for the snippet holding the ``file`` blocks of its page."""
    directory = tmp_path_factory.mktemp(snippet.page.replace("/", "_").removesuffix(".md"))
    for other in snippets(snippet.path):
        for mode in other.modes:
            if mode.startswith("file "):
                (directory / mode.split(None, 1)[1]).write_text(other.code)
    return directory


def run_script(command: list[str], cwd: Path, what: str) -> None:
    result = subprocess.run(
        command, cwd=cwd, env=clean_env(cwd), capture_output=True, text=True, timeout=SCRIPT_TIMEOUT, check=False
    )
    check_exit(result, what)


def check_exit(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        pytest.fail(
            f"{what} exited with {result.returncode}\n--- stdout ---\n{result.stdout[-4000:]}"
            f"\n--- stderr ---\n{result.stderr[-6000:]}"
        )


def run_mode(
    snippet: Snippet, mode: str, directory: Path, monkeypatch: pytest.MonkeyPatch, warm_python: WarmPython
) -> None:
    script = directory / f"snippet_{snippet.line}.py"
    if mode == "exec":
        monkeypatch.chdir(directory)
        monkeypatch.syspath_prepend(str(directory))
        namespace = {"__name__": "__docs__", "__file__": str(script)}
        exec(compile(snippet.code, snippet.id, "exec"), namespace)
    elif mode == "python":
        script.write_text(snippet.code)
        result = warm_python.run([script.name], directory, clean_env(directory), SCRIPT_TIMEOUT)
        check_exit(result, f"python {snippet.id}")
    elif mode.startswith("torchrun "):
        script.write_text(snippet.code)
        env = {**clean_env(directory), "MASTER_PORT": str(free_port())}
        result = warm_python.run([script.name], directory, env, SCRIPT_TIMEOUT, torchrun=int(mode.split()[1]))
        check_exit(result, f"torchrun {snippet.id}")
    elif mode == "pytest":
        test_file = directory / f"test_snippet_{snippet.line}.py"
        test_file.write_text(snippet.code)
        run_script(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "communicator.pytest_plugin",
                "-p",
                "no:cacheprovider",
                "--rootdir",
                str(directory),
                test_file.name,
            ],
            directory,
            f"pytest {snippet.id}",
        )
    elif mode.startswith("file "):
        compile(snippet.code, snippet.id, "exec")  # written by page_dir; it must at least compile
    else:
        raise AssertionError(f"{snippet.id}: unknown test mode {mode!r}")


@pytest.mark.timeout(SCRIPT_TIMEOUT * 2 + 60)
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_snippet_runs(
    snippet: Snippet,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    warm_python: WarmPython,
) -> None:
    if snippet.modes[0].startswith("skip"):
        pytest.skip(f"{snippet.id}: {snippet.modes[0]}")
    directory = page_dir(snippet, tmp_path_factory)
    for mode in snippet.modes:
        run_mode(snippet, mode, directory, monkeypatch, warm_python)


def test_every_page_has_its_blocks_found() -> None:
    """No Python block hides from the extractor (indented, or spelt ```py / ```python3)."""
    stray = {str(page.name): lines for page in [*pages(), README] if (lines := stray_python_fences(page))}
    assert not stray, f"Python fences the snippet tests would not run (use a top-level ```python): {stray}"


def test_runnable_blocks_exist() -> None:
    """The extractor works: the pages hold blocks of each kind."""
    modes = {mode.split()[0] for s in SNIPPETS for mode in s.modes}
    assert {"exec", "python", "torchrun", "pytest"} <= modes, modes
    assert len(SNIPPETS) >= 20


def test_included_examples_exist() -> None:
    """Every ``--8<--`` include names a file that exists (mkdocs would fail too, but later)."""
    for s in all_snippets():
        if s.is_include:
            path = s.code.strip().split(None, 1)[1].strip().strip('"')
            assert (ROOT / path).is_file(), f"{s.id} includes {path}, which does not exist"
