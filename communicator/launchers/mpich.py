"""MPICH's Hydra (``mpiexec`` / ``mpirun.mpich``) and Intel MPI: ``PMI_*`` and ``MPI_LOCAL*``."""

from __future__ import annotations

from communicator.launchers.mpi import MPIEnv

__all__ = ["MPICHEnv"]


class MPICHEnv(MPIEnv):
    """The PMI rank variables; Hydra adds ``MPI_LOCALRANKID`` and ``MPI_LOCALNRANKS``.

    Other PMI process managers may set only ``PMI_RANK`` / ``PMI_SIZE``: the job is then taken to
    be one node (see :class:`~communicator.launchers.mpi.MPIEnv`).
    """

    name = "mpich"
    rank_variable = "PMI_RANK"
    size_variable = "PMI_SIZE"
    local_rank_variable = "MPI_LOCALRANKID"
    local_size_variable = "MPI_LOCALNRANKS"
    # Hydra's process-manager interface (PMI_RANK, PMI_SIZE, PMI_FD, PMI_PORT, ...).
    prefixes = ("PMI_",)
