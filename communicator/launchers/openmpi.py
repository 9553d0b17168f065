"""Open MPI's ``mpirun`` / ``mpiexec``: the ``OMPI_COMM_WORLD_*`` variables."""

from __future__ import annotations

from communicator.launchers.mpi import MPIEnv

__all__ = ["OpenMPIEnv"]


class OpenMPIEnv(MPIEnv):
    """Open MPI's rank variables.

    ``OMPI_COMM_WORLD_NODE_RANK`` is deliberately unused: despite its name it is this process's
    rank among all processes on its node (across jobs), not the index of the node.
    """

    name = "openmpi"
    rank_variable = "OMPI_COMM_WORLD_RANK"
    size_variable = "OMPI_COMM_WORLD_SIZE"
    local_rank_variable = "OMPI_COMM_WORLD_LOCAL_RANK"
    local_size_variable = "OMPI_COMM_WORLD_LOCAL_SIZE"
    # mpirun's own variables (OMPI_*) and those of the PMIx server it runs the ranks under.
    prefixes = ("OMPI_", "PMIX_")
