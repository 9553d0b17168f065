"""The real tools: torchrun, Open MPI's mpirun, MPICH's mpirun.mpich, srun and sbatch.

Under each tool: the launcher probe checks detection against the tool's own variables and joins
a gloo group at the derived address; ``comm_job.py`` checks ``Communicator.create()`` (layout,
``describe()``, a few collectives, the environment restored after the block); and
``communicator check`` runs every collective and must report no FAIL. Skipped where a tool is
missing (``/work/shared/launchers/setup_openmpi.sh --with-mpich`` and ``setup_slurm.sh`` install
them). Every run is bounded by a subprocess timeout.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from communicator.check import CHECKS, DEFAULT_SIZES
from communicator.launchers import LAUNCHERS
from communicator.testing.spawn import free_port

pytestmark = pytest.mark.launchers

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "launcher_scripts"
PROBE = SCRIPTS / "launcher_probe.py"
COMM_JOB = SCRIPTS / "comm_job.py"
# Seconds one launcher run may take (start-up of every rank included).
RUN_TIMEOUT = 120
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


def _mpi_port(settings: dict[str, str] | None = None) -> dict[str, str]:
    """MPI gives no rendezvous port: a free one, or the ranks meet at 29500, where another job on
    the machine (another test suite) may be meeting too."""
    return {**(settings or {}), "MASTER_PORT": str(free_port())}


def test_openmpi_mpirun() -> None:
    version = _tool_output("mpirun", "--version")
    if version is None or "Open MPI" not in version:
        pytest.skip("Open MPI's mpirun is not installed")
    _run_probe(["mpirun", "-np", str(RANKS), sys.executable], "openmpi", _mpi_port(OPENMPI_SETTINGS))


def test_mpich_hydra() -> None:
    if _tool_output("mpirun.mpich", "--version") is None:
        pytest.skip("MPICH's mpirun.mpich is not installed")
    _run_probe(["mpirun.mpich", "-n", str(RANKS), sys.executable], "mpich", _mpi_port())


def test_slurm_srun() -> None:
    _tool("srun")
    _run_probe(["srun", "-N1", f"-n{RANKS}", sys.executable], "slurm")


def test_torchrun() -> None:
    _run_probe(_torchrun(RANKS), "pytorch")


# -- Communicator.create() and `communicator check` under each tool ------------------------------------


def _job_environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment in which the ranks import this checkout's package."""
    environ = _clean_environ()
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    environ["OMP_NUM_THREADS"] = "1"  # the ranks share this machine's cores
    return {**environ, **(extra or {})}


@dataclass(frozen=True)
class Tool:
    """A way to start ranks: ``prefix()`` ends where a script path (or ``-m module``) goes."""

    launcher: str  # the name detect_launcher() gives its ranks
    ranks: int
    missing: Callable[[], str | None]  # why the tool cannot run here, or None
    prefix: Callable[[int], list[str]]
    env: Callable[[], dict[str, str]]


def _no_openmpi() -> str | None:
    version = _tool_output("mpirun", "--version")
    return None if version is not None and "Open MPI" in version else "Open MPI's mpirun is not installed"


def _no_mpich() -> str | None:
    return None if _tool_output("mpirun.mpich", "--version") is not None else "MPICH's mpirun.mpich is not installed"


@functools.cache  # sinfo waits about 10 s for a controller that is not there: asked once a module
def _no_slurm() -> str | None:
    return None if _tool_output("sinfo", "-h", "-o", "%t") else "no running Slurm cluster (srun/sinfo)"


def _torchrun(ranks: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={ranks}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
    ]


TOOLS = {
    "torchrun": Tool("pytorch", 2, lambda: None, _torchrun, dict),
    # MPI does not give a rendezvous port: the ranks read MASTER_PORT from the caller.
    "openmpi": Tool(
        "openmpi",
        2,
        _no_openmpi,
        lambda n: ["mpirun", "-np", str(n), sys.executable],
        lambda: _mpi_port(OPENMPI_SETTINGS),
    ),
    "mpich": Tool(
        "mpich",
        2,
        _no_mpich,
        lambda n: ["mpirun.mpich", "-n", str(n), sys.executable],
        _mpi_port,
    ),
    # Slurm: the port is derived from the job id.
    "srun": Tool("slurm", 2, _no_slurm, lambda n: ["srun", "-N1", f"-n{n}", sys.executable], dict),
    "srun-4": Tool("slurm", 4, _no_slurm, lambda n: ["srun", "-N1", f"-n{n}", sys.executable], dict),
}


def _tool(name: str) -> Tool:
    tool = TOOLS[name]
    reason = tool.missing()
    if reason is not None:
        pytest.skip(reason)
    return tool


def _launch(command: list[str], environ: dict[str, str]) -> tuple[int, str, str]:
    """Run ``command`` (bounded); its exit status, its output, and both with the command line for reports.

    On timeout the whole process group (the tool and any rank it started here) is killed.
    """
    with subprocess.Popen(
        command,
        env=environ,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"{' '.join(command)} ran past {RUN_TIMEOUT} s\nstdout:\n{stdout}\nstderr:\n{stderr}")
    return process.returncode, stdout, f"{' '.join(command)}\nstdout:\n{stdout}\nstderr:\n{stderr}"


