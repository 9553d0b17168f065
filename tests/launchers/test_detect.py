"""Launcher detection from environment tables: every launcher, mixed MPI + Slurm, forced launchers,
malformed variables, derived ports and hosts, and configuration overrides.

Several tables are the exact variables that the real tools set (Open MPI 4.1, MPICH 4 Hydra,
Slurm 22.05, torchrun from torch 2.x), trimmed to the ones the launchers read.
"""

from __future__ import annotations

import pytest

from communicator.errors import ConfigError
from communicator.launchers import (
    LAUNCHERS,
    LauncherEnv,
    MPICHEnv,
    MVAPICHEnv,
    OpenMPIEnv,
    SlurmEnv,
    Topology,
    TorchrunEnv,
    describe_environment,
    detect_launcher,
    launcher_names,
    launcher_variables,
)
from communicator.launchers.mpi import DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT
from communicator.launchers.slurm import PORT_BASE, PORT_SPAN, expand_tasks_per_node

Env = dict[str, str]

# --- What the real tools set (rank 1 of 2 on one node "vm") -----------------------------------

TORCHRUN: Env = {
    "TORCHELASTIC_RUN_ID": "80665df9",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "ROLE_RANK": "1",
    "MASTER_ADDR": "localhost",
    "MASTER_PORT": "39099",
}
OPENMPI: Env = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "PMIX_RANK": "1",
}
MPICH: Env = {"PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
SRUN: Env = {
    "SLURM_JOB_ID": "2",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_NNODES": "1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_NODELIST": "vm",
    "SLURM_JOB_NODELIST": "vm",
    "SLURM_STEP_NODELIST": "vm",
}
# The shell of `sbatch -n2 job.sh`: task-like variables, but no step.
SBATCH_SHELL: Env = {
    "ENVIRONMENT": "BATCH",
    "SLURM_JOB_ID": "3",
    "SLURM_PROCID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NNODES": "1",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_NODELIST": "vm",
    "SLURM_JOB_NODELIST": "vm",
}
# An `salloc -n2` shell: an allocation, no task.
SALLOC_SHELL: Env = {"SLURM_JOB_ID": "5", "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_NODELIST": "vm"}
# `mpirun -np 2` inside that batch script: the ranks keep the batch shell's Slurm variables.
MPIRUN_IN_SBATCH: Env = {**SBATCH_SHELL, **OPENMPI, "SLURM_JOB_ID": "4"}
# `mpirun.mpich -n 2` inside it: Hydra starts its proxy as a one-task step, so each rank also
# looks like task 0 of a Slurm step.
HYDRA_IN_SBATCH: Env = {
    **SBATCH_SHELL,
    **MPICH,
    "SLURM_JOB_ID": "4",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
    "SLURM_STEP_NODELIST": "vm",
}

# --- Multi-node layouts ------------------------------------------------------------------------

# Rank 5 of 8 on the second of two nodes, started by `mpirun` inside an allocation of gpu[03-04]:
# the remote node's ranks inherit the Slurm step that launched Open MPI's daemon there.
OPENMPI_TWO_NODES_IN_SLURM: Env = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu[03-04]",
    "SLURM_NODELIST": "gpu[03-04]",
    "SLURM_NTASKS": "8",
    "SLURM_PROCID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_NODELIST": "gpu04",
}
# `srun --mpi=pmi2 -N2 -n8` on nodes n[2-3] of a job on n[1-3]: PMI variables without local ones.
SRUN_PMI2_TWO_NODES: Env = {
    "PMI_RANK": "5",
    "PMI_SIZE": "8",
    "PMI_FD": "11",
    "SLURM_JOB_ID": "123",
    "SLURM_STEP_ID": "1",
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_STEP_NODELIST": "n[2-3]",
    "SLURM_JOB_NODELIST": "n[1-3]",
}
# Task 6 of 7 on the last of four nodes of an uneven step.
SRUN_UNEVEN: Env = {
    "SLURM_JOB_ID": "40000",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "6",
    "SLURM_NTASKS": "7",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "3",
    "SLURM_NNODES": "4",
    "SLURM_TASKS_PER_NODE": "2(x3),1",
    "SLURM_NODELIST": "gpu-a[1-4]",
}
TORCHRUN_TWO_NODES: Env = {
    "TORCHELASTIC_RUN_ID": "job",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29400",
}
# `srun --ntasks-per-node=1 torchrun ...`: the agent's Slurm task variables reach the workers.
TORCHRUN_UNDER_SRUN: Env = {
    **TORCHRUN_TWO_NODES,
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NODELIST": "node[0-1]",
}

