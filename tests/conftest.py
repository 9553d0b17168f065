from __future__ import annotations

import pytest

pytest_plugins = ["communicator.pytest_plugin"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` a file's tests share a worker (and its module-scoped
    fixtures). The real launchers' and the multi-node tests share one worker, in order: the
    multi-node Slurm cluster replaces the machine's own while it runs, and each multi-node module
    makes hosts and checks that none is left. Without xdist the marks do nothing."""
    for item in items:
        path = item.path.relative_to(item.config.rootpath)
        group = "launchers" if path.parts[:2] in (("tests", "multinode"), ("tests", "launchers")) else str(path)
        item.add_marker(pytest.mark.xdist_group(group))
