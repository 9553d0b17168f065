"""The launcher probe under the real tools: each rank checks detection against the tool's own
variables and joins a gloo group at the derived address. Skipped where a tool is missing
(``/work/shared/launchers/setup_openmpi.sh --with-mpich`` and ``setup_slurm.sh`` install them)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from communicator.launchers import LAUNCHERS

pytestmark = pytest.mark.launchers

PROBE = Path(__file__).resolve().parents[1] / "launcher_scripts" / "launcher_probe.py"
RANKS = 2
# Open MPI refuses root and more ranks than cores unless told (as setup_openmpi.sh's env file does).
OPENMPI_SETTINGS = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none",
}


def _clean_environ() -> dict[str, str]:
    """This process's environment without any launcher's variables, so only the tool sets them."""
    launcher_variables = {name for launcher in LAUNCHERS for name in launcher.variables}
    return {
        name: value
        for name, value in os.environ.items()
        if name not in launcher_variables and not name.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))
    }


def _tool_output(*command: str) -> str | None:
    """The output of a quick command, or None when it is missing or fails."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout + done.stderr if done.returncode == 0 else None


def _run_probe(prefix: list[str], launcher: str, extra_env: dict[str, str] | None = None) -> None:
    """``prefix`` ends with what runs a Python script (the interpreter, or torchrun itself)."""
    command = [*prefix, str(PROBE), "--expect-launcher", launcher, "--rendezvous"]
    done = subprocess.run(
        command,
        env={**_clean_environ(), **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    report = f"{' '.join(command)}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, report
    # Some launchers merge the ranks' output streams: find each report wherever it lands.
    ok_lines = sorted(re.findall(r"OK rank=\d+ world=\d+ local_rank=\d+ launcher=[a-z]+", done.stdout))
    assert ok_lines == [
        f"OK rank={rank} world={RANKS} local_rank={rank} launcher={launcher}" for rank in range(RANKS)
    ], report


def test_openmpi_mpirun() -> None:
    version = _tool_output("mpirun", "--version")
    if version is None or "Open MPI" not in version:
        pytest.skip("Open MPI's mpirun is not installed")
    _run_probe(["mpirun", "-np", str(RANKS), sys.executable], "openmpi", OPENMPI_SETTINGS)


def test_mpich_hydra() -> None:
    if _tool_output("mpirun.mpich", "--version") is None:
        pytest.skip("MPICH's mpirun.mpich is not installed")
    _run_probe(["mpirun.mpich", "-n", str(RANKS), sys.executable], "mpich")


def test_slurm_srun() -> None:
    if not _tool_output("sinfo", "-h", "-o", "%t"):
        pytest.skip("no running Slurm cluster (srun/sinfo)")
    _run_probe(["srun", "-N1", f"-n{RANKS}", sys.executable], "slurm")


def test_torchrun() -> None:
    _run_probe([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={RANKS}"], "pytorch")
