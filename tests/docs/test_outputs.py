"""Sample outputs on the pages are the commands' real output: a ```` ```text ```` block marked

    <!-- output: python -m communicator demo -->

is compared with what that command prints now, numbers and spacing aside (times vary with the
machine), so a sample cannot go stale. ``COMMUNICATOR_REGENERATE_DOCS=1`` writes the fresh output
into the page instead, numbers included: that is how the samples are made.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from doc_snippets import DOCS, ROOT, pages

_MARKER = re.compile(r"^<!--\s*output:\s*(.*?)\s*-->\s*$")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
#: Facts of the machine that made the sample: the rest of such a line is not compared.
_MACHINE = re.compile(r"(host|python) .*$")
REGENERATE = os.environ.get("COMMUNICATOR_REGENERATE_DOCS") == "1"


@dataclass(frozen=True)
class Sample:
    page: Path
    command: str
    first: int  # index of the block's first line (after the fence)
    end: int  # index of the closing fence
    ordinal: int  # the page's how-manyth sample

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.ordinal}"


def samples_of(page: Path) -> list[Sample]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Sample] = []
    for i, line in enumerate(lines[:-1]):
        marker = _MARKER.match(line)
        if marker and lines[i + 1].startswith("```text"):
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            found.append(Sample(page, marker.group(1), i + 2, end, len(found)))
    return found


def samples() -> list[Sample]:
    return [sample for page in pages() for sample in samples_of(page)]


def _shape(text: str) -> list[str]:
    """What a sample must keep: its lines, with numbers, spacing and machine facts masked."""
    lines = [" ".join(_MACHINE.sub(r"\1 ...", _NUMBER.sub("#", line)).split()) for line in text.splitlines()]
    return [line for line in lines if line]


def _run(command: str, tmp_path: Path) -> str:
    words = shlex.split(command)
    assert words[0] == "python", f"a sample's command starts with python: {command}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))}
    environ.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, *words[1:]], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_pages_have_samples() -> None:
    assert {s.command for s in samples()} >= {"python -m communicator demo", "python -m communicator info"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sample", samples(), ids=lambda s: s.id)
def test_sample_output_is_the_commands(sample: Sample, tmp_path: Path) -> None:
    fresh = _run(sample.command, tmp_path)
    sample = samples_of(sample.page)[sample.ordinal]  # where it is now: a sample above may have grown
    lines = sample.page.read_text(encoding="utf-8").splitlines()
    shown = "\n".join(lines[sample.first : sample.end])
    if REGENERATE:
        lines[sample.first : sample.end] = fresh.rstrip("\n").splitlines()
        sample.page.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return
    assert _shape(shown) == _shape(fresh), (
        f"{sample.id}: the sample of `{sample.command}` no longer matches its output; "
        "regenerate with COMMUNICATOR_REGENERATE_DOCS=1"
    )