def _assert_ok_lines(output: str, launcher: str, ranks: int, report: str) -> None:
    # Some launchers merge the ranks' output streams: find each line wherever it lands.
    found = sorted(re.findall(r"(?:OK|FAIL) rank=\d+ .*", output))
    assert found == [f"OK rank={rank} world={ranks} local_rank={rank} launcher={launcher}" for rank in range(ranks)], (
        report
    )


def _check_rows() -> int:
    return sum(len(DEFAULT_SIZES) if check.sized else 1 for check in CHECKS)


def _assert_check_passed(output: str, launcher: str, ranks: int, report: str) -> None:
    """The table of ``communicator check``: one header, every row passed, nothing failed."""
    results = re.findall(r"^\S.*?\s{2}(?:-|\w+)\s+(pass|FAIL|skip|not run)\s+\d+\.\d+", output, flags=re.MULTILINE)
    assert results == ["pass"] * _check_rows(), report
    assert f"why: {launcher}: rank 0 of {ranks}" in output, report
    assert f"{_check_rows()} passed, 0 failed, 0 skipped on {ranks} rank(s)" in output, report
    assert "check passed" in output and "FAIL" not in output, report


@pytest.mark.parametrize("name", list(TOOLS))
def test_communicator_and_check_in_job(name: str) -> None:
    """``comm_job.py --check``: the communicator against the tool's variables, then every collective."""
    tool = _tool(name)
    command = [*tool.prefix(tool.ranks), str(COMM_JOB), "--launcher", tool.launcher, "--check"]
    code, output, report = _launch(command, _job_environ(tool.env()))
    assert code == 0, report
    _assert_ok_lines(output, tool.launcher, tool.ranks, report)
    _assert_check_passed(output, tool.launcher, tool.ranks, report)


def test_check_command_under_torchrun_module_mode() -> None:
    """``torchrun -m communicator check``: the command itself, started as a module by the tool."""
    tool = _tool("torchrun")
    code, output, report = _launch([*tool.prefix(2), "-m", "communicator", "check", "--repeat", "0"], _job_environ())
    assert code == 0, report
    _assert_check_passed(output, "pytorch", 2, report)


def test_info_names_the_launcher_under_srun() -> None:
    _tool("srun")
    code, output, report = _launch(["srun", "-N1", "-n1", sys.executable, "-m", "communicator", "info"], _job_environ())
    assert code == 0, report
    decision = output.splitlines()[0]
    assert decision.startswith("decision: TorchComm: slurm: rank 0 of 1"), report
    assert decision.endswith("start and own a gloo group"), report
    assert "host: first host of SLURM_STEP_NODELIST" in decision and "port: SLURM_JOB_ID=" in decision, report


def _wait_for_job(job_id: str, limit: float) -> None:
    """Poll ``squeue -h -j ID`` until the job has left the queue; cancel it after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, timeout=30, check=False)
        if queued.returncode != 0 or not queued.stdout.strip():
            return
        time.sleep(0.3)
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30, check=False)
    pytest.fail(f"sbatch job {job_id} was still queued or running after {limit:g} s (cancelled)")


def test_sbatch_job_runs_srun_steps(tmp_path: Path) -> None:
    """The batch shell is one process (NonDistComm); the ``srun`` steps inside it (the job script, then
    ``communicator check`` itself) are the job's ranks."""
    _tool("srun")
    output_file = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=1\n"
        "#SBATCH --ntasks=2\n"
        f"#SBATCH --output={output_file}\n"
        f"#SBATCH --chdir={REPO}\n"
        f"{sys.executable} -m communicator info | head -n 1\n"
        f"srun {sys.executable} {COMM_JOB} --launcher slurm\n"
        'echo "job exit $?"\n'
        f"srun {sys.executable} -m communicator check --timeout 60 --repeat 0\n"
        'echo "check exit $?"\n'
    )
    submitted = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        env=_job_environ(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    _wait_for_job(job_id, RUN_TIMEOUT)
    output = output_file.read_text() if output_file.exists() else ""
    report = f"sbatch job {job_id}:\n{output}"
    assert output.startswith("decision: NonDistComm: no launcher variables found"), report
    assert "job exit 0" in output and "check exit 0" in output, report
    _assert_ok_lines(output, "slurm", 2, report)
    _assert_check_passed(output, "slurm", 2, report)


def test_srun_without_kill_on_bad_exit_lets_the_survivors_shrink_and_go_on() -> None:
    """Slurm lets the others run on after a task dies (``--kill-on-bad-exit=0``): they shrink."""
    _tool("srun")
    command = ["srun", "-N1", "-n3", "--kill-on-bad-exit=0", sys.executable, str(SCRIPTS / "survivor_job.py")]
    code, output, report = _launch(command, _clean_environ())
    survived = sorted(re.findall(r"SURVIVED old=\d+ new=\d+ world=\d+ sum=\S+", output))
    assert survived == ["SURVIVED old=0 new=0 world=2 sum=1", "SURVIVED old=1 new=1 world=2 sum=1"], report
    assert code != 0, report  # srun reports the killed task when the step ends
