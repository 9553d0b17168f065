from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

pytest_plugins = ["communicator.pytest_plugin"]

# What is imported before the tests run (torch above all, then the test modules) never becomes
# garbage: out of the collector's reach, each full collection of a worker no longer traverses it
# (about 2 of the 6 CPU-seconds of a worker's collection, and more over its tests).
import torch  # noqa: E402, F401 - before the freeze

gc.freeze()


def pytest_configure(config: pytest.Config) -> None:
    """In the controller, before any worker collects: import yapf (which mmengine imports) once.
    Its first import in a new environment rewrites a grammar cache in the user's cache directory,
    renamed into place before it is flushed, so workers importing it at the same moment can read
    it empty (``EOFError: Ran out of input`` while collecting)."""
    if not hasattr(config, "workerinput"):
        with contextlib.suppress(ImportError):
            import yapf  # noqa: F401


#: Test modules (a folder's or one file) that take the machine's launchers and network namespaces:
#: the multi-node Slurm cluster replaces the machine's own while it runs, and each multi-node module
#: checks that no host is left. One such module at a time on the machine, across workers and
#: concurrent runs. The other launcher tests (torchrun on 127.0.0.1, detection) need no lock.
MACHINE_WIDE = (("tests", "multinode"), ("tests", "launchers", "test_real_launchers.py"))
#: The modules that take longest, longest first (their wall time in one run of the suite), started
#: after the machine-wide ones so that no worker is left running one of them alone at the end; the
#: others follow in their collected order.
LONGEST = (
    ("tests", "objects", "test_objects.py"),
    ("tests", "docs", "test_snippets.py"),
    ("tests", "docs", "test_examples.py"),
    ("tests", "control", "test_control_plane_scale.py"),
    ("tests", "cli", "test_bench.py"),
    ("tests", "control", "test_failures.py"),
    ("tests", "control", "test_stalls.py"),
    ("tests", "ops", "test_collectives.py"),
    ("tests", "test_conformance.py"),
    ("tests", "launchers", "test_teardown.py"),
    ("tests", "cli", "test_cli.py"),
    ("tests", "transports", "test_ddp.py"),
    ("tests", "control", "test_hostile_store.py"),
    ("tests", "control", "test_shrink.py"),
    ("tests", "cli", "test_check.py"),
    ("tests", "compat", "test_mmengine_runner.py"),
    ("tests", "observe", "test_observe.py"),
    ("tests", "objects", "test_safe_attacks.py"),
    ("tests", "control", "test_control_plane.py"),
    ("tests", "testing", "test_spawn.py"),
    ("tests", "ops", "test_hostile_arguments.py"),
    ("tests", "transports", "test_process_group.py"),
    ("tests", "transports", "test_torch_suite.py"),
)


_held: dict[str, Any] = {}  # the module holding the machine-wide lock in this process, and its file


def _within(parts: tuple[str, ...], prefixes: tuple[tuple[str, ...], ...]) -> bool:
    return any(parts[: len(prefix)] == prefix for prefix in prefixes)


def _machine_wide(item: pytest.Item) -> bool:
    return _within(item.path.relative_to(item.config.rootpath).parts, MACHINE_WIDE)


def _start_order(item: pytest.Item) -> int:
    parts = item.path.relative_to(item.config.rootpath).parts
    if _within(parts, MACHINE_WIDE):
        return 0
    return 1 + next((i for i, prefix in enumerate(LONGEST) if parts == prefix), len(LONGEST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The same order in every worker (a stable sort): the machine-wide modules, then the longest."""
    items.sort(key=_start_order)
    gc.freeze()  # the test modules and what they imported, as torch above


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadfile``: a module's tests on one worker, as xdist does, and the machine-wide
    modules all on one worker, one after another, so no other worker waits for their lock."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # the collected order (above), not the most tests first

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "machine-wide" if _within(tuple(path.split("/")), MACHINE_WIDE) else path

    return Scheduling(config, log)


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
