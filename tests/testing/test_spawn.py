"""communicator.launch and communicator.testing: results in rank order, failures with the failing
rank and its traceback, hangs reported with every rank's stack, nothing left running."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from communicator import CommTimeoutError, Communicator, ConfigError, RemoteError, launch
from communicator.launchers.local import free_port
from communicator.testing import run_ranks, run_single


def rank_and_args(comm: Communicator, base: int, extra: str) -> tuple[int, int, str]:
    return comm.rank + base, comm.world_size, extra


@pytest.mark.parametrize("nproc", [1, 2, 3, 4])
def test_results_in_rank_order(nproc: int) -> None:
    assert launch(rank_and_args, nproc, None, (10, "x")) == [(10 + r, nproc, "x") for r in range(nproc)]


def raises_on_rank_one(comm: Communicator) -> int:
    if comm.rank == 1:
        raise ZeroDivisionError("rank one divided by zero")
    comm.barrier()  # released through the failure board when rank 1 leaves
    return comm.rank


def test_a_failure_names_the_rank_and_keeps_its_traceback() -> None:
    start = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        launch(raises_on_rank_one, 3, timeout=60)
    error = caught.value
    assert error.rank == 1 and error.error_type == "ZeroDivisionError" and error.ranks == (1,)
    assert "rank one divided by zero" in str(error)
    assert "raises_on_rank_one" in "".join(getattr(error, "__notes__", []))
    assert time.monotonic() - start < 20


def exits_abruptly(comm: Communicator) -> None:
    if comm.rank == 0:
        os._exit(3)
    comm.all_gather_object("waiting for rank 0")


def test_a_dead_rank_is_reported_with_its_exit_code() -> None:
    with pytest.raises(RemoteError) as caught:
        launch(exits_abruptly, 2, timeout=60)
    died = next(f for f in caught.value.failures if f.rank == 0)
    assert died.error_type == "ProcessDied" and "exited with code 3" in died.message


def hangs_on_rank_one(comm: Communicator) -> None:
    if comm.rank == 1:
        time.sleep(600)


def test_a_hang_fails_in_seconds_with_every_ranks_stack() -> None:
    start = time.monotonic()
    with pytest.raises(CommTimeoutError) as caught:
        launch(hangs_on_rank_one, 2, timeout=3)
    assert time.monotonic() - start < 15
    message = str(caught.value)
    assert "--- rank 1 ---" in message and "hangs_on_rank_one" in message
    assert caught.value.missing_ranks is not None and 1 in caught.value.missing_ranks


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="nproc"):
        launch(rank_and_args, 0)
    with pytest.raises(ConfigError, match="launcher"):
        launch(rank_and_args, 2, {"launcher": "slurm"})


def env_per_rank(comm: Communicator) -> str:
    return os.environ["ROLE"]


def test_environment_per_rank() -> None:
    assert run_ranks(env_per_rank, 2, env=lambda r: {"ROLE": f"r{r}"}) == ["r0", "r1"]


def test_run_single_uses_a_nondist_comm() -> None:
    assert run_single(lambda comm: (type(comm).__name__, comm.world_size)) == ("NonDistComm", 1)


@pytest.mark.world_size(1, 3)
def test_the_pytest_plugin_parametrizes_world_sizes(run, world_size: int) -> None:
    assert run(rank_and_args, 0, "p") == [(r, world_size, "p") for r in range(world_size)]


def test_a_function_that_cannot_travel_is_refused_with_the_rule() -> None:
    def nested(comm: Communicator) -> int:
        return comm.rank

    for fn in (lambda comm: comm.rank, nested):
        with pytest.raises(TypeError, match="defined at the top level of a module"):
            launch(fn, 2)
    with pytest.raises(TypeError, match="args must be picklable"):
        launch(rank_and_args, 2, None, (lambda: 0, "x"))


_UNGUARDED_SCRIPT = """
from communicator import launch

def job(comm):
    return comm.rank

print(launch(job, 2, timeout=60))
"""


def test_a_script_without_a_main_guard_is_told_the_rule(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    # Each rank says what it was doing and the rule; the parent names the dead ranks with the same rule.
    assert f"launch() was called while a rank was importing {script}" in done.stderr
    assert "ProcessDied" in done.stderr and 'if __name__ == "__main__":' in done.stderr


def test_free_ports_lie_below_the_ports_outgoing_connections_take() -> None:
    ports = [free_port() for _ in range(20)]
    try:
        first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except OSError:
        pytest.skip("no ephemeral port range to compare with on this system")
    assert all(10000 <= port < first_ephemeral for port in ports), ports
    assert len(set(ports)) > 1  # drawn at random: processes picking at once rarely meet
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("", ports[0]))  # free on every address, as a store needs it


# What torchrun, srun and mpirun leave in a rank's environment; launch() inside such a rank must
# start a job of its own (torchrun's agent-store flag alone used to make it wait forever).
_ENCLOSING_JOB = {
    "TORCHELASTIC_RUN_ID": "outer",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "ROLE_RANK": "1",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "NODE_RANK": "1",
    "SLURM_JOB_ID": "77",
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_ID": "0",
    "SLURMD_NODENAME": "node7",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "4",
    "PMIX_RANK": "1",
    "PMI_RANK": "1",
    "PMI_SIZE": "4",
    "MV2_COMM_WORLD_RANK": "1",
}


def launcher_environment(comm: Communicator) -> tuple[int, dict[str, str]]:
    kept = {name: os.environ[name] for name in (*_ENCLOSING_JOB, "RANK", "WORLD_SIZE", "KEPT") if name in os.environ}
    return comm.world_size, kept


def test_a_launched_rank_starts_a_job_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**_ENCLOSING_JOB, "RANK": "1", "WORLD_SIZE": "4", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    # spawn: the ranks start from this environment (a fork server started earlier has its own).
    results = launch(launcher_environment, 2, timeout=60, env={"KEPT": "yes"}, start_method="spawn")
    # GROUP_*: the communicator's own, for one node (the enclosing job's two would fail its host check).
    ours = {"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "WORLD_SIZE": "2", "KEPT": "yes"}
    assert results == [(2, {**ours, "RANK": str(r)}) for r in range(2)]
