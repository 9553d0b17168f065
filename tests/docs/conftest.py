from __future__ import annotations

from collections.abc import Iterator

import pytest
from doc_snippets import ROOT, clean_env
from warm_python import WarmPython


@pytest.fixture(scope="session")
def warm_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmPython]:
    """One warm interpreter per worker for the docs' scripts (see ``warm_python.py``)."""
    warm = WarmPython(clean_env(ROOT), tmp_path_factory.mktemp("warm-python") / "ranks.log")
    yield warm
    warm.close()
