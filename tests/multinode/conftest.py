"""Fixtures: two hosts on a real network (``network``), and a Slurm cluster of them (``slurm``).

Both are module-scoped: a module's tests share them, and they are gone (namespaces, daemons,
processes, files) before the next module starts, whether its tests passed, failed or were
interrupted. Without root or the tools, the tests that need them skip and say why.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from hosts import Network, missing, sweep_leftovers
from slurm_cluster import SlurmCluster
from slurm_cluster import missing as slurm_missing


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    removed = sweep_leftovers()
    if removed:
        warnings.warn(f"removed what crashed multi-node runs left: {', '.join(removed)}", stacklevel=1)
    with Network(count=2) as made:
        yield made


@pytest.fixture(scope="module")
def slurm(network: Network) -> Iterator[SlurmCluster]:
    reason = slurm_missing()
    if reason is not None:
        pytest.skip(reason)
    cluster = SlurmCluster(network)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
