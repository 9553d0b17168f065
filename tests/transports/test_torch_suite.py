"""torch's own distributed test suite (``DistributedTest._DistTestBase``, which torch's
test_distributed_spawn.py runs for gloo and NCCL) passes through the ``"communicator"`` backend.

Every run: a fast subset (``torch_suite_driver.QUICK``), each test on 2 new ranks whose default
group is the communicator's. With ``COMMUNICATOR_TORCH_SUITE=full``: the whole applicable set on
2 and 3 ranks, whose counts are printed; it fails on a failure that ``KNOWN_FAILURES`` does not
explain. The same runs without pytest: ``python tests/transports/torch_suite_driver.py [--world-size 3]``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DRIVER = Path(__file__).with_name("torch_suite_driver.py")
ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("COMMUNICATOR_TORCH_SUITE", "").strip().lower() == "full"


def _driver_module() -> Any:
    """The driver's lists (QUICK ...), without what it does on import for a rank (nothing, here)."""
    spec = importlib.util.spec_from_file_location("_torch_suite_driver_lists", DRIVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_driver(tmp_path: Path, *args: str, limit: float) -> tuple[dict[str, Any], str]:
    """Run the driver in a session of its own, killed whole if it outlives ``limit`` seconds; its
    JSON report and the end of its output."""
    report, log = tmp_path / "suite.json", tmp_path / "suite.log"
    command = [sys.executable, str(DRIVER), "--json", str(report), *args]
    with log.open("wb") as output:
        process = subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the driver, its forkserver and any ranks left
            process.wait()
    tail = log.read_text(errors="replace")[-6000:]
    if not report.exists():
        pytest.fail(f"{' '.join(command)} wrote no report (exit {process.returncode}); its output ends:\n{tail}")
    return json.loads(report.read_text()), tail


def _problems(outcomes: dict[str, Any], allowed: set[str]) -> dict[str, str]:
    return {
        name: entry.get("error") or entry.get("reason") or ""
        for name, entry in sorted(outcomes.items())
        if entry["outcome"] not in allowed
    }


#: The quick run's bound: about 2.5 s a test on a quiet 2-core machine, 8.6 s at load 20; each
#: test also has its own 60 s, so a hang fails in a minute whatever the deadline.
QUICK_DEADLINE = 20 * len(_driver_module().QUICK)


@pytest.mark.timeout(QUICK_DEADLINE + 120)
def test_quick_subset_passes(tmp_path: Path) -> None:
    quick = _driver_module().QUICK
    deadline = str(QUICK_DEADLINE)
    result, tail = run_driver(tmp_path, "--quick", "--timeout", "60", "--deadline", deadline, limit=QUICK_DEADLINE + 60)
    outcomes = result["tests"]
    assert sorted(outcomes) == sorted(quick), tail
    failed = _problems(outcomes, {"passed"})
    assert not failed, f"{result['summary']}\n" + "\n".join(f"{n}: {why}" for n, why in failed.items())


@pytest.mark.skipif(not FULL, reason="the whole applicable set runs with COMMUNICATOR_TORCH_SUITE=full")
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("world_size", [2, 3])
def test_full_applicable_set(tmp_path: Path, world_size: int, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--world-size", str(world_size), "--timeout", "120", "--deadline", "1200")
    result, tail = run_driver(tmp_path, *args, limit=1400)
    outcomes = result["tests"]
    failures = {n: e for n, e in outcomes.items() if e["outcome"] == "failed"}
    with capsys.disabled():
        print(f"\ntorch's distributed suite, communicator backend, world size {world_size}: {result['summary']}")
        for name, entry in sorted(failures.items()):
            print(f"  FAILED {name}: {entry['error']}\n    cause: {entry['known'] or 'unknown'}")
    unknown = {n: e["error"] for n, e in failures.items() if not e["known"]}
    assert not unknown, "failures with no known cause:\n" + "\n".join(f"{n}: {why}" for n, why in unknown.items())
    assert not _problems(outcomes, {"passed", "skipped", "failed"}), f"{result['summary']}\n{tail}"
