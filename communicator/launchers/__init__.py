"""Launcher detection: which tool started this process, and what it says about the job.

``LAUNCHERS`` is the detection order of ``launcher="auto"``: torchrun, Open MPI, MPICH,
MVAPICH, Slurm. MPI comes before Slurm because ``mpirun`` inside an ``sbatch``/``salloc``
allocation leaves the job's ``SLURM_NTASKS`` (and the launching step's ``SLURM_PROCID``) in every
rank's environment, and only the MPI variables give each rank its own identity.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from communicator.errors import ConfigError
from communicator.launchers.base import LauncherEnv
from communicator.launchers.hostlist import expand_hostlist, first_host
from communicator.launchers.mpi import MPIEnv
from communicator.launchers.mpich import MPICHEnv
from communicator.launchers.mvapich import MVAPICHEnv
from communicator.launchers.openmpi import OpenMPIEnv
from communicator.launchers.slurm import SlurmEnv
from communicator.launchers.topology import EnvironmentPatch, Topology
from communicator.launchers.torchrun import TorchrunEnv

__all__ = [
    "LAUNCHERS",
    "EnvironmentPatch",
    "Topology",
    "LauncherEnv",
    "MPICHEnv",
    "MPIEnv",
    "MVAPICHEnv",
    "OpenMPIEnv",
    "SlurmEnv",
    "TorchrunEnv",
    "describe_environment",
    "detect_launcher",
    "expand_hostlist",
    "first_host",
    "launcher_names",
    "launcher_variables",
]

#: Every launcher, in the order ``launcher="auto"`` tries them.
LAUNCHERS: tuple[type[LauncherEnv], ...] = (
    TorchrunEnv,
    OpenMPIEnv,
    MPICHEnv,
    MVAPICHEnv,
    SlurmEnv,
)

_MPI_FAMILY: tuple[type[LauncherEnv], ...] = tuple(launcher for launcher in LAUNCHERS if issubclass(launcher, MPIEnv))


def launcher_names() -> tuple[str, ...]:
    """Every accepted ``launcher`` value: ``auto``, ``none``, each launcher's name, and ``mpi``
    (whichever MPI implementation is detected)."""
    return ("auto", "none", *(launcher.name for launcher in LAUNCHERS), "mpi")


def launcher_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """The variables of ``environ`` that some launcher of ``LAUNCHERS`` sets for its processes.

    A job started from inside a launched process (``launch()`` in a torchrun rank) removes them from
    its own ranks: they describe the enclosing job, and torchrun's ``TORCHELASTIC_USE_AGENT_STORE``
    alone would make a rank wait for a store that no one serves.
    """
    env = os.environ if environ is None else environ
    return [name for name in env if any(launcher.sets(name) for launcher in LAUNCHERS)]


def detect_launcher(
    name: str = "auto",
    environ: Mapping[str, str] | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> LauncherEnv | None:
    """The launcher environment of this process, validated, or ``None`` when there is none.

    ``"auto"`` returns the first of ``LAUNCHERS`` whose variables are present (``None`` when no
    launcher is); ``"none"`` always returns ``None``. A launcher's name, or ``"mpi"`` for the
    first MPI implementation detected, forces it: its missing variables are a ConfigError.
    ``master_addr`` / ``master_port`` (from the configuration) win over the environment and stand
    in for ``MASTER_ADDR`` / ``MASTER_PORT``. Malformed variables raise ConfigError here.
    """
    env = dict(os.environ if environ is None else environ)
    if name == "none":
        return None
    candidates = _candidates(name)
    for launcher in candidates:
        if launcher.detect(env):
            absent = _missing(launcher, env, master_addr, master_port)
            if absent:
                raise ConfigError(f"{launcher.name} launcher detected but {', '.join(absent)} not set{_hint(launcher)}")
            found = launcher(env, master_addr=master_addr, master_port=master_port)
            found.validate()
            return found
    if name == "auto":
        return None
    needs = "; ".join(
        f"{launcher.name} needs {', '.join(_missing(launcher, env, master_addr, master_port))}{_hint(launcher)}"
        for launcher in candidates
    )
    raise ConfigError(f"launcher={name!r} was requested but its variables are not set: {needs}")


def describe_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per launcher: detected or not, and which of its variables are set (with values)."""
    env = dict(os.environ if environ is None else environ)
    chosen = next((launcher for launcher in LAUNCHERS if launcher.detect(env)), None)
    lines = []
    for launcher in LAUNCHERS:
        if launcher is chosen:
            status = "detected, used by launcher='auto'"
        elif chosen is not None and launcher.detect(env):
            status = f"detected, but {chosen.name} comes first"
        else:
            hint = _hint(launcher) if set(launcher.variables) & env.keys() else ""
            status = f"not detected, {', '.join(launcher.missing(env))} not set{hint}"
        shown = [f"{variable}={env[variable]}" for variable in launcher.variables if variable in env]
        lines.append(f"{launcher.name}: {status}; {', '.join(shown) or 'none of its variables set'}")
    return lines


def _candidates(name: str) -> tuple[type[LauncherEnv], ...]:
    if name == "auto":
        return LAUNCHERS
    if name == "mpi":
        return _MPI_FAMILY
    for launcher in LAUNCHERS:
        if launcher.name == name:
            return (launcher,)
    raise ConfigError(f"launcher={name!r} is unknown; expected one of {', '.join(launcher_names())}")


def _missing(
    launcher: type[LauncherEnv],
    environ: Mapping[str, str],
    master_addr: str | None,
    master_port: int | None,
) -> list[str]:
    """The launcher's missing variables, less those the configuration supplies."""
    supplied = {"MASTER_ADDR"} if master_addr is not None else set()
    if master_port is not None:
        supplied.add("MASTER_PORT")
    return [variable for variable in launcher.missing(environ) if variable not in supplied]


def _hint(launcher: type[LauncherEnv]) -> str:
    return f" ({launcher.hint})" if launcher.hint else ""
