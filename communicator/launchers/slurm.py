"""Slurm job steps (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``, the node list and the job id.

The rendezvous host is the first node of the step (where Slurm places task 0) and the port is
derived from the job id, so ``srun python train.py`` needs no ``MASTER_ADDR``/``MASTER_PORT``.
The same derivation serves MPI launchers started inside a Slurm allocation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from typing_extensions import override

from communicator.errors import ConfigError
from communicator.launchers.base import LauncherEnv, read_int
from communicator.launchers.hostlist import first_host

__all__ = [
    "JOB_NODELIST_VARIABLES",
    "PORT_BASE",
    "PORT_SPAN",
    "STEP_NODELIST_VARIABLES",
    "SlurmEnv",
    "expand_tasks_per_node",
    "master_addr_from_nodelist",
    "master_port_from_job_id",
]

#: Derived ports are ``PORT_BASE + SLURM_JOB_ID % PORT_SPAN``: 15000..31999, below Linux's
#: ephemeral range (32768+) so no outgoing connection already holds it, and distinct for any
#: 17000 consecutive job ids, so two jobs sharing a node do not collide. Two steps of one job
#: running at the same time on one node do share it: give them ``MASTER_PORT``.
PORT_BASE = 15000
PORT_SPAN = 17000

#: The job's node list; an MPI launcher inside the job places rank 0 on its first node.
JOB_NODELIST_VARIABLES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
#: The step's own list first: srun's task 0 runs on its first node, which need not be the job's.
STEP_NODELIST_VARIABLES = ("SLURM_STEP_NODELIST", *JOB_NODELIST_VARIABLES)
_TASKS_PER_NODE_VARIABLES = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_NUM_NODES_VARIABLES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
# Slurm sets SLURM_STEP_ID in every task started by srun; SLURM_STEPID is its older spelling.
_STEP_VARIABLES = ("SLURM_STEP_ID", "SLURM_STEPID")
_TASKS_ENTRY = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


def expand_tasks_per_node(value: str) -> list[int]:
    """Per-node task counts from Slurm's compressed form: ``2(x3),1`` gives ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for entry in value.strip().split(","):
        match = _TASKS_ENTRY.fullmatch(entry.strip())
        if match is None or int(match[1]) < 1 or (match[2] is not None and int(match[2]) < 1):
            raise ConfigError(f"tasks per node {value!r} has a bad entry {entry!r}; expected counts like '2(x3),1'")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def master_addr_from_nodelist(
    environ: Mapping[str, str], variables: tuple[str, ...] = STEP_NODELIST_VARIABLES
) -> tuple[str, str] | None:
    """The first host of the first node list of ``variables`` that is set, and where it came
    from; ``None`` when none is set (outside Slurm)."""
    for name in variables:
        nodelist = environ.get(name)
        if nodelist is not None:
            try:
                return first_host(nodelist, environ), f"first host of {name}"
            except ConfigError as error:
                raise ConfigError(f"{name}={nodelist!r} is not a valid hostlist: {error}") from None
    return None


