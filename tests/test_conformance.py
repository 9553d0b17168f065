"""The public conformance suite (``communicator.testing.check_communicator``) on every communicator:
NonDistComm, TorchComm (gloo), SubgroupComm, and the two examples of docs/custom.md that implement
only the point-to-point: ranks as threads, and ranks as processes over sockets with a TCPStore
(registered as "socket" and started by ``launch``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from communicator import Communicator, SubgroupComm, launch
from communicator.testing import check_communicator, run_ranks, run_single

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "examples"))
from socket_comm import SocketComm
from thread_comm import ThreadComm, run_threads

MEMBERS = [3, 1, 0]  # the subgroup's ranks in the world of four, in the subgroup's order


def single(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    assert world == 1
    return [run_single(fn, *args)]


def torch_ranks(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    return run_ranks(fn, world, *args, cfg={"timeout": 30}, timeout=120)


def in_subgroup(comm: Communicator, world: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    sub = comm.new_group(MEMBERS[:world])
    assert isinstance(sub, SubgroupComm)
    return fn(sub, *args) if sub.is_member else None


def subgroup_ranks(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    results = run_ranks(in_subgroup, 4, world, fn, args, cfg={"timeout": 30}, timeout=120)
    return [results[rank] for rank in MEMBERS[:world]]


def threads(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    return run_threads(fn, world, *args, timeout=30)


def processes(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    return launch(fn, world, {"type": "socket", "timeout": 30}, args, timeout=120)


RUNNERS: dict[str, tuple[Callable[..., list[Any]], tuple[int, ...]]] = {
    "nondist": (single, (1,)),
    "torch": (torch_ranks, (1, 3)),
    "subgroup": (subgroup_ranks, (3,)),
    "thread": (threads, (1, 2, 4)),
    "socket": (processes, (2, 3)),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(RUNNERS))
def test_every_communicator_passes_the_conformance_suite(name: str) -> None:
    run, worlds = RUNNERS[name]
    check_communicator(run, worlds)


def kinds(comm: Communicator) -> tuple[str, bool]:
    return type(comm).__name__, comm.is_distributed


def test_the_examples_implement_only_the_point_to_point() -> None:
    for example in (ThreadComm, SocketComm):
        own = {name for name in vars(example) if name.startswith("_") and callable(getattr(example, name))}
        assert own - {"__init__", "_isend", "_irecv", "_control_store", "_teardown", "_mailbox", "_read_from"} == set()
    assert run_threads(kinds, 3) == [("ThreadComm", True)] * 3
    assert run_threads(kinds, 1) == [("ThreadComm", False)]  # a world of one is not distributed
