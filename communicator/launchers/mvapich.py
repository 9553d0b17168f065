"""MVAPICH2's launchers (``mpirun_rsh``, ``mpiexec``): the ``MV2_COMM_WORLD_*`` variables."""

from __future__ import annotations

from communicator.launchers.mpi import MPIEnv

__all__ = ["MVAPICHEnv"]


class MVAPICHEnv(MPIEnv):
    """MVAPICH2's rank variables."""

    name = "mvapich"
    rank_variable = "MV2_COMM_WORLD_RANK"
    size_variable = "MV2_COMM_WORLD_SIZE"
    local_rank_variable = "MV2_COMM_WORLD_LOCAL_RANK"
    local_size_variable = "MV2_COMM_WORLD_LOCAL_SIZE"
    prefixes = ("MV2_",)
