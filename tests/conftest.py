from __future__ import annotations

import contextlib

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` a file's tests share a worker (and its module-scoped
    fixtures). The real launchers' and the multi-node tests share one worker, in order: the
    multi-node Slurm cluster replaces the machine's own while it runs, and each multi-node module
    makes hosts and checks that none is left. Without xdist the marks do nothing."""
    for item in items:
        path = item.path.relative_to(item.config.rootpath)
        group = "launchers" if path.parts[:2] in (("tests", "multinode"), ("tests", "launchers")) else str(path)
        item.add_marker(pytest.mark.xdist_group(group))
