"""What every MPI launcher has in common: four rank variables and a rendezvous address default.

torch's CPU wheel has no MPI backend, so the ranks MPI reports are used to build a gloo (or
NCCL) group, which needs a rendezvous host and port that MPI does not provide:

- host: ``MASTER_ADDR``; else, inside a Slurm allocation, the first host of the job's node list
  (where ``mpirun`` places rank 0), or of the step's when srun started the ranks; else
  ``127.0.0.1`` when the job fits on one node. A multi-node job outside Slurm without
  ``MASTER_ADDR`` is a ConfigError.
- port: ``MASTER_PORT``; else, inside Slurm, the port derived from ``SLURM_JOB_ID`` (see
  :mod:`communicator.launchers.slurm`); else ``DEFAULT_MASTER_PORT`` (29500, torch's default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from typing_extensions import override

from communicator.errors import ConfigError
from communicator.launchers.base import LauncherEnv
from communicator.launchers.slurm import (
    JOB_NODELIST_VARIABLES,
    STEP_NODELIST_VARIABLES,
    SlurmEnv,
    master_addr_from_nodelist,
    master_port_from_job_id,
)

__all__ = ["DEFAULT_MASTER_ADDR", "DEFAULT_MASTER_PORT", "MPIEnv"]

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500


class MPIEnv(LauncherEnv):
    """An MPI implementation's rank variables; subclasses only name them.

    MPI gives no node index: when ``srun`` started every rank (see ``_srun_task``) the node and any
    missing local values come from Slurm. Otherwise the variables alone say ``node_rank = rank //
    local_size`` (placement in blocks, mpirun's default), which the master-host check uses before
    the rendezvous; once the group exists, the ranks' host names decide the layout
    (``places_nodes`` is false), so that ``mpirun --map-by node`` is placed right too.
    """

    rank_variable: ClassVar[str]
    size_variable: ClassVar[str]
    local_rank_variable: ClassVar[str]
    local_size_variable: ClassVar[str]

    @override
    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Collect the subclass's variable names for ``describe_environment``."""
        super().__init_subclass__(**kwargs)
        cls.variables = (
            cls.rank_variable,
            cls.size_variable,
            cls.local_rank_variable,
            cls.local_size_variable,
            "MASTER_ADDR",
            "MASTER_PORT",
        )

    @classmethod
    @override
    def missing(cls, environ: Mapping[str, str]) -> list[str]:
        return [name for name in (cls.rank_variable, cls.size_variable) if name not in environ]

    @property
    @override
    def rank(self) -> int:
        rank = self._int(self.rank_variable)
        return self._below(self.rank_variable, rank, self.size_variable, self.world_size)

    @property
    @override
    def world_size(self) -> int:
        return self._int(self.size_variable, minimum=1)

    @property
    @override
    def local_rank(self) -> int:
        srun = self._srun_task()
        if srun is not None and self.local_rank_variable not in self.environ:
            return srun.local_rank
        return self._local_rank_or_derived(self.local_rank_variable)

    @property
    @override
    def local_size(self) -> int:
        srun = self._srun_task()
        if srun is not None and self.local_size_variable not in self.environ:
            return srun.local_size
        return self._local_size_or_world(self.local_size_variable)

    @property
    @override
    def node_rank(self) -> int:
        srun = self._srun_task()
        return self._node_rank_or_derived() if srun is None else srun.node_rank

    @property
    @override
    def num_nodes(self) -> int:
        srun = self._srun_task()
        return self._nodes_from_world() if srun is None else srun.num_nodes

    @property
    @override
    def places_nodes(self) -> bool:
        return self._srun_task() is not None

    def _srun_task(self) -> SlurmEnv | None:
        """Slurm's view of this process when srun started every rank itself (``srun --mpi=pmi2``
        sets ``PMI_RANK``/``PMI_SIZE`` but no local variables): its task id and count are the MPI
        rank and size. ``mpirun`` inside an allocation fails this test (its ranks share the
        launching step's ``SLURM_PROCID`` and task count), so Slurm's variables are then ignored,
        as they are when inconsistent: the MPI variables are the authority."""
        if not SlurmEnv.detect(self.environ):
            return None
        srun = SlurmEnv(self.environ)
        try:
            same_task = (srun.rank, srun.world_size) == (self.rank, self.world_size)
        except ConfigError:
            return None
        return srun if same_task else None

    @override
    def _master_addr_from_env(self) -> tuple[str, str]:
        addr = self._optional_str("MASTER_ADDR")
        if addr is not None:
            return addr, "MASTER_ADDR"
        # Ranks started by srun share one step, whose first node runs rank 0; under mpirun only the
        # job's list is common to all ranks (remote ranks run in a launcher step of their own).
        lists = JOB_NODELIST_VARIABLES if self._srun_task() is None else STEP_NODELIST_VARIABLES
        derived = master_addr_from_nodelist(self.environ, lists)
        if derived is not None:
            return derived
        if self.num_nodes > 1:
            raise ConfigError(
                f"{self.name}: MASTER_ADDR is not set and the job spans {self.num_nodes} nodes "
                f"({self.size_variable}={self.world_size}, {self.local_size_variable}="
                f"{self.local_size}); expected MASTER_ADDR naming rank 0's host"
            )
        return DEFAULT_MASTER_ADDR, "single-node default"

    @override
    def _master_port_from_env(self) -> tuple[int, str]:
        port = self._optional_port("MASTER_PORT")
        if port is not None:
            return port, "MASTER_PORT"
        derived = master_port_from_job_id(self.environ)
        if derived is not None:
            return derived
        return DEFAULT_MASTER_PORT, "default"
