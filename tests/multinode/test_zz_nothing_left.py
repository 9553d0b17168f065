"""After the other multi-node tests (this module runs last): nothing of this session is left.

No namespace, /etc/netns directory or work directory of this session, no process that one of its
networks started (wherever it runs), and no veth or bridge added to the machine's own network.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hosts import NETNS_ETC, ROOT_LINKS_AT_START, missing, namespaces, root_links, session_name, session_processes

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


def test_nothing_of_this_session_is_left() -> None:
    session = session_name()
    assert [name for name in namespaces() if name.startswith(session)] == []
    assert list(NETNS_ETC.glob(f"{session}*")) == []
    assert list(Path(tempfile.gettempdir()).glob(f"{session}*")) == []
    assert session_processes(session) == []
    added = {name: kind for name, kind in root_links().items() if name not in ROOT_LINKS_AT_START}
    assert {name: kind for name, kind in added.items() if kind in ("veth", "bridge")} == {}
