from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator

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


@pytest.fixture(scope="module", autouse=True)
def _one_machine_wide_module_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.path.relative_to(request.config.rootpath).parts[:2] not in MACHINE_WIDE:
        yield
        return
    with open(os.path.join(tempfile.gettempdir(), "communicator-tests-machine.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, with the module
        yield