# name, rank, world, local rank, local size, node rank, nodes, master addr, master port
Layout = tuple[str, int, int, int, int, int, int, str, int]


def layout(env: LauncherEnv) -> Layout:
    return (
        env.name,
        env.rank,
        env.world_size,
        env.local_rank,
        env.local_size,
        env.node_rank,
        env.num_nodes,
        env.master_addr,
        env.master_port,
    )


def slurm_port(job_id: int) -> int:
    return 15000 + job_id % 17000


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(TORCHRUN, ("pytorch", 1, 2, 1, 2, 0, 1, "localhost", 39099), id="torchrun"),
        pytest.param(TORCHRUN_TWO_NODES, ("pytorch", 3, 4, 1, 2, 1, 2, "node0", 29400), id="torchrun-two-nodes"),
        pytest.param(
            {"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "h", "MASTER_PORT": "1234"},
            ("pytorch", 2, 3, 2, 3, 0, 1, "h", 1234),
            id="by-hand-single-node",
        ),
        pytest.param(
            {"RANK": "5", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            ("pytorch", 5, 6, 1, 2, 2, 3, "h", 1),
            id="by-hand-derived-node",
        ),
        pytest.param(
            {"RANK": "4", "WORLD_SIZE": "5", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "2"},
            ("pytorch", 4, 5, 0, 2, 2, 3, "h", 2),
            id="by-hand-partial-last-node",
        ),
        pytest.param(
            {
                "RANK": "3",
                "WORLD_SIZE": "4",
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "NODE_RANK": "1",
                "MASTER_ADDR": "h",
                "MASTER_PORT": "3",
            },
            ("pytorch", 3, 4, 1, 2, 1, 2, "h", 3),
            id="by-hand-node-rank",
        ),
        pytest.param(
            OPENMPI,
            ("openmpi", 1, 2, 1, 2, 0, 1, DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT),
            id="openmpi",
        ),
        pytest.param(MPICH, ("mpich", 1, 2, 1, 2, 0, 1, DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT), id="mpich"),
        pytest.param(
            {"PMI_RANK": "3", "PMI_SIZE": "4"},
            ("mpich", 3, 4, 3, 4, 0, 1, DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT),
            id="pmi-without-local-variables",
        ),
        pytest.param(
            {
                "MV2_COMM_WORLD_RANK": "6",
                "MV2_COMM_WORLD_SIZE": "8",
                "MV2_COMM_WORLD_LOCAL_RANK": "2",
                "MV2_COMM_WORLD_LOCAL_SIZE": "4",
                "MASTER_ADDR": "head",
            },
            ("mvapich", 6, 8, 2, 4, 1, 2, "head", DEFAULT_MASTER_PORT),
            id="mvapich-two-nodes",
        ),
        pytest.param(SRUN, ("slurm", 1, 2, 1, 2, 0, 1, "vm", slurm_port(2)), id="srun"),
        pytest.param(SRUN_UNEVEN, ("slurm", 6, 7, 0, 1, 3, 4, "gpu-a1", slurm_port(40000)), id="srun-uneven"),
        pytest.param(
            {**SRUN_UNEVEN, "SLURM_NODEID": "1", "SLURM_PROCID": "3", "SLURM_LOCALID": "1"},
            ("slurm", 3, 7, 1, 2, 1, 4, "gpu-a1", slurm_port(40000)),
            id="srun-uneven-full-node",
        ),
        pytest.param(
            {
                "SLURM_JOB_ID": "9",
                "SLURM_STEPID": "0",
                "SLURM_PROCID": "2",
                "SLURM_NTASKS": "4",
                "SLURM_NTASKS_PER_NODE": "2",
                "SLURM_JOB_NODELIST": "c[10-11]",
            },
            ("slurm", 2, 4, 0, 2, 1, 2, "c10", slurm_port(9)),
            id="srun-old-step-name-and-ntasks-per-node",
        ),
        pytest.param(
            {**SRUN, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "23456"},
            ("slurm", 1, 2, 1, 2, 0, 1, "10.0.0.5", 23456),
            id="srun-master-from-env",
        ),
        pytest.param(
            {**SRUN, "SLURM_STEP_NODELIST": "b[7-8]", "SLURM_NODELIST": "a[1-8]", "SLURM_JOB_NODELIST": "a[1-8]"},
            ("slurm", 1, 2, 1, 2, 0, 1, "b7", slurm_port(2)),
            id="srun-step-nodelist-first",
        ),
        pytest.param(
            {**SRUN, "SLURM_NTASKS": "4"},
            ("slurm", 1, 2, 1, 2, 0, 1, "vm", slurm_port(2)),
            id="srun-step-task-count-wins",
        ),
    ],
)
def test_detected_layout(environ: Env, expected: Layout) -> None:
    env = detect_launcher("auto", environ)
    assert env is not None
    assert layout(env) == expected


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(MPIRUN_IN_SBATCH, ("openmpi", 1, 2, 1, 2, 0, 1, "vm", slurm_port(4)), id="mpirun-in-sbatch"),
        pytest.param(HYDRA_IN_SBATCH, ("mpich", 1, 2, 1, 2, 0, 1, "vm", slurm_port(4)), id="hydra-in-sbatch"),
        pytest.param(
            OPENMPI_TWO_NODES_IN_SLURM,
            ("openmpi", 5, 8, 1, 4, 1, 2, "gpu03", slurm_port(123456)),
            id="mpirun-two-nodes-uses-the-job-nodelist",
        ),
        pytest.param(
            SRUN_PMI2_TWO_NODES,
            ("mpich", 5, 8, 1, 4, 1, 2, "n2", slurm_port(123)),
            id="srun-pmi2-local-values-from-slurm",
        ),
        pytest.param(
            {**SRUN_PMI2_TWO_NODES, "SLURM_PROCID": "0"},
            ("mpich", 5, 8, 5, 8, 0, 1, "n1", slurm_port(123)),
            id="slurm-task-that-is-not-this-rank-is-ignored",
        ),
        pytest.param(TORCHRUN_UNDER_SRUN, ("pytorch", 3, 4, 1, 2, 1, 2, "node0", 29400), id="torchrun-under-srun"),
        pytest.param(
            {**SRUN_PMI2_TWO_NODES, "SLURM_PROCID": "9"},
            ("mpich", 5, 8, 5, 8, 0, 1, "n1", slurm_port(123)),
            id="inconsistent-slurm-task-is-ignored",
        ),
    ],
)
def test_mpi_and_torchrun_win_over_slurm(environ: Env, expected: Layout) -> None:
    assert SlurmEnv.detect(environ) or "SLURM_JOB_ID" in environ
    env = detect_launcher("auto", environ)
    assert env is not None
    assert layout(env) == expected


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param({}, id="empty"),
        pytest.param({"HOME": "/root", "PATH": "/usr/bin"}, id="unrelated"),
        pytest.param(SBATCH_SHELL, id="sbatch-shell"),
        pytest.param(SALLOC_SHELL, id="salloc-shell"),
        pytest.param({"RANK": "0"}, id="rank-without-world-size"),
        pytest.param({"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, id="world-size-without-rank"),
        pytest.param({"PMIX_RANK": "0"}, id="pmix-only"),
        pytest.param({"OMPI_COMM_WORLD_RANK": "0"}, id="openmpi-rank-only"),
        pytest.param({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, id="slurm-without-ntasks"),
    ],
)
def test_nothing_detected(environ: Env) -> None:
    assert detect_launcher("auto", environ) is None
    assert not any(launcher.detect(environ) for launcher in LAUNCHERS)


@pytest.mark.parametrize(
    "environ", [TORCHRUN, OPENMPI, SRUN, {"RANK": "bad"}], ids=["torchrun", "openmpi", "srun", "bad"]
)
def test_none_ignores_every_variable(environ: Env) -> None:
    assert detect_launcher("none", environ) is None


@pytest.mark.parametrize(
    ("name", "environ", "expected"),
    [
        ("pytorch", TORCHRUN, "pytorch"),
        ("openmpi", OPENMPI, "openmpi"),
        ("mpich", MPICH, "mpich"),
        ("mvapich", {"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "1"}, "mvapich"),
        ("slurm", SRUN, "slurm"),
        ("mpi", OPENMPI, "openmpi"),
        ("mpi", MPICH, "mpich"),
        ("mpi", {**SRUN, **MPICH}, "mpich"),
        ("slurm", SRUN_PMI2_TWO_NODES, "slurm"),
        ("pytorch", {**TORCHRUN, **OPENMPI}, "pytorch"),
    ],
)
def test_forced_launcher(name: str, environ: Env, expected: str) -> None:
    env = detect_launcher(name, environ)
    assert env is not None
    assert env.name == expected


@pytest.mark.parametrize(
    ("name", "environ", "named"),
    [
        ("pytorch", {}, ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]),
        ("pytorch", {"RANK": "0", "WORLD_SIZE": "1"}, ["MASTER_ADDR", "MASTER_PORT"]),
        ("pytorch", {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h"}, ["MASTER_PORT"]),
        ("openmpi", MPICH, ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"]),
        ("mpich", {"PMI_RANK": "0"}, ["PMI_SIZE"]),
        ("mvapich", {}, ["MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"]),
        ("slurm", SBATCH_SHELL, ["SLURM_STEP_ID", "srun"]),
        ("slurm", SALLOC_SHELL, ["SLURM_PROCID", "SLURM_STEP_ID"]),
        ("slurm", {}, ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID"]),
        ("mpi", SRUN, ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"]),
        ("mpi", TORCHRUN, ["openmpi", "mpich", "mvapich"]),
    ],
)
def test_forced_launcher_lists_what_is_missing(name: str, environ: Env, named: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        detect_launcher(name, environ)
    for word in named:
        assert word in str(caught.value)


def test_auto_detected_but_incomplete_names_the_missing_variables() -> None:
    with pytest.raises(ConfigError, match="pytorch launcher detected but MASTER_ADDR, MASTER_PORT not set"):
        detect_launcher("auto", {"RANK": "0", "WORLD_SIZE": "2"})


@pytest.mark.parametrize("name", ["torch", "Slurm", "MPI", "", "srun"])
def test_unknown_launcher_lists_the_allowed_names(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        detect_launcher(name, SRUN)
    message = str(caught.value)
    assert repr(name) in message
    for allowed in launcher_names():
        assert allowed in message


def test_launcher_names() -> None:
    names = launcher_names()
    assert names[:2] == ("auto", "none")
    assert set(names) == {"auto", "none", "mpi", "pytorch", "openmpi", "mpich", "mvapich", "slurm"}
    assert [launcher.name for launcher in LAUNCHERS] == ["pytorch", "openmpi", "mpich", "mvapich", "slurm"]


# --- Malformed variables: a ConfigError naming the variable, its value and what was expected ---

TORCH_BASE: Env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    ("environ", "variable", "detail"),
    [
        ({**TORCH_BASE, "RANK": "abc"}, "RANK", "'abc' is not an integer"),
        ({**TORCH_BASE, "RANK": "1.0"}, "RANK", "'1.0' is not an integer"),
        ({**TORCH_BASE, "RANK": ""}, "RANK", "'' is not an integer"),
        ({**TORCH_BASE, "RANK": "-1"}, "RANK", "out of range; expected an integer >= 0"),
        ({**TORCH_BASE, "RANK": "4"}, "RANK", "expected a value below WORLD_SIZE (4)"),
        ({**TORCH_BASE, "WORLD_SIZE": "0"}, "WORLD_SIZE", "expected an integer >= 1"),
        ({**TORCH_BASE, "WORLD_SIZE": "two"}, "WORLD_SIZE", "'two'"),
        ({**TORCH_BASE, "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK", "below the local size (2)"),
        ({**TORCH_BASE, "LOCAL_WORLD_SIZE": "8"}, "LOCAL_WORLD_SIZE", "at most the world size (4)"),
        ({**TORCH_BASE, "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE", ">= 1"),
        ({**TORCH_BASE, "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2"}, "GROUP_RANK", "below the node count (2)"),
        ({**TORCH_BASE, "NODE_RANK": "x"}, "NODE_RANK", "'x' is not an integer"),
        ({**TORCH_BASE, "GROUP_WORLD_SIZE": "0"}, "GROUP_WORLD_SIZE", ">= 1"),
        ({**TORCH_BASE, "MASTER_PORT": "70000"}, "MASTER_PORT", "expected an integer in 1..65535"),
        ({**TORCH_BASE, "MASTER_PORT": "0"}, "MASTER_PORT", "1..65535"),
        ({**TORCH_BASE, "MASTER_PORT": "http"}, "MASTER_PORT", "'http' is not an integer"),
        ({**TORCH_BASE, "MASTER_ADDR": "  "}, "MASTER_ADDR", "is empty"),
        ({**OPENMPI, "OMPI_COMM_WORLD_RANK": "x"}, "OMPI_COMM_WORLD_RANK", "'x' is not an integer"),
        ({**OPENMPI, "OMPI_COMM_WORLD_RANK": "2"}, "OMPI_COMM_WORLD_RANK", "below OMPI_COMM_WORLD_SIZE (2)"),
        ({**OPENMPI, "OMPI_COMM_WORLD_SIZE": "-2"}, "OMPI_COMM_WORLD_SIZE", "'-2' is out of range"),
        ({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "3"}, "OMPI_COMM_WORLD_LOCAL_RANK", "below the local size (2)"),
        ({**OPENMPI, "MASTER_PORT": "99999"}, "MASTER_PORT", "1..65535"),
        ({**MPICH, "PMI_SIZE": ""}, "PMI_SIZE", "is not an integer"),
        ({**MPICH, "MPI_LOCALNRANKS": "0"}, "MPI_LOCALNRANKS", ">= 1"),
        ({"MV2_COMM_WORLD_RANK": " 1x", "MV2_COMM_WORLD_SIZE": "2"}, "MV2_COMM_WORLD_RANK", "' 1x'"),
        ({**SRUN, "SLURM_PROCID": "2"}, "SLURM_PROCID", "below SLURM_STEP_NUM_TASKS (2)"),
        ({**SBATCH_SHELL, "SLURM_STEP_ID": "0", "SLURM_PROCID": "2"}, "SLURM_PROCID", "below SLURM_NTASKS (2)"),
        ({**SRUN, "SLURM_NTASKS": "four", "SLURM_STEP_NUM_TASKS": "four"}, "SLURM_STEP_NUM_TASKS", "'four'"),
        ({**SRUN, "SLURM_LOCALID": "5"}, "SLURM_LOCALID", "below the local size (2)"),
        ({**SRUN_UNEVEN, "SLURM_TASKS_PER_NODE": "2(x)"}, "SLURM_TASKS_PER_NODE", "'2(x)'"),
        ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "2(x0)"}, "SLURM_STEP_TASKS_PER_NODE", "'2(x0)'"),
        ({**SRUN_UNEVEN, "SLURM_NODEID": "4"}, "SLURM_NODEID", "below the node count of SLURM_TASKS_PER_NODE (4)"),
        ({k: v for k, v in SRUN_UNEVEN.items() if k != "SLURM_NODEID"}, "SLURM_NODEID", "is not set"),
        ({**SRUN, "SLURM_STEP_NODELIST": "gpu[1-2"}, "SLURM_STEP_NODELIST", "unbalanced"),
        ({**SRUN, "SLURM_JOB_ID": "12a"}, "SLURM_JOB_ID", "'12a' is not an integer"),
        ({**SRUN, "SLURM_NNODES": "0", "SLURM_STEP_NUM_NODES": "0"}, "SLURM_STEP_NUM_NODES", ">= 1"),
        ({**MPIRUN_IN_SBATCH, "SLURM_JOB_NODELIST": "vm[1-"}, "SLURM_JOB_NODELIST", "unbalanced"),
        ({**OPENMPI, "SLURM_JOB_ID": "x"}, "SLURM_JOB_ID", "'x' is not an integer"),
    ],
)
def test_malformed_variables_are_config_errors(environ: Env, variable: str, detail: str) -> None:
    with pytest.raises(ConfigError) as caught:
        detect_launcher("auto", environ)
    message = str(caught.value)
    assert variable in message
    assert detail in message


@pytest.mark.parametrize(
    "environ",
    [
        {k: v for k, v in SRUN.items() if "NODELIST" not in k},
        {k: v for k, v in SRUN.items() if k != "SLURM_JOB_ID"},
    ],
    ids=["no-nodelist", "no-job-id"],
)
def test_slurm_without_nodelist_or_job_id_asks_for_master_variables(environ: Env) -> None:
    with pytest.raises(ConfigError, match="neither MASTER_"):
        detect_launcher("slurm", environ)


def test_multi_node_mpi_outside_slurm_needs_master_addr() -> None:
    environ = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    with pytest.raises(ConfigError, match="MASTER_ADDR is not set and the job spans 2 nodes"):
        detect_launcher("auto", environ)
    env = detect_launcher("auto", environ, master_addr="rank0-host")
    assert env is not None
    assert env.master_addr == "rank0-host"


# --- Derived rendezvous ports and hosts ---------------------------------------------------------


@pytest.mark.parametrize(
    ("job_id", "port"),
    [(0, 15000), (1, 15001), (16999, 31999), (17000, 15000), (123456, 19456), (9_999_999, 15000 + 9_999_999 % 17000)],
)
def test_port_derived_from_job_id(job_id: int, port: int) -> None:
    env = detect_launcher("auto", {**SRUN, "SLURM_JOB_ID": str(job_id)})
    assert env is not None
    assert env.master_port == port == PORT_BASE + job_id % PORT_SPAN
    assert 1024 < env.master_port < 32768  # privileged ports and Linux's ephemeral range avoided


def test_consecutive_jobs_get_distinct_ports() -> None:
    ports = set()
    for job_id in range(5000, 5000 + PORT_SPAN):
        env = SlurmEnv({**SRUN, "SLURM_JOB_ID": str(job_id)})
        ports.add(env.master_port)
    assert len(ports) == PORT_SPAN


@pytest.mark.parametrize(
    ("nodelists", "host"),
    [
        ({"SLURM_STEP_NODELIST": "node[07-09]", "SLURM_NODELIST": "x1"}, "node07"),
        ({"SLURM_NODELIST": "gpu-a[2-3],cpu1"}, "gpu-a2"),
        ({"SLURM_JOB_NODELIST": "j[5-6]", "SLURM_NODELIST": "x1"}, "j5"),
        ({"SLURM_JOB_NODELIST": "rack[4-5]-n[01-02]"}, "rack4-n01"),
        ({"SLURM_JOB_NODELIST": "login1,node[1-4]"}, "login1"),
    ],
)
def test_slurm_master_addr_is_the_first_host(nodelists: Env, host: str) -> None:
    base = {k: v for k, v in SRUN.items() if "NODELIST" not in k}
    env = detect_launcher("slurm", {**base, **nodelists})
    assert env is not None
    assert env.master_addr == host
    assert "first host of SLURM_" in env.explain()


@pytest.mark.parametrize(
    ("value", "counts"),
    [("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2)", [4, 4]), ("1,3(x2),2", [1, 3, 3, 2]), (" 8 ", [8])],
)
def test_expand_tasks_per_node(value: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(value) == counts


@pytest.mark.parametrize("value", ["", "x", "2(x)", "2(x0)", "0", "2(3)", "2,,1", "-1"])
def test_malformed_tasks_per_node(value: str) -> None:
    with pytest.raises(ConfigError, match="expected counts like"):
        expand_tasks_per_node(value)


# --- Configuration overrides --------------------------------------------------------------------


@pytest.mark.parametrize(
    "environ",
    [TORCHRUN, OPENMPI, MPICH, SRUN, MPIRUN_IN_SBATCH],
    ids=["torchrun", "openmpi", "mpich", "srun", "mpirun-in-sbatch"],
)
def test_configured_master_wins_over_the_environment(environ: Env) -> None:
    env = detect_launcher("auto", environ, master_addr="10.9.8.7", master_port=23456)
    assert env is not None
    assert (env.master_addr, env.master_port) == ("10.9.8.7", 23456)
    assert env.explain().endswith("(host: configuration; port: configuration)")


def test_configured_master_stands_in_for_missing_variables() -> None:
    environ = {"RANK": "0", "WORLD_SIZE": "1"}
    env = detect_launcher("pytorch", environ, master_addr="127.0.0.1", master_port=29511)
    assert env is not None
    assert env.env_updates()["MASTER_PORT"] == "29511"
    with pytest.raises(ConfigError, match="MASTER_PORT"):
        detect_launcher("pytorch", environ, master_addr="127.0.0.1")


@pytest.mark.parametrize(
    ("master_addr", "master_port", "named"),
    [
        (None, 0, "master_port=0"),
        (None, 65536, "master_port=65536"),
        ("", None, "master_addr=''"),
        (" ", 1, "master_addr"),
    ],
)
def test_bad_configured_master_is_a_config_error(master_addr: str | None, master_port: int | None, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("[", "\\[")):
        detect_launcher("auto", SRUN, master_addr=master_addr, master_port=master_port)


# --- What the communicator reads from a detected launcher ---------------------------------------


@pytest.mark.parametrize(
    "environ", [OPENMPI, MPICH, SRUN, SRUN_PMI2_TWO_NODES], ids=["openmpi", "mpich", "srun", "srun-pmi2"]
)
def test_env_updates_speak_torchrun_names(environ: Env) -> None:
    env = detect_launcher("auto", environ)
    assert env is not None
    updates = env.env_updates()
    assert updates["RANK"] == str(env.rank)
    assert updates["WORLD_SIZE"] == str(env.world_size)
    assert updates["LOCAL_RANK"] == str(env.local_rank)
    assert updates["LOCAL_WORLD_SIZE"] == str(env.local_size)
    assert updates["GROUP_RANK"] == str(env.node_rank)
    assert updates["MASTER_ADDR"] == env.master_addr
    assert updates["MASTER_PORT"] == str(env.master_port)
    # torchrun's names now describe the same process: detecting them agrees.
    again = detect_launcher("pytorch", updates)
    assert again is not None
    assert layout(again)[1:] == layout(env)[1:]


def test_explain_names_launcher_and_derived_master() -> None:
    env = detect_launcher("auto", SRUN)
    assert env is not None
    assert env.explain() == (
        "slurm: rank 1 of 2, local rank 1 of 2, node 0 of 1, "
        "master vm:15002 (host: first host of SLURM_STEP_NODELIST; port: SLURM_JOB_ID=2: 15000 + id % 17000)"
    )


def test_os_environ_is_read_when_no_table_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for launcher in LAUNCHERS for name in launcher.variables]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert detect_launcher() is None
    for name, value in MPICH.items():
        monkeypatch.setenv(name, value)
    env = detect_launcher()
    assert isinstance(env, MPICHEnv)
    assert env.rank == 1
    monkeypatch.setenv("PMI_RANK", "0")
    assert env.rank == 1, "an env reads a snapshot taken at construction"
    assert MPICHEnv().rank == 0


def test_each_launcher_lists_the_variables_it_reads() -> None:
    assert OpenMPIEnv.variables[:4] == (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    )
    assert MVAPICHEnv.variables[:2] == ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE")
    assert MPICHEnv.variables[:4] == ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    assert "GROUP_RANK" in TorchrunEnv.variables
    assert "SLURM_STEP_NODELIST" in SlurmEnv.variables
    for launcher in LAUNCHERS:
        assert {"MASTER_ADDR", "MASTER_PORT"} <= set(launcher.variables)


# --- describe_environment -----------------------------------------------------------------------


def test_describe_environment_marks_the_chosen_launcher() -> None:
    lines = describe_environment(HYDRA_IN_SBATCH)
    assert len(lines) == len(LAUNCHERS)
    by_name = {line.split(":", 1)[0]: line for line in lines}
    assert set(by_name) == {launcher.name for launcher in LAUNCHERS}
    assert "detected, used by launcher='auto'" in by_name["mpich"]
    assert "PMI_RANK=1" in by_name["mpich"]
    assert "MPI_LOCALNRANKS=2" in by_name["mpich"]
    assert "detected, but mpich comes first" in by_name["slurm"]
    assert "SLURM_STEP_NUM_TASKS=1" in by_name["slurm"]
    assert by_name["pytorch"] == (
        "pytorch: not detected, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set; none of its variables set"
    )


def test_describe_environment_explains_the_batch_shell() -> None:
    slurm = describe_environment(SBATCH_SHELL)[-1]
    assert slurm.startswith("slurm: not detected, SLURM_STEP_ID not set (start the ranks with srun")
    assert "SLURM_PROCID=0" in slurm
    assert "SLURM_NTASKS=2" in slurm


def test_describe_environment_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in OPENMPI.items():
        monkeypatch.setenv(name, value)
    assert any(line.startswith("openmpi: detected") for line in describe_environment())


@pytest.mark.parametrize("addr", ["node]", "two words", "tcp://host", "[::1]"])
def test_a_master_address_that_is_no_host_is_a_config_error(addr: str) -> None:
    environ = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": addr, "MASTER_PORT": "29500"}
    with pytest.raises(ConfigError, match="is not a host name or IP address"):
        detect_launcher("auto", environ)
    with pytest.raises(ConfigError, match="master_addr"):
        detect_launcher("auto", {**environ, "MASTER_ADDR": "ok"}, master_addr=addr)


@pytest.mark.parametrize(
    ("hosts", "layouts"),
    [
        (["a", "a", "b", "b"], [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]),  # blocks
        (["a", "b", "a", "b"], [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]),  # round-robin
        (["b", "a", "a"], [(0, 1, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]),  # nodes in the order of their lowest rank
        (["a"], [(0, 1, 0, 1)]),
    ],
)
def test_layout_from_host_names(hosts: list[str], layouts: list[tuple[int, int, int, int]]) -> None:
    for rank, layout in enumerate(layouts):
        assert Topology.from_hosts(rank, hosts) == Topology(*layout)


def test_every_launcher_but_mpi_outside_slurm_places_its_nodes() -> None:
    torchrun = detect_launcher("auto", environ={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    mpi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "h"}
    assert torchrun is not None and torchrun.places_nodes
    placed = detect_launcher("auto", environ=mpi)
    assert placed is not None and not placed.places_nodes


def test_launcher_variables_are_every_launchers_and_no_others() -> None:
    environ = {
        **{name: "1" for launcher in LAUNCHERS for name in launcher.variables},
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "ROLE_NAME": "default",
        "SLURMD_NODENAME": "n1",
        "OMPI_MCA_btl": "self",
        "PMIX_RANK": "0",
        "PMI_FD": "3",
        "MV2_ENABLE_AFFINITY": "0",
    }
    unrelated = {"PATH": "/bin", "HOME": "/root", "COMMUNICATOR_BACKEND": "gloo", "OMP_NUM_THREADS": "1"}
    assert sorted(launcher_variables({**environ, **unrelated})) == sorted(environ)
