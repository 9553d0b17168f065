"""pytest plugin: ``@pytest.mark.world_size(1, 2, 4)`` with the ``world_size`` and ``run`` fixtures.

Enable it with ``pytest_plugins = ["communicator.pytest_plugin"]`` in a ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from communicator.config import ConfigLike
from communicator.testing import DEFAULT_TIMEOUT, run_ranks, run_single

__all__ = ["pytest_configure", "pytest_generate_tests", "run", "world_size"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "world_size(*sizes): run the test once per world size (1 = NonDistComm)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("world_size")
    if "world_size" in metafunc.fixturenames and marker is not None:
        metafunc.parametrize("world_size", marker.args, ids=[f"w{n}" for n in marker.args])


@pytest.fixture
def world_size() -> int:
    """The world size of a test not marked with ``world_size``: 2."""
    return 2


@pytest.fixture
def run(world_size: int) -> Callable[..., list[Any]]:
    """``run(fn, *args, cfg=None, timeout=...)``: ``fn(comm, *args)`` on ``world_size`` ranks, results in rank order."""

    def runner(
        fn: Callable[..., Any], *args: Any, cfg: ConfigLike = None, timeout: float = DEFAULT_TIMEOUT
    ) -> list[Any]:
        if world_size == 1:
            return [run_single(fn, *args, cfg=cfg)]
        return run_ranks(fn, world_size, *args, cfg=cfg, timeout=timeout)

    return runner
