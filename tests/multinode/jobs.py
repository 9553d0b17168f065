"""Run launchers on the hosts, bounded: every process's output comes back, and nothing outlives a run.

:func:`run_on` starts one command per (host, argv) at once (torchrun runs one agent per host),
waits for all of them up to a deadline, and returns each one's exit status and output. On the
deadline it kills every process of the run: the commands' process groups and every process whose
environment carries the run's marker (ranks that Slurm's daemons started, remote Open MPI
daemons), then fails with the output of every command so far.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hosts import JOB_VARIABLE, Host, Network, kill_all, marked_processes

from communicator.launchers import LAUNCHERS

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
JOB = HERE / "multinode_job.py"
# After one command of a run failed, the others get this long to finish (a torchrun agent whose
# peer failed would wait minutes in its exit barrier).
GRACE_SECONDS = 20
# Open MPI refuses root and more ranks than cores unless told (as setup_openmpi.sh's env file does).
OPENMPI_SETTINGS = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none",
}
_runs = itertools.count(1)


class RunTimeout(AssertionError):
    """A run passed its deadline; the message holds every command's output."""


@dataclass(frozen=True)
class Finished:
    host: str
    argv: Sequence[str]
    returncode: int
    stdout: str
    stderr: str

    def report(self) -> str:
        return (
            f"--- on {self.host}: {' '.join(self.argv)} (exit {self.returncode})\n"
            f"stdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        )


def report(finished: Sequence[Finished]) -> str:
    return "\n".join(item.report() for item in finished)


def clean_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any launcher's variables, importing this checkout."""
    launcher_variables = {name for launcher in LAUNCHERS for name in launcher.variables}
    environ = {
        name: value
        for name, value in os.environ.items()
        if name not in launcher_variables
        and not name.startswith(("SLURM_", "OMPI_", "PMI_", "MV2_", "TORCHELASTIC_", "COMMUNICATOR_", "GLOO_"))
    }
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    environ["OMP_NUM_THREADS"] = "1"  # the ranks share this machine's cores
    return {**environ, **(extra or {})}


def run_on(
    network: Network,
    commands: Sequence[tuple[Host, Sequence[str]]],
    environ: Mapping[str, str],
    timeout: float,
) -> list[Finished]:
    """Run each ``(host, argv)`` at the same time; every one's exit status and output.

    Once one command has failed, the others are killed after ``GRACE_SECONDS`` (and reported with
    the status -9); a run that passes ``timeout`` raises :class:`RunTimeout`.
    """
    job = f"{network.prefix}-run{next(_runs)}"
    env = network.environ(environ, job)
    processes: list[tuple[Host, Sequence[str], subprocess.Popen[bytes], Path, Path]] = []
    with tempfile.TemporaryDirectory(dir=network.workdir) as outputs:
        try:
            for index, (host, argv) in enumerate(commands):
                out, err = Path(outputs, f"{index}.out"), Path(outputs, f"{index}.err")
                with out.open("wb") as stdout, err.open("wb") as stderr:
                    process = subprocess.Popen(
                        host.command(argv),
                        env=env,
                        cwd=REPO,
                        stdin=subprocess.DEVNULL,
                        stdout=stdout,
                        stderr=stderr,
                        start_new_session=True,
                    )
                processes.append((host, argv, process, out, err))
            deadline = time.monotonic() + timeout
            while any(process.poll() is None for _, _, process, _, _ in processes) and time.monotonic() < deadline:
                if any(process.poll() for _, _, process, _, _ in processes):  # one failed: the rest get a grace
                    deadline = min(deadline, time.monotonic() + GRACE_SECONDS)
                time.sleep(0.1)
            late = [process for _, _, process, _, _ in processes if process.poll() is None]
            failed = any(process.returncode for _, _, process, _, _ in processes if process.returncode is not None)
        finally:
            _stop(processes, job)
        finished = [
            Finished(
                host.name, argv, process.returncode, out.read_text(errors="replace"), err.read_text(errors="replace")
            )
            for host, argv, process, out, err in processes
        ]
    if late and not failed:
        raise RunTimeout(
            f"the run passed {timeout:g} s and was killed; the output of every command:\n" + report(finished)
        )
    return finished


def _stop(processes: Sequence[tuple[Host, Sequence[str], subprocess.Popen[bytes], Path, Path]], job: str) -> None:
    """Kill what is still running: each command's process group, then anything carrying the run's marker."""
    for _, _, process, _, _ in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    deadline = time.monotonic() + 20
    while (left := marked_processes(JOB_VARIABLE, job)) and time.monotonic() < deadline:
        kill_all(left)
        time.sleep(0.1)
