from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

pytest_plugins = ["communicator.pytest_plugin"]


def pytest_configure(config: pytest.Config) -> None:
    """In the controller, before any worker collects: import yapf (which mmengine imports) once.
    Its first import in a new environment rewrites a grammar cache in the user's cache directory,
    renamed into place before it is flushed, so workers importing it at the same moment can read
    it empty (``EOFError: Ran out of input`` while collecting)."""
    if not hasattr(config, "workerinput"):
        with contextlib.suppress(ImportError):
            import yapf  # noqa: F401


#: Test folders whose modules take the machine's launchers and network namespaces: the multi-node
#: Slurm cluster replaces the machine's own while it runs, and each multi-node module checks that
#: no host is left. One such module at a time on the machine, across workers and concurrent runs.
MACHINE_WIDE = (("tests", "multinode"), ("tests", "launchers"))


_held: dict[str, Any] = {}  # the module holding the machine-wide lock in this process, and its file


def _machine_wide(item: pytest.Item) -> bool:
    return item.path.relative_to(item.config.rootpath).parts[:2] in MACHINE_WIDE


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Outside every test's timeout (a wait for the lock is not the test's time): the lock is taken
    before a machine-wide module's first test and given back after its last one, its module
    fixtures torn down by then."""
    if _machine_wide(item) and _held.get("module") != item.path:
        lock = open(os.path.join(tempfile.gettempdir(), "communicator-tests-machine.lock"), "w")  # noqa: SIM115
        fcntl.flock(lock, fcntl.LOCK_EX)
        _held.update(module=item.path, file=lock)
    yield
    if _held.get("module") == item.path and (nextitem is None or nextitem.path != item.path):
        _held.pop("file").close()  # closing the file releases the lock
        _held.pop("module")
