"""Find the Python code blocks of the documentation pages (and the README) and say how each one is run.

A block is a fenced ```` ```python ```` block that starts at the beginning of a line. An HTML
comment on the line just before the fence (invisible on the rendered page) chooses how it runs::

    <!-- test: python -->              run as a script (as __main__ of a warm interpreter: warm_python.py)
    <!-- test: torchrun 2 -->          run as a script under torchrun with 2 ranks
    <!-- test: python, torchrun 2 -->  both
    <!-- test: pytest -->              run as a test file by pytest, with the plugin enabled
    <!-- test: file helpers.py -->     write it to helpers.py for the page's later blocks; not run
    <!-- test: skip: <reason> -->     not run (for what cannot run here)

Without a marker, a block with an ``if __name__ == "__main__":`` guard runs as a script (it
starts local ranks, which must import the script), and any other block runs in the test process.
A block that only includes an example file (``--8<-- "docs/examples/..."``) is not run here:
``test_examples.py`` runs the examples.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from communicator.launchers import launcher_variables

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

_MARKER = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^```(\S*)")
_GUARD = re.compile(r'^if __name__ == ["\']__main__["\']:', re.MULTILINE)


@dataclass(frozen=True)
class Snippet:
    page: str  # relative to docs/; the README's is "README.md"
    line: int  # 1-based line of the opening fence
    code: str
    modes: tuple[str, ...]  # "exec", "python", "torchrun N", "pytest", "file NAME", "skip: ..."

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def path(self) -> Path:
        """The file the block is in."""
        return README if self.page == README.name else DOCS / self.page

    @property
    def is_include(self) -> bool:
        return self.code.strip().startswith("--8<--")


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)


def _modes(marker: str | None, code: str) -> tuple[str, ...]:
    if marker is not None:
        return tuple(part.strip() for part in marker.split(",")) if not marker.startswith("skip") else (marker,)
    return ("python",) if _GUARD.search(code) else ("exec",)


def snippets(page: Path) -> list[Snippet]:
    """Every top-level ```python block of ``page``, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Snippet] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        language, start = fence.group(1), i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        if language == "python":
            marker = _MARKER.match(lines[start - 1]) if start > 0 else None
            code = "\n".join(lines[start + 1 : end]) + "\n"
            name = page.name if page == README else str(page.relative_to(DOCS))
            found.append(Snippet(name, start + 1, code, _modes(marker.group(1) if marker else None, code)))
        i = end + 1
    return found


def all_snippets() -> list[Snippet]:
    """The blocks of every page, and of the README: its example is the first code a reader runs."""
    return [s for page in [*pages(), README] for s in snippets(page)]


def stray_python_fences(page: Path) -> list[int]:
    """Lines of indented or differently spelt Python fences, which the extractor would miss."""
    stray = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.lstrip()
        fence = _FENCE.match(stripped)
        if fence is None or fence.group(1) in ("", "text", "bash", "console", "mermaid", "toml", "yaml", "ini"):
            continue
        if fence.group(1) in ("py", "python3", "pycon") or (fence.group(1) == "python" and line != stripped):
            stray.append(number)
    return stray


def clean_env(extra_path: Path) -> dict[str, str]:
    """The environment a script of the docs runs in: ``extra_path`` and the clone importable."""
    # Neither an enclosing job's launcher variables nor a configuration may leak into the runs.
    dropped = set(launcher_variables())
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("COMMUNICATOR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(extra_path), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    return env
