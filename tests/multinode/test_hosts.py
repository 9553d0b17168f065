"""The hosts facility itself: it removes what it made when a test fails, and sweeps what a crashed
session left, without touching a live session's hosts."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from hosts import NETNS_ETC, Network, missing, namespaces, netns_pids, session_name, sweep_leftovers

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


def _inside(netns: str, pid: int) -> None:
    """Wait until process ``pid``, started to enter ``netns``, runs there (on a loaded machine it
    takes a while, and a namespace removed before then is one it never enters)."""
    deadline = time.monotonic() + 10
    while pid not in netns_pids(netns) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_everything_is_removed_when_the_block_fails() -> None:
    with pytest.raises(RuntimeError, match="a failing test"), Network() as network:
        host = network.hosts[1]
        sleeper = subprocess.Popen(host.command(["sleep", "600"]), env=network.environ({"PATH": "/usr/bin:/bin"}))
        _inside(host.netns, sleeper.pid)
        made = [host.netns for host in network.hosts] + [network.switch]
        assert set(made) <= set(namespaces())
        raise RuntimeError("a failing test")
    assert sleeper.wait(timeout=30) == -9
    assert not set(made) & set(namespaces())
    assert not [path for path in NETNS_ETC.glob(f"{network.prefix}*")]
    assert not network.workdir.exists()


def test_leftovers_of_a_dead_session_are_swept() -> None:
    gone = subprocess.Popen(["sleep", "0.2"])
    dead = session_name(gone.pid)  # while it lives: its start time is part of the name
    gone.wait()
    leftover = f"{dead}-1h1"
    workdir = Path("/tmp") / f"{dead}-1work"
    subprocess.run(["ip", "netns", "add", leftover], check=True, timeout=30)
    (NETNS_ETC / leftover).mkdir(parents=True)
    workdir.mkdir()
    stray = subprocess.Popen(["nsenter", f"--net=/run/netns/{leftover}", "sleep", "600"])
    _inside(leftover, stray.pid)
    with Network() as live:
        removed = sweep_leftovers()
        # A crashed run before this one may have left more: only dead sessions' names may go.
        assert {leftover, str(workdir)} <= set(removed)
        assert not [name for name in removed if Path(name).name.startswith(f"{session_name()}-")]
        assert {host.netns for host in live.hosts} <= set(namespaces())  # its owner, this process, lives
    assert stray.wait(timeout=30) == -9
    assert leftover not in namespaces()
    assert not (NETNS_ETC / leftover).exists() and not workdir.exists()
