"""Test distributed code for real: run a function on N gloo ranks, bounded, with every rank's stack on a hang.

Use it directly:

```python
from communicator.testing import run_ranks

def check(comm):
    return comm.all_gather_object(comm.rank)

assert run_ranks(check, 3) == [[0, 1, 2]] * 3
```

or as a pytest plugin (``pytest_plugins = ["communicator.pytest_plugin"]``): mark a test with
``@pytest.mark.world_size(1, 2, 4)`` and take the ``world_size`` and ``run`` fixtures; a world of
one runs in this process with a :class:`~communicator.transports.nondist.NonDistComm`, so the same test
checks both classes.

``check_communicator(run, world_sizes)`` (see :mod:`communicator.testing.conformance`) is the conformance
suite every communicator passes: give it a function that runs a rank function on a world of yours.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from communicator.config import CommConfig, ConfigLike
from communicator.testing.conformance import check_communicator
from communicator.testing.spawn import launch
from communicator.transports.nondist import NonDistComm

__all__ = ["DEFAULT_TIMEOUT", "check_communicator", "run_ranks", "run_single"]

#: Seconds a test's ranks may take before they are stopped and their stacks reported.
DEFAULT_TIMEOUT = 60.0


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    cfg: ConfigLike = None,
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None = None,
) -> list[Any]:
    """``fn(comm, *args)`` on ``world_size`` real gloo ranks on 127.0.0.1; results in rank order.

    A hang fails after ``timeout`` seconds with a ``CommTimeoutError`` holding every rank's stack;
    a rank's exception is re-raised as a ``RemoteError`` naming the rank, with its traceback.
    """
    return launch(fn, world_size, cfg, args, timeout=timeout, env=env)


def run_single(fn: Callable[..., Any], *args: Any, cfg: ConfigLike = None) -> Any:
    """``fn(comm, *args)`` in this process with a :class:`NonDistComm`."""
    config = CommConfig.of(cfg if cfg is not None else {"launcher": "none"})
    with NonDistComm(config, reason="communicator.testing.run_single") as comm:
        return fn(comm, *args)
