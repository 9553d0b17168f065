"""Slurm hostlist expansion and the first-host lookup, without scontrol."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from communicator.errors import ConfigError
from communicator.launchers.hostlist import expand_hostlist, first_host


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node1,node2", ["node1", "node2"]),
        ("  vm  ", ["vm"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("node[01-04,07],gpu-a[1-2]", ["node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"]),
        ("n[001-3]", ["n001", "n002", "n003"]),
        ("x[9-11]", ["x9", "x10", "x11"]),
        ("x[098-101]", ["x098", "x099", "x100", "x101"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("[1-2]a", ["1a", "2a"]),
        ("a[5]", ["a5"]),
        ("a[3-3]", ["a3"]),
        ("login,cn[7,9-10].cluster", ["login", "cn7.cluster", "cn9.cluster", "cn10.cluster"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    ("hostlist", "complaint"),
    [
        ("a[3-1]", "decreasing range '3-1'"),
        ("a[x-2]", "bad range 'x-2'"),
        ("a[1-2-3]", "bad range '1-2-3'"),
        ("a[-1]", "bad range '-1'"),
        ("a[]", "bad range ''"),
        ("a[1,]", "bad range ''"),
        ("a[1-2", "unbalanced '['"),
        ("a[1[2]]", "unbalanced '['"),
        ("a]", "']' without '['"),
        ("a1-2]", "']' without '['"),
        ("a,,b", "empty name"),
        ("a,", "empty name"),
        (",a", "empty name"),
        ("", "is empty"),
        ("   ", "is empty"),
        ("a[\u0661-\u0663]", "bad range"),  # non-ASCII digits are not Slurm numbers
    ],
)
def test_malformed_hostlist_is_a_config_error(hostlist: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match="hostlist") as caught:
        expand_hostlist(hostlist)
    assert complaint in str(caught.value)
    assert repr(hostlist) in str(caught.value)


def test_config_error_is_also_a_value_error() -> None:
    with pytest.raises(ValueError):
        expand_hostlist("a[2-1]")


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("vm", "vm"), ("node[07-09],gpu1", "node07"), ("gpu1,node[07-09]", "gpu1"), ("r[2-3]-n[5-6]", "r2-n5")],
)
def test_first_host(nodelist: str, host: str) -> None:
    assert first_host(nodelist, {}) == host


def test_first_host_does_not_build_a_huge_list() -> None:
    assert first_host("n[0000000-9999999]", {}) == "n0000000"


def test_first_host_without_scontrol_raises_the_parse_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unbalanced"):
        first_host("n[1-2", {"PATH": str(tmp_path)})
    with pytest.raises(ConfigError, match="unbalanced"):
        first_host("n[1-2", {})


def _fake_scontrol(directory: Path, script: str) -> dict[str, str]:
    """An environment whose PATH holds only a fake ``scontrol`` running ``script``."""
    scontrol = directory / "scontrol"
    scontrol.write_text(f"#!/bin/sh\n{script}\n")
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    return {"PATH": str(directory)}


@pytest.mark.skipif(os.name != "posix", reason="the fake scontrol is a shell script")
def test_first_host_falls_back_to_scontrol_only_when_parsing_fails(tmp_path: Path) -> None:
    environ = _fake_scontrol(tmp_path, 'echo "from-scontrol"; echo other')
    assert first_host("odd{syntax]", environ) == "from-scontrol"
    assert first_host("node[1-2]", environ) == "node1"  # parsed: scontrol is not asked


@pytest.mark.skipif(os.name != "posix", reason="the fake scontrol is a shell script")
@pytest.mark.parametrize("script", ["exit 1", "true", 'echo "$3"'])  # the last echoes the list back
def test_failing_scontrol_keeps_the_parse_error(tmp_path: Path, script: str) -> None:
    with pytest.raises(ConfigError, match="']' without '\\['"):
        first_host("odd]", _fake_scontrol(tmp_path, script))
