"""One suite, every communicator: the same collective, object and derived checks on NonDistComm,
TorchComm (gloo), SubgroupComm (three of four ranks) and ThreadComm, the custom subclass of the
docs (ranks as threads, written from the primitives alone)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from communicator import Communicator, SubgroupComm
from communicator.testing import run_ranks, run_single

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS.parent / "docs" / "examples"), str(TESTS / "objects"), str(TESTS / "ops")]
import test_collectives as collectives  # noqa: E402 - the folders above are on the path first
import test_objects as objects  # noqa: E402
from thread_comm import ThreadComm, run_threads  # noqa: E402

#: A check: a function every rank runs, its arguments, and what every rank must return (``None``: truthy).
CHECKS: dict[str, tuple[Callable[..., Any], tuple[Any, ...], Callable[[int], list[Any]] | None]] = {
    "all_reduce": (collectives.all_reduce_every_op, (), None),
    "bad input": (collectives.integer_mean_refused, (), lambda w: [f"{w:g}"] * w),
    "integer mean": (collectives.integer_means, (), None),
    "gathers": (collectives.gathers, (), None),
    "rooted": (collectives.rooted, (), None),
    "exchanges": (collectives.exchanges, (), None),
    "special tensors": (collectives.special_tensors, (), None),
    "rank checks": (collectives.rank_checks, (), None),
    "objects inline": (objects.object_collectives, (False,), None),
    "objects large": (objects.object_collectives, (True,), None),
    "object errors": (objects.object_argument_errors, (), None),
    "dict reduction": (objects.dict_reduction, (), None),
    "collect": (  # every fifth result of the data set is a real None
        objects.collect,
        (7, "interleave"),
        lambda w: [[None if i % 5 == 0 else i for i in range(7)]] + [None] * (w - 1),
    ),
}
MEMBERS = [3, 1, 0]  # the subgroup's ranks in the world of four, in the subgroup's order


def in_subgroup(comm: Communicator, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    sub = comm.new_group(MEMBERS)
    assert isinstance(sub, SubgroupComm) and sub.is_member == (comm.rank in MEMBERS)
    return fn(sub, *args) if sub.is_member else "not a member"


def run_on(transport: str, world: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> list[Any]:
    if transport == "nondist":
        return [run_single(fn, *args)]
    if transport == "torch":
        return run_ranks(fn, world, *args, timeout=90)
    if transport == "subgroup":
        results = run_ranks(in_subgroup, 4, fn, args, timeout=90)
        return [results[rank] for rank in MEMBERS]
    return run_threads(fn, world, *args)


TRANSPORTS = [("nondist", 1), ("torch", 3), ("subgroup", len(MEMBERS)), ("thread", 1), ("thread", 2), ("thread", 4)]


@pytest.mark.parametrize(("transport", "world"), TRANSPORTS, ids=[f"{t}-w{w}" for t, w in TRANSPORTS])
@pytest.mark.parametrize("check", list(CHECKS))
def test_every_communicator_passes_the_same_checks(transport: str, world: int, check: str) -> None:
    fn, args, expected = CHECKS[check]
    results = run_on(transport, world, fn, args)
    if expected is None:
        assert all(results), results
    else:
        assert results == expected(world)


def kinds(comm: Communicator) -> tuple[str, bool]:
    return type(comm).__name__, comm.is_distributed


def test_the_thread_ranks_are_thread_comms() -> None:
    assert run_threads(kinds, 3) == [("ThreadComm", True)] * 3
    assert issubclass(ThreadComm, Communicator)
