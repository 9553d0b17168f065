"""Short jobs under torchrun end cleanly: every rank exits 0, none aborts while the interpreter shuts down;
a job whose ranks fail ends at once.

A communicator left open when the process ends is closed before the interpreter finalises (torch's
groups and stores torn down during finalisation can abort a rank with "terminate called without
an active exception"). Repeated create/close in one job gets a fresh rendezvous each time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from communicator.launchers.local import free_port

REPO = Path(__file__).resolve().parents[2]
SHORT_JOB = REPO / "tests" / "launcher_scripts" / "short_job.py"
MISMATCH_JOB = REPO / "tests" / "launcher_scripts" / "mismatch_job.py"
#: Jobs per style. One in the suite; a race seen once in tens of runs needs many to show: raise
#: ``COMMUNICATOR_TEARDOWN_JOBS`` for a longer hunt (as ``COMMUNICATOR_SOAK_SECONDS`` does the soak's).
JOBS = int(os.environ.get("COMMUNICATOR_TEARDOWN_JOBS", "1"))
JOB_LIMIT = 150  # seconds for one job of 3 ranks, started and ended


def _torchrun(*arguments: str, job: Path = SHORT_JOB) -> tuple[int, str]:
    import subprocess

    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=3",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(job), *arguments,
    ]  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_"))}
    environ.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=JOB_LIMIT, check=False)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.timeout(JOBS * JOB_LIMIT)  # each job has its own bound; on a busy machine one takes a minute
@pytest.mark.parametrize(
    "style",
    [["--cycles", "5"], ["--no-close"]],
    ids=["closed-after-five-create-close-cycles", "left-open"],
)
def test_short_jobs_end_cleanly(style: list[str]) -> None:
    for job in range(JOBS):
        code, output = _torchrun(*style)
        assert code == 0 and "terminate called" not in output, f"job {job}:\n{output[-3000:]}"
        assert "ok on 3 ranks" in output


def test_a_job_whose_ranks_hit_a_mismatch_ends_long_before_its_timeout() -> None:
    # Operations abandoned in gloo block its worker threads until gloo's own timeout (600 s here),
    # and a group's destructor would wait for them: the job must end anyway, every rank raising.
    code, output = _torchrun(job=MISMATCH_JOB)
    assert code != 0 and "terminate called" not in output, output[-3000:]
    for rank in range(3):
        assert f"rank {rank}: CollectiveMismatchError: ranks are in different collectives" in output, output[-3000:]