def master_port_from_job_id(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """``PORT_BASE + SLURM_JOB_ID % PORT_SPAN`` and where it came from; ``None`` outside Slurm."""
    job_id = read_int(environ, "SLURM_JOB_ID")
    if job_id is None:
        return None
    return PORT_BASE + job_id % PORT_SPAN, f"SLURM_JOB_ID={job_id}: {PORT_BASE} + id % {PORT_SPAN}"


class SlurmEnv(LauncherEnv):
    """A task of a Slurm job step started by ``srun``.

    Detection needs ``SLURM_PROCID``, ``SLURM_NTASKS`` and a step id. The shell of an ``sbatch``
    script also has ``SLURM_PROCID=0`` and the job's ``SLURM_NTASKS`` but no step id: it is one
    process, not a task launch, so it is not detected (start the ranks with ``srun`` inside it);
    an ``salloc`` shell has no ``SLURM_PROCID`` at all. The local size comes from the step's
    tasks-per-node list (``2(x3),1``) at this node's ``SLURM_NODEID``, else
    ``SLURM_NTASKS_PER_NODE``, else one node is assumed. ``MASTER_ADDR``/``MASTER_PORT`` win over
    the node list and the job-id port.
    """

    name = "slurm"
    hint = "start the ranks with srun (an sbatch script's own shell is not a job step)"
    variables = (
        "SLURM_JOB_ID",
        *_STEP_VARIABLES,
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        *_NUM_NODES_VARIABLES,
        *_TASKS_PER_NODE_VARIABLES,
        "SLURM_NTASKS_PER_NODE",
        *STEP_NODELIST_VARIABLES,
        "MASTER_ADDR",
        "MASTER_PORT",
    )
    # srun's output environment: SLURM_* for the job and step, SLURMD_NODENAME for the node.
    prefixes = ("SLURM_", "SLURMD_")

    @classmethod
    @override
    def missing(cls, environ: Mapping[str, str]) -> list[str]:
        absent = [name for name in ("SLURM_PROCID", "SLURM_NTASKS") if name not in environ]
        if not any(name in environ for name in _STEP_VARIABLES):
            absent.append(_STEP_VARIABLES[0])
        return absent

    @property
    @override
    def rank(self) -> int:
        name, size = self._world()
        return self._below("SLURM_PROCID", self._int("SLURM_PROCID"), name, size)

    @property
    @override
    def world_size(self) -> int:
        return self._world()[1]

    @property
    @override
    def local_rank(self) -> int:
        return self._local_rank_or_derived("SLURM_LOCALID")

    @property
    @override
    def local_size(self) -> int:
        for name in _TASKS_PER_NODE_VARIABLES:
            value = self._optional_str(name)
            if value is not None:
                return self._count_on_this_node(name, value)
        return self._local_size_or_world("SLURM_NTASKS_PER_NODE")

    @property
    @override
    def node_rank(self) -> int:
        return self._node_rank_or_derived("SLURM_NODEID")

    @property
    @override
    def num_nodes(self) -> int:
        found = self._first_int(*_NUM_NODES_VARIABLES, minimum=1)
        return self._nodes_from_world() if found is None else found[1]

    @override
    def _master_addr_from_env(self) -> tuple[str, str]:
        addr = self._optional_str("MASTER_ADDR")
        if addr is not None:
            return addr, "MASTER_ADDR"
        derived = master_addr_from_nodelist(self.environ)
        if derived is None:
            raise ConfigError(
                f"slurm: neither MASTER_ADDR nor {' / '.join(STEP_NODELIST_VARIABLES)} is set; "
                "expected the step's node list from srun"
            )
        return derived

    @override
    def _master_port_from_env(self) -> tuple[int, str]:
        port = self._optional_port("MASTER_PORT")
        if port is not None:
            return port, "MASTER_PORT"
        derived = master_port_from_job_id(self.environ)
        if derived is None:
            raise ConfigError("slurm: neither MASTER_PORT nor SLURM_JOB_ID is set; expected a job id from srun")
        return derived

    def _world(self) -> tuple[str, int]:
        """The step's task count and its variable: ``SLURM_STEP_NUM_TASKS`` when set, since a step
        started by a tool other than srun (MPICH's Hydra) keeps the job's ``SLURM_NTASKS``."""
        found = self._first_int("SLURM_STEP_NUM_TASKS", minimum=1)
        return found if found is not None else ("SLURM_NTASKS", self._int("SLURM_NTASKS", minimum=1))

    def _count_on_this_node(self, name: str, value: str) -> int:
        """This node's entry of a tasks-per-node list (``name`` holds ``value``)."""
        try:
            counts = expand_tasks_per_node(value)
        except ConfigError as error:
            raise ConfigError(f"slurm: {name}={value!r} is malformed: {error}") from None
        node = self._optional_int("SLURM_NODEID")
        if node is None:
            if len(set(counts)) > 1:
                raise ConfigError(
                    f"slurm: SLURM_NODEID is not set; expected it to pick this node's entry of {name}={value!r}"
                )
            node = 0
        return counts[self._below("SLURM_NODEID", node, f"the node count of {name}", len(counts))]
